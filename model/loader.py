"""Load a checkpoint folder into a resident :class:`LoadedModel`.

A checkpoint folder (Hugging Face layout) holds::

    config.json                       architecture + special tokens (any supported dialect)
    model.safetensors                 one weights file, or
    model-0000i-of-0000n.safetensors  shards listed in model.safetensors.index.json
    tokenizer.json                    (plus optional tokenizer_config.json), or the slow
                                      layout vocab.json + merges.txt (+ added_tokens.json,
                                      tokenizer_config.json) that Dream/DiffuCoder publish

Loading goes in two phases so that a bad checkpoint costs nothing (the tokenizer, which the
weights do not depend on, is read on a thread alongside both; its errors are still reported
before any of the weights'):

1. *Validate from headers only*: parse config.json, read the tokenizer, open
   every safetensors file (``safe_open`` memory-maps it and checks its header),
   map each tensor name to the Transformer's own name (:mod:`.weights`) and
   compare shapes with a model built on the ``meta`` device (no storage).
   Missing, unexpected and mis-shaped tensors are all reported here.
2. *Materialise*: read tensors one at a time from the memory map, convert (and
   on CPU copy) them to the target dtype/device and ``load_state_dict(assign=True)``
   them into the meta model, so each weight exists once (peak = model + one
   tensor) and the resident model does not depend on the file afterwards. bf16 weights
   on a CPU (:mod:`.quant`) keep the file's bf16 tensors mapped instead (no copy: the
   resident model is the page cache's view of the file). int8 weights
   on a CPU (:mod:`.quant`) come from the int8 weights cache (:mod:`.int8_cache`) or are
   quantized a tensor at a time from private reads of the file, and packed on a few threads
   (:mod:`.int8_load`). The safetensors files, their header checks and the tensor reads are
   in :mod:`.checkpoint_files`.

The family's infilling recipe (:mod:`.recipes`) is chosen from the checkpoint in
phase 1 (or named by the caller) and kept, resolved to ids, on the config.

Every failure raises :class:`CheckpointError`, :class:`~.config.ConfigError`,
:class:`~.tokenizer.TokenizerError` or :class:`~.recipes.RecipeError` (all
``ValueError``) with a message that
names the file and the field or tensor. Nothing built for a failed load stays
referenced: there is no module-level cache (the int8 weights cache is files, checked on
every read).
"""

from __future__ import annotations

import math
import resource
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .checkpoint_files import (
    CheckpointError,
    TensorEntry,
    check_no_meta,
    expected_shapes,
    is_out_of_memory,
    read_tensors,
    scan_headers,
    skeleton,
    weight_files,
)
from .config import ConfigError, ModelConfig, read_config
from .int8_load import materialise_int8
from .quant import count_parameters, resolve_weights
from .recipes import CheckpointFacts, RecipeError, choose_recipe, resolve_recipe
from .runtime import ensure_cpu_threads
from .tokenizer import Tokenizer, TokenizerError
from .transformer import Transformer

__all__ = [
    "CheckpointError",
    "ConfigError",
    "LoadedModel",
    "RecipeError",
    "TokenizerError",
    "check_checkpoint",
    "default_model_path",
    "load_model",
    "resolve_dtype",
]

DTYPES: dict[str, torch.dtype] = {  # dtype names accepted by load_model and --dtype
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


@dataclass
class LoadedModel:
    """A resident model plus everything needed to use it.

    model: the Transformer in eval mode, ``requires_grad`` off, on ``device`` in ``dtype``.
    config: the normalised config with special-token ids resolved from the tokenizer.
    provenance: the checkpoint's own provenance record (diffill checkpoints write one
        in config.json); empty when the checkpoint has none.
    files: the weights files read.
    """

    model: Transformer
    tokenizer: Tokenizer
    config: ModelConfig
    path: Path
    provenance: dict[str, Any]
    device: torch.device
    dtype: torch.dtype
    files: list[Path] = field(default_factory=list)
    weights: str = "fp32"  # "fp32" (``dtype``), "int8" or "bf16" (model.quant; CPU)

    @property
    def num_parameters(self) -> int:
        """The checkpoint's parameters (int8 weights counted as the weights they stand for;
        the int8 copy of a tied head not counted twice)."""
        return count_parameters(self.model)

    @property
    def family(self) -> str:
        return self.config.family


def default_model_path() -> Path:
    """The model shipped with the package (``diffill/model/default_model/``)."""
    return Path(__file__).resolve().parent / "default_model"


def resolve_dtype(
    cfg: ModelConfig, device: torch.device, dtype: torch.dtype | str | None
) -> torch.dtype:
    """The dtype to load in.

    An explicit ``dtype`` wins. Otherwise: on CUDA the checkpoint's ``torch_dtype``
    when it is bfloat16/float16/float32 (bfloat16 when the config names none); on
    CPU always float32 (half-precision matmuls on CPU are slow and inexact).
    """
    if dtype is not None:
        if isinstance(dtype, torch.dtype):
            return dtype
        key = str(dtype).lower().removeprefix("torch.")
        if key not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; use one of float32, bfloat16, float16")
        return DTYPES[key]
    if device.type != "cuda":
        return torch.float32
    name = (cfg.torch_dtype or "bfloat16").lower().removeprefix("torch.")
    return DTYPES.get(name, torch.bfloat16)


def _materialise(
    cfg: ModelConfig,
    plan: dict[str, TensorEntry],
    device: torch.device,
    dtype: torch.dtype,
    folder: Path,
    weights: str = "fp32",
    files: list[Path] | None = None,
    int8_cache: str | Path | bool | None = None,
) -> Transformer:
    """Build the Transformer on the meta device (:func:`~.checkpoint_files.skeleton`) and assign the
    checkpoint's tensors to it, so every weight is allocated once. On any failure,
    everything built here is released (locals dropped, traceback frames cleared)
    before raising. ``weights='int8'`` (CPU): :func:`~.int8_load.materialise_int8`;
    ``weights='bf16'`` (CPU): the file's bf16 tensors stay mapped."""
    state: dict[str, torch.Tensor] = {}
    model: Transformer | None = None
    try:
        if weights == "int8":
            model = materialise_int8(cfg, plan, dtype, folder, files or [], int8_cache)
        else:
            model = skeleton(cfg)
            read_tensors(plan, device, dtype, state, mapped=weights == "bf16")
            model.load_state_dict(state, strict=True, assign=True)
            state.clear()
            check_no_meta(model, folder)
            model.weights = weights
    except Exception as e:
        model = None
        state.clear()
        traceback.clear_frames(e.__traceback__)  # frames below would keep tensors alive
        if device.type == "cuda":
            torch.cuda.empty_cache()  # hand the freed blocks back, not just to torch's cache
        if isinstance(e, (MemoryError, torch.cuda.OutOfMemoryError)):
            raise  # out of memory is not a checkpoint defect: keep its type
        if is_out_of_memory(e):
            raise MemoryError(f"{folder}: out of memory while loading the weights ({e})") from None
        if isinstance(e, CheckpointError):
            raise CheckpointError(str(e)) from None
        raise CheckpointError(
            f"{folder}: could not load the weights ({type(e).__name__}: {e})"
        ) from None
    finally:
        state.clear()
    model.eval()
    model.requires_grad_(False)
    return model


#: address space a load needs beyond its files (threads' stacks, the tokenizer's tables,
#: the first forward's buffers), for :func:`check_address_space`
LOAD_MARGIN_BYTES = 256 << 20


def _vm_size() -> int | None:
    """This process's address space in bytes (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_address_space(folder: Path) -> None:
    """Refuse a load that cannot fit under the process's address-space limit (``ulimit -v``,
    RLIMIT_AS: a container or a user's cap) before any of it starts: the files' bytes plus
    :data:`LOAD_MARGIN_BYTES` over what the process already maps. The native libraries that
    read checkpoints and tokenizers (Rust: ``safetensors``, ``tokenizers``) abort the whole
    process when an allocation fails instead of raising, so a load that runs out of address
    space part-way would take the server with it. Raises MemoryError; no limit, or no
    ``/proc``, checks nothing."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError):
        return
    if soft == resource.RLIM_INFINITY:
        return
    used = _vm_size()
    if used is None:
        return
    files = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    need = files + LOAD_MARGIN_BYTES
    if used + need > soft:
        raise MemoryError(
            f"{folder}: out of memory: loading needs about {need >> 20} MB more address space, "
            f"and the process's limit (ulimit -v / RLIMIT_AS, {soft >> 20} MB) leaves "
            f"{max(0, soft - used) >> 20} MB")


# --------------------------------------------------------------------------- entry point


def _check_special_ids(cfg: ModelConfig, tok: Tokenizer, source: Path) -> ModelConfig:
    """Fill the config's special ids from the tokenizer and check they fit the
    embedding table."""
    cfg = cfg.replace(
        mask_token_id=tok.mask_id,
        pad_token_id=tok.pad_id,
        eos_token_id=tok.eos_id,
        bos_token_id=tok.bos_id,
    )
    for name in ("mask_token_id", "pad_token_id", "eos_token_id", "bos_token_id"):
        v = getattr(cfg, name)
        if v is not None and not 0 <= v < cfg.vocab_size:
            raise ConfigError(
                f"{source / 'config.json'}: {name}={v} is outside the embedding table "
                f"(vocab_size={cfg.vocab_size})"
            )
    if tok.vocab_size > cfg.vocab_size:
        raise TokenizerError(
            f"{tok.source}: has {tok.vocab_size} tokens but config.json vocab_size is "
            f"{cfg.vocab_size}; ids past the embedding table cannot be embedded"
        )
    return cfg


def _apply_recipe(cfg: ModelConfig, tok: Tokenizer, override: str | None) -> ModelConfig:
    """Choose the family recipe for this checkpoint (or the one named) and resolve it."""
    facts = CheckpointFacts(
        model_type=cfg.model_type or cfg.family,
        architectures=tuple(cfg.architectures),
        added_tokens=tok.added_tokens,
        has_mask=cfg.mask_token_id is not None,
    )
    row, why = choose_recipe(facts, override)
    roles = {
        "bos": tok.named_ids.get("bos", cfg.bos_token_id),
        "eos": tok.named_ids.get("eos", cfg.eos_token_id),
        "pad": tok.named_ids.get("pad", cfg.pad_token_id),
        "mask": cfg.mask_token_id,
    }
    if row.name in ("diffill", "generic"):  # these rows follow config.json's own ids
        roles.update(bos=cfg.bos_token_id, eos=cfg.eos_token_id, pad=cfg.pad_token_id)
    recipe = resolve_recipe(row, why, token_to_id=tok.token_to_id, roles=roles,
                            vocab_size=cfg.vocab_size)
    return cfg.replace(recipe=recipe)


def _tokenizer_phase(folder: Path, cfg: ModelConfig, recipe: str | None,
                     ) -> tuple[ModelConfig, Tokenizer]:
    """Phase 1's tokenizer part: the tokenizer, the special ids it resolves, the recipe."""
    tok = Tokenizer.from_folder(
        folder,
        mask_id=cfg.mask_token_id,
        pad_id=cfg.pad_token_id,
        eos_id=cfg.eos_token_id,
        bos_id=cfg.bos_token_id,
    )
    cfg = _check_special_ids(cfg, tok, folder)
    return _apply_recipe(cfg, tok, recipe), tok


def _validate(
    folder: Path, recipe: str | None
) -> tuple[ModelConfig, Any, Tokenizer, list[Path], dict[str, TensorEntry]]:
    """Phase 1: config, tokenizer, recipe and every safetensors header; reads no tensor data."""
    cfg, dialect = read_config(folder)
    cfg, tok = _tokenizer_phase(folder, cfg, recipe)
    files, index = weight_files(folder)
    plan = scan_headers(files, index, cfg, expected_shapes(cfg))
    return cfg, dialect, tok, files, plan


def check_checkpoint(path: str | Path, recipe: str | None = None) -> ModelConfig:
    """Validate a checkpoint folder as :func:`load_model` does before it reads any tensor
    (config, tokenizer, recipe, safetensors headers, tensor names and shapes); returns the
    config. Raises the same errors."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such folder")
    return _validate(folder, recipe)[0]


def load_model(
    path: str | Path | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    recipe: str | None = None,
    weights: str | None = None,
    int8_cache: str | Path | bool | None = None,
) -> LoadedModel:
    """Load a checkpoint folder and return the resident model.

    path: the checkpoint folder; ``None`` = the shipped default model
        (:func:`default_model_path`); the name of a checkpoint fetched with
        ``diffill pull`` (a short name or ``owner/repo``) is looked up in the local
        pull registry (:mod:`.pulled`), never on the network.
    device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
    dtype: ``None`` = float32 on CPU, the config's ``torch_dtype`` on CUDA
        (see :func:`resolve_dtype`); or an explicit ``torch.dtype`` / name.
    recipe: name of a family recipe (:data:`.recipes.RECIPE_NAMES`) to use instead of the
        one chosen from the checkpoint.
    weights: ``auto`` | ``fp32`` | ``int8`` | ``bf16`` (None: ``DIFFILL_WEIGHTS``, else
        ``auto``): int8 matmuls for the blocks and the head on a CPU (:mod:`.quant`), or the
        whole model in bfloat16 on a CPU with its bf16 tensors mapped from the file (a file in
        another dtype is converted into private memory); ``auto``: for models of 100M
        parameters and more, bf16 where the CPU has native bf16 matmuls (AMX), else int8;
        fp32 keeps ``dtype``. int8 implies a float32 ``dtype`` for what stays floating point
        (embedding, norms), bf16 a bfloat16 one.
    int8_cache: where int8 weights are cached between loads (:mod:`.int8_cache`): None =
        ``DIFFILL_INT8_CACHE``, else ``$XDG_CACHE_HOME/diffill/int8`` for checkpoints of 10M
        parameters and more; False = no cache; a folder = that folder.

    Raises CheckpointError, ConfigError, TokenizerError or RecipeError (all ValueError)
    whose message names the file and the field or tensor at fault.
    """
    folder = (Path(path) if path is not None else default_model_path()).expanduser()
    if path is not None and not folder.is_dir():
        from .pulled import resolve_pulled  # local registry lookup; no network

        folder = resolve_pulled(str(path)) or folder
    folder = folder.resolve()
    if not folder.is_dir():
        if path is None:
            raise CheckpointError(
                f"{folder}: the default model is not installed (no such folder); "
                f"pass a checkpoint folder with --model / load_model(path)"
            )
        what = "is a file, not a checkpoint folder" if folder.exists() else (
            "no such folder, and no checkpoint of that name was pulled (diffill pull NAME)"
        )
        raise CheckpointError(f"{folder}: {what}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {dev} requested but CUDA is not available")

    # The tokenizer (0.6 s of JSON for Qwen's; the tokenizers library releases the GIL) is read
    # on a thread meanwhile: the weights do not depend on it. Its errors (and the recipe's)
    # still come first, as _validate orders them, and a model built meanwhile is dropped.
    cfg0, dialect = read_config(folder)
    check_address_space(folder)
    with ThreadPoolExecutor(1, thread_name_prefix="diffill-tokenizer") as ex:
        tok_job = ex.submit(_tokenizer_phase, folder, cfg0, recipe)
        try:
            files, index = weight_files(folder)
            plan = scan_headers(files, index, cfg0, expected_shapes(cfg0))
            params = sum(math.prod(e.shape) for e in plan.values())
            w = resolve_weights(weights, device=dev, params=params) if dev.type == "cpu" else \
                resolve_weights(weights or "fp32", device=dev, params=params)
            target_dtype = resolve_dtype(cfg0, dev, dtype)
            if w == "int8" and target_dtype != torch.float32:
                if dtype is not None:
                    raise ValueError(f"weights 'int8' keeps float32 around the int8 matmuls, not {dtype}")
                target_dtype = torch.float32
            if w == "bf16" and target_dtype != torch.bfloat16:
                if dtype is not None:
                    raise ValueError(f"weights 'bf16' runs the whole model in bfloat16, not {dtype}")
                target_dtype = torch.bfloat16
            # diffill's CPU thread default (as Engine applies it) before the weights are copied
            # out of the map: with torch's own one-thread-per-core, each copy is a parallel region
            # that waits for a descheduled thread on a busy machine (16 MB took ~0.3 s, not ~10 ms).
            ensure_cpu_threads(dev)
            model = _materialise(cfg0, plan, dev, target_dtype, folder, w, files, int8_cache)
        except BaseException:
            tok_job.result()  # a tokenizer or recipe error is reported first, as _validate does
            raise
        cfg, tok = tok_job.result()
    model.config = cfg  # the ids and the recipe filled in (the Transformer reads neither)
    provenance = getattr(dialect, "provenance", None)
    provenance = dict(provenance) if isinstance(provenance, dict) else {}
    return LoadedModel(
        model=model,
        tokenizer=tok,
        config=cfg,
        path=folder,
        provenance=provenance,
        device=dev,
        dtype=target_dtype,
        files=files,
        weights=w,
    )
