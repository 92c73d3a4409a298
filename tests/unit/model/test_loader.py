"""load_model on diffill's own layout and on hand-written HF/LLaDA-named folders, and bf16
weights (the file's bf16 tensors mapped, not copied)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from diffill.model import CheckpointError, LoadedModel, checkpoint_files, load_model
from diffill.model import loader as loader_mod
from diffill.model.config import ModelConfig
from diffill.model.loader import resolve_dtype
from diffill.model.transformer import Transformer
from diffill.model.weights import to_checkpoint_names
from safetensors.torch import load_file, save_file
from support import in_file_map, tiny_config, write_diffill_checkpoint, write_tokenizer


def test_diffill_roundtrip(tiny_ckpt):
    folder, ref = tiny_ckpt
    lm = load_model(folder)
    assert isinstance(lm, LoadedModel)
    assert lm.path == folder.resolve() and lm.path.is_absolute()
    assert lm.config.family == "diffill" and lm.config.shift_logits is False
    assert lm.provenance == {"corpus": "unit-test", "steps": 3}
    assert lm.device == torch.device("cpu") and lm.dtype == torch.float32
    assert lm.num_parameters == sum(p.numel() for p in ref.parameters())
    assert lm.files == [folder.resolve() / "model.safetensors"]
    assert not lm.model.training
    assert all(not p.requires_grad for p in lm.model.parameters())
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in lm.model.parameters())
    assert lm.model.lm_head is None  # tied
    # special ids come from config.json and agree with the tokenizer's names
    tok = lm.tokenizer
    assert (lm.config.mask_token_id, tok.mask_id) == (3, tok.token_to_id("<|mask|>"))
    assert (lm.config.pad_token_id, lm.config.eos_token_id, lm.config.bos_token_id) == (2, 1, 0)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(lm.model(ids), ref(ids))


def test_model_is_built_on_meta_device(tiny_ckpt, monkeypatch):
    """No weight is allocated twice: every Transformer the loader constructs starts
    on the meta device and only receives the checkpoint's own tensors."""
    folder, _ = tiny_ckpt
    devices: list[str] = []

    class Recording(Transformer):
        def __init__(self, cfg):
            super().__init__(cfg)
            devices.append(next(self.parameters()).device.type)

    monkeypatch.setattr(checkpoint_files, "Transformer", Recording)
    lm = load_model(folder)
    assert devices and set(devices) == {"meta"}
    assert isinstance(lm.model, Recording)


def test_load_does_not_import_dynamo(tiny_ckpt):
    """Regression for the 2.4-5 s model load of issue 14 (checked by import, not by time)."""
    code = (
        "import sys; from diffill.model import load_model; "
        f"load_model({str(tiny_ckpt[0])!r}); "
        "print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_untied_diffill_checkpoint(tmp_path):
    cfg = tiny_config(tie_embeddings=False, qk_norm=False, qkv_bias=True)
    ref = write_diffill_checkpoint(tmp_path, cfg)
    lm = load_model(tmp_path)
    assert lm.model.lm_head is not None and lm.config.qkv_bias
    ids = torch.arange(12).view(1, 12)
    with torch.no_grad():
        assert torch.equal(lm.model(ids), ref(ids))


@pytest.mark.parametrize(
    ("dtype", "want"),
    [
        ("bfloat16", torch.bfloat16),
        ("fp16", torch.float16),
        (torch.float32, torch.float32),
        ("torch.bfloat16", torch.bfloat16),
    ],
)
def test_explicit_dtype(tiny_ckpt, dtype, want):
    lm = load_model(tiny_ckpt[0], dtype=dtype)
    assert lm.dtype == want
    assert {p.dtype for p in lm.model.parameters()} == {want}


def test_bad_dtype_name(tiny_ckpt):
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        load_model(tiny_ckpt[0], dtype="int8")


def test_resolve_dtype_defaults():
    cfg = tiny_config(torch_dtype="bfloat16")
    assert resolve_dtype(cfg, torch.device("cpu"), None) == torch.float32
    assert resolve_dtype(cfg, torch.device("cuda"), None) == torch.bfloat16
    assert (
        resolve_dtype(cfg.replace(torch_dtype="float16"), torch.device("cuda:1"), None)
        == torch.float16
    )
    assert (
        resolve_dtype(cfg.replace(torch_dtype=None), torch.device("cuda"), None) == torch.bfloat16
    )
    assert resolve_dtype(cfg, torch.device("cuda"), "float32") == torch.float32


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_without_cuda(tiny_ckpt):
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        load_model(tiny_ckpt[0], device="cuda")


def test_default_path(tiny_ckpt, monkeypatch):
    monkeypatch.setattr(loader_mod, "default_model_path", lambda: tiny_ckpt[0])
    assert load_model().path == tiny_ckpt[0].resolve()


def test_default_model_path_is_package_data():
    p = loader_mod.default_model_path()
    assert p.name == "default_model" and p.parent == Path(loader_mod.__file__).resolve().parent


# --------------------------------------------------------------------------- HF-named folders


def _write_hf(
    folder: Path,
    family: str,
    cfg: ModelConfig,
    model: Transformer,
    *,
    extra: dict[str, torch.Tensor] | None = None,
    config_extra: dict | None = None,
) -> None:
    """Save ``model`` under ``family``'s HF tensor names with an HF config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    sd = model.state_dict()
    names = to_checkpoint_names(family, list(sd), tied=cfg.tie_embeddings)
    tensors = {names[k]: v.contiguous() for k, v in sd.items()}
    tensors.update(extra or {})
    save_file(tensors, str(folder / "model.safetensors"))
    raw = {
        "architectures": [
            {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[
                family
            ]
        ],
        "model_type": family,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "bfloat16",
        **(config_extra or {}),
    }
    (folder / "config.json").write_text(json.dumps(raw))
    write_tokenizer(folder, cfg.vocab_size)


def _random_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    m = Transformer(cfg)
    m.init_weights(seed=seed)
    return m.eval()


def test_tied_checkpoint_with_duplicate_head_is_accepted(tmp_path):
    cfg = tiny_config(family="qwen3", qk_norm=True, tie_embeddings=True, shift_logits=True)
    ref = _random_model(cfg)
    dup = ref.embed_tokens.weight.detach().clone()
    _write_hf(
        tmp_path,
        "qwen3",
        cfg,
        ref,
        extra={
            "lm_head.weight": dup,
            "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4),
        },
    )
    lm = load_model(tmp_path)
    assert lm.config.tie_embeddings and lm.model.lm_head is None
    assert lm.config.torch_dtype == "bfloat16" and lm.dtype == torch.float32  # CPU default
    ids = torch.arange(9).view(1, 9)
    with torch.no_grad():
        assert torch.equal(lm.model(ids), ref(ids))


def test_untied_checkpoint_missing_head(tmp_path):
    cfg = tiny_config(family="llama", qk_norm=False, tie_embeddings=False, shift_logits=True)
    ref = _random_model(cfg)
    _write_hf(tmp_path, "llama", cfg, ref)
    path = tmp_path / "model.safetensors"
    from safetensors.torch import load_file

    t = load_file(str(path))
    del t["lm_head.weight"]
    del t["model.layers.1.mlp.up_proj.weight"]
    save_file(t, str(path))
    # missing tensors are listed under the names this family's checkpoints use
    with pytest.raises(
        CheckpointError,
        match=r"2 tensor\(s\) missing for family 'llama': model\.layers\.1\.mlp\.up_proj\.weight, lm_head\.weight",
    ):
        load_model(tmp_path)


def test_dream_style_config(tmp_path):
    """Dream checkpoints: model_type "Dream", architectures ["DreamModel"], Qwen2
    tensor names, mask_token_id in config.json, logits shifted."""
    cfg = tiny_config(
        family="qwen2", qk_norm=False, qkv_bias=True, tie_embeddings=False, shift_logits=True
    )
    ref = _random_model(cfg, seed=3)
    _write_hf(
        tmp_path,
        "qwen2",
        cfg,
        ref,
        config_extra={"model_type": "Dream", "architectures": ["DreamModel"], "mask_token_id": 5},
    )
    lm = load_model(tmp_path)
    assert lm.config.family == "qwen2" and lm.config.shift_logits
    assert lm.config.mask_token_id == 5 and lm.tokenizer.mask_id == 5
    assert lm.config.architectures == ["DreamModel"]
    ids = torch.arange(7).view(1, 7)
    with torch.no_grad():
        assert torch.equal(lm.model(ids), ref(ids))


# --------------------------------------------------------------------------- CUDA (skipped without a GPU)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_load_uses_config_dtype(tmp_path):
    cfg = tiny_config(torch_dtype="bfloat16")
    ref = write_diffill_checkpoint(tmp_path, cfg)
    lm = load_model(tmp_path, device="cuda")
    assert lm.dtype == torch.bfloat16
    assert all(p.is_cuda and p.dtype == torch.bfloat16 for p in lm.model.parameters())
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = lm.model(ids.cuda()).float().cpu()
        want = ref(ids)
    assert (got - want).abs().max() < 5e-2
    fp32 = load_model(tmp_path, device="cuda", dtype="float32")
    with torch.no_grad():
        assert (fp32.model(ids.cuda()).cpu() - want).abs().max() < 1e-3


def test_model_does_not_alias_the_file(tiny_ckpt):
    """The loaded weights are private copies: rewriting the safetensors file in place
    (as a new training checkpoint would) leaves the resident model unchanged."""
    folder, ref = tiny_ckpt
    lm = load_model(folder)
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    data[header:] = bytes(len(data) - header)  # zero every tensor byte, same size
    with open(path, "r+b") as f:
        f.write(data)
    ids = torch.arange(10).view(1, 10)
    with torch.no_grad():
        assert torch.equal(lm.model(ids), ref(ids))
    assert lm.model.embed_tokens.weight.abs().sum() > 0


def test_a_load_that_cannot_fit_under_the_address_space_limit_is_refused_first(tmp_path, monkeypatch):
    """Under RLIMIT_AS (ulimit -v) a load that would not fit is refused with a MemoryError
    before it starts: the Rust readers of checkpoints and tokenizers abort the process when
    an allocation fails (seen as the server's SIGABRT in CI), they do not raise."""
    import resource

    from diffill.model import loader

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * (1 << 20))
    used = 500 << 20
    monkeypatch.setattr(loader, "_vm_size", lambda: used)
    monkeypatch.setattr(resource, "getrlimit", lambda _r: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    loader.check_address_space(folder)  # no limit: nothing checked
    room = loader.LOAD_MARGIN_BYTES + (1 << 20)
    monkeypatch.setattr(resource, "getrlimit", lambda _r: (used + room, resource.RLIM_INFINITY))
    loader.check_address_space(folder)  # just fits
    monkeypatch.setattr(resource, "getrlimit", lambda _r: (used + room - 1, resource.RLIM_INFINITY))
    with pytest.raises(MemoryError, match=r"ckpt: out of memory: .*ulimit -v"):
        loader.check_address_space(folder)
    monkeypatch.setattr(loader, "_vm_size", lambda: None)  # no /proc: nothing checked
    loader.check_address_space(folder)


def _bf16_file(folder: Path) -> Path:
    path = folder / "model.safetensors"
    save_file({k: v.bfloat16() for k, v in load_file(str(path)).items()}, str(path))
    return path


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert (got.float() - want).abs().max() < 0.03 * want.abs().max()
    assert (got.float().argmax(-1) == want.argmax(-1)).float().mean() > 0.9


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_bf16_weights_map_the_files_bf16_tensors(tmp_path):
    """weights='bf16' on a bf16 file: every parameter is the file's own bytes (no copy), the
    logits stay close to the same file loaded in fp32."""
    write_diffill_checkpoint(tmp_path, tiny_config(max_position_embeddings=64))
    path = _bf16_file(tmp_path)
    lm = load_model(tmp_path, weights="bf16")
    assert lm.weights == lm.model.weights == "bf16" and lm.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 and in_file_map(p, path) for p in lm.model.parameters())
    fp = load_model(tmp_path, weights="fp32")
    assert not any(in_file_map(p, path) for p in fp.model.parameters())
    ids = torch.randint(4, lm.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        _close(lm.model(ids), fp.model(ids))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_bf16_weights_of_an_fp32_file_are_converted(tmp_path, monkeypatch):
    """DIFFILL_WEIGHTS=bf16 on an fp32 file: converted to bf16 in private memory (nothing to
    map), close to fp32; an explicit other dtype is refused."""
    write_diffill_checkpoint(tmp_path, tiny_config(max_position_embeddings=64))
    monkeypatch.setenv("DIFFILL_WEIGHTS", "bf16")
    lm = load_model(tmp_path)
    assert lm.weights == "bf16" and {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
    assert not any(in_file_map(p, tmp_path / "model.safetensors") for p in lm.model.parameters())
    fp = load_model(tmp_path, weights="fp32")
    ids = torch.randint(4, lm.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        _close(lm.model(ids), fp.model(ids))
    with pytest.raises(ValueError, match="bfloat16, not float32"):
        load_model(tmp_path, dtype="float32")
