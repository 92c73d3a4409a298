"""Test support shared by every test folder (``tests/`` is on ``sys.path``: the root
``conftest.py`` lives there): paths, the one tiny-model builder and tiny checkpoint
folders (no downloads). ``conftest.py`` wraps them in fixtures.

``tiny_config`` / ``tiny_model`` / ``tiny_lm``: a small random diffill Transformer (its
config, the model, or a :class:`~diffill.model.loader.LoadedModel` around it); tests pass
the config changes they need (vocabulary, special ids, positions, logit shift).

``write_tokenizer`` builds a word-level tokenizer in code: four special tokens
(``<|bos|>``, ``<|eos|>``, ``<|pad|>``, ``<|mask|>`` by default, ids 0..3) and
words ``w0``, ``w1``, ... filling the rest of the vocabulary.
``write_diffill_checkpoint`` saves a randomly initialised Transformer in
diffill's own layout (config.json + model.safetensors + tokenizer.json).
``in_file_map`` says whether a tensor's bytes are a memory map of a file (bf16 weights).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import torch
from diffill.model.config import DiffillDialect, ModelConfig
from diffill.model.loader import LoadedModel
from diffill.model.transformer import Transformer
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
SPECIALS = ("<|bos|>", "<|eos|>", "<|pad|>", "<|mask|>")


def make_tokenizer(vocab_size: int, specials: tuple[str, ...] = SPECIALS) -> Tokenizer:
    """Word-level tokenizer with ``vocab_size`` entries, specials first."""
    words = [f"w{i}" for i in range(vocab_size - len(specials))]
    vocab = {t: i for i, t in enumerate(list(specials) + words)}
    unk = specials[2] if len(specials) > 2 else words[0]
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(specials))
    return tok


def write_tokenizer(folder: Path, vocab_size: int, specials: tuple[str, ...] = SPECIALS) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    make_tokenizer(vocab_size, specials).save(str(folder / "tokenizer.json"))


def tiny_config(**changes: Any) -> ModelConfig:
    cfg = ModelConfig(
        family="diffill",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        rope_theta=10000.0,
        qk_norm=True,
        tie_embeddings=True,
        mask_token_id=3,
        pad_token_id=2,
        eos_token_id=1,
        bos_token_id=0,
        max_position_embeddings=256,
    )
    return cfg.replace(**changes)


def tiny_model(seed: int | None = 0, *, std: float = 0.3, weak_pad: bool = False,
               **changes: Any) -> tuple[Transformer, ModelConfig]:
    """A random Transformer of ``tiny_config(**changes)`` in eval mode, weights drawn with
    ``init_weights(std, seed)`` (large ``std``: peaked, input-dependent predictions).
    ``weak_pad``: pad and EOS embeddings halved, so that middles are not all empty."""
    cfg = tiny_config(**changes)
    model = Transformer(cfg)
    model.init_weights(std=std, seed=seed)
    if weak_pad:
        with torch.no_grad():
            model.embed_tokens.weight[[cfg.pad_token_id, cfg.eos_token_id]] *= 0.5
    return model.eval(), cfg


def tiny_lm(seed: int | None = 0, *, std: float = 0.3, weak_pad: bool = False,
            tokenizer: Any = None, **changes: Any) -> LoadedModel:
    """:func:`tiny_model` as the loader returns a model (CPU, fp32)."""
    model, cfg = tiny_model(seed, std=std, weak_pad=weak_pad, **changes)
    return LoadedModel(model=model, tokenizer=tokenizer, config=cfg, path=Path("."), provenance={},
                       device=torch.device("cpu"), dtype=torch.float32)


def write_diffill_checkpoint(
    folder: Path,
    cfg: ModelConfig | None = None,
    *,
    seed: int = 0,
    provenance: dict[str, Any] | None = None,
) -> Transformer:
    """Save a random diffill-family checkpoint; returns the (CPU, fp32) model."""
    cfg = cfg or tiny_config()
    folder.mkdir(parents=True, exist_ok=True)
    model = Transformer(cfg)
    model.init_weights(seed=seed)
    # Random (not unit) norm weights so a swapped norm would show in the logits.
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(folder / "model.safetensors"),
    )
    dialect = DiffillDialect.from_model_config(cfg, provenance or {})
    (folder / "config.json").write_bytes(msgspec.json.format(msgspec.json.encode(dialect)))
    write_tokenizer(folder, cfg.vocab_size)
    return model.eval()


def in_file_map(t: torch.Tensor, path: Path) -> bool:
    """Whether ``t``'s bytes lie inside a memory map of ``path`` (Linux ``/proc/self/maps``)."""
    lo, hi = t.data_ptr(), t.data_ptr() + t.untyped_storage().nbytes()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= lo and hi <= end:
                return True
    return False


def one_batch(eng: Any, calls: Sequence[Callable[[], Any]], timeout_s: float = 30.0) -> list:
    """Run ``calls`` (each one ``eng.infill(EngineAsk(...))`` or the like) on threads queued while the
    engine's device lock is held, then release it: the engine takes them as one batch.
    Returns each call's result, or the exception it raised."""
    out: list = [None] * len(calls)

    def work(i: int) -> None:
        try:
            out[i] = calls[i]()
        except Exception as e:  # noqa: BLE001 - handed back to the test
            out[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    with eng._lock:
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout_s
        while len(eng._queue) < len(calls) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(eng._queue) == len(calls)
    for t in threads:
        t.join()
    return out
