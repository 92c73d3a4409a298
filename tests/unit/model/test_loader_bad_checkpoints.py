"""Every way a checkpoint folder can be broken gives a clear error that names the
file and the field or tensor, and nothing half-loaded stays alive afterwards."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import pytest
import torch
from diffill.model import CheckpointError, ConfigError, checkpoint_files, load_model
from diffill.model import loader as loader_mod
from diffill.model.tokenizer import TokenizerError
from safetensors.torch import load_file, save_file
from support import make_tokenizer, write_diffill_checkpoint


@pytest.fixture()
def ckpt(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    write_diffill_checkpoint(folder)
    return folder


def _edit_config(folder: Path, **changes) -> None:
    raw = json.loads((folder / "config.json").read_text())
    raw.update(changes)
    (folder / "config.json").write_text(json.dumps(raw))


def _rewrite_weights(folder: Path, fn) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    fn(tensors)
    save_file(tensors, str(path))


def test_sanity_the_fixture_loads(ckpt):
    assert load_model(ckpt).config.family == "diffill"


# --------------------------------------------------------------------------- folder / config


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="no such folder") as ei:
        load_model(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(ei.value)


def test_path_is_a_file(ckpt):
    with pytest.raises(CheckpointError, match="is a file"):
        load_model(ckpt / "config.json")


def test_default_model_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(loader_mod, "default_model_path", lambda: tmp_path / "default_model")
    with pytest.raises(CheckpointError, match="default model is not installed") as ei:
        load_model()
    assert "default_model" in str(ei.value)


def test_config_missing(ckpt):
    (ckpt / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"config\.json: missing file"):
        load_model(ckpt)


def test_config_invalid_json(ckpt):
    (ckpt / "config.json").write_text('{"vocab_size": 64,')
    with pytest.raises(ConfigError, match=r"config\.json: not valid JSON"):
        load_model(ckpt)


def test_config_not_an_object(ckpt):
    (ckpt / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"config\.json: expected a JSON object"):
        load_model(ckpt)


def test_config_unknown_architecture(ckpt):
    _edit_config(ckpt, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ConfigError, match=r"config\.json: unknown architecture.*gpt2"):
        load_model(ckpt)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"vocab_size": "sixty-four"}, "vocab_size"),
        ({"hidden_size": -32}, "hidden_size"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"mask_token_id": None}, "mask_token_id"),
        ({"mask_token_id": 500}, "mask_token_id"),
        ({"no_such_key": 1}, "no_such_key"),
    ],
)
def test_config_bad_field(ckpt, changes, field):
    _edit_config(ckpt, **changes)
    with pytest.raises(ConfigError) as ei:
        load_model(ckpt)
    msg = str(ei.value)
    assert "config.json" in msg and field in msg


def test_config_shape_disagrees_with_weights(ckpt):
    _edit_config(ckpt, intermediate_size=80)
    with pytest.raises(CheckpointError) as ei:
        load_model(ckpt)
    msg = str(ei.value)
    assert "model.safetensors" in msg and "mlp." in msg and "expected [" in msg and "80" in msg


# --------------------------------------------------------------------------- weights files


def test_no_weights_file(ckpt):
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(
        CheckpointError, match=r"no model\.safetensors or model\.safetensors\.index\.json"
    ):
        load_model(ckpt)


def test_only_pytorch_bin(ckpt):
    (ckpt / "model.safetensors").unlink()
    (ckpt / "pytorch_model.bin").write_bytes(b"\0" * 16)
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: convert it to safetensors"):
        load_model(ckpt)


def test_oddly_named_safetensors_without_index(ckpt):
    (ckpt / "model.safetensors").rename(ckpt / "weights.safetensors")
    with pytest.raises(CheckpointError, match=r"found weights\.safetensors but neither"):
        load_model(ckpt)


def _shard(folder: Path) -> dict[str, str]:
    """Split model.safetensors into two shards + index; returns the weight map."""
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    wm = {}
    for i, part in enumerate((names[:half], names[half:]), start=1):
        fname = f"model-0000{i}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(folder / fname))
        wm.update({n: fname for n in part})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": wm})
    )
    return wm


def test_sharded_diffill_checkpoint_loads(ckpt):
    _shard(ckpt)
    assert len(load_model(ckpt).files) == 2


def test_index_names_missing_shard(ckpt):
    _shard(ckpt)
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError) as ei:
        load_model(ckpt)
    msg = str(ei.value)
    assert "model.safetensors.index.json" in msg and "model-00002-of-00002.safetensors" in msg
    assert "does not exist" in msg


def test_index_invalid_json(ckpt):
    _shard(ckpt)
    (ckpt / "model.safetensors.index.json").write_text("{weight_map")
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json: not valid JSON"):
        load_model(ckpt)


def test_index_without_weight_map(ckpt):
    _shard(ckpt)
    (ckpt / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(CheckpointError, match=r"index\.json: field weight_map"):
        load_model(ckpt)


def test_index_lists_tensor_absent_from_shard(ckpt):
    wm = _shard(ckpt)
    wm["layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors"
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(
        CheckpointError, match=r"not found in their shards.*layers\.9\.mlp\.up_proj\.weight"
    ):
        load_model(ckpt)


def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    if how == "truncated header":
        path.write_bytes(data[:5])
    elif how == "header cut short":
        path.write_bytes(data[: 8 + n // 2])
    elif how == "bad json header":
        path.write_bytes(data[:8] + b"{" + b"!" * (n - 1) + data[8 + n :])
    elif how == "truncated data":
        path.write_bytes(data[:-100])
    elif how == "empty":
        path.write_bytes(b"")
    else:
        raise ValueError(how)


@pytest.mark.parametrize(
    "how", ["truncated header", "header cut short", "bad json header", "truncated data", "empty"]
)
def test_corrupt_safetensors(ckpt, how):
    _corrupt(ckpt / "model.safetensors", how)
    with pytest.raises(CheckpointError) as ei:
        load_model(ckpt)
    msg = str(ei.value)
    assert "model.safetensors" in msg and "truncated or corrupt" in msg


def test_corrupt_shard(ckpt):
    _shard(ckpt)
    _corrupt(ckpt / "model-00002-of-00002.safetensors", "truncated data")
    with pytest.raises(
        CheckpointError, match=r"model-00002-of-00002\.safetensors.*truncated or corrupt"
    ):
        load_model(ckpt)


def test_shape_mismatch(ckpt):
    _rewrite_weights(
        ckpt, lambda t: t.__setitem__("layers.1.self_attn.k_proj.weight", torch.zeros(8, 32))
    )
    with pytest.raises(CheckpointError) as ei:
        load_model(ckpt)
    msg = str(ei.value)
    assert "model.safetensors" in msg and "layers.1.self_attn.k_proj.weight" in msg
    assert "shape [8, 32], expected [16, 32]" in msg


def test_missing_tensors(ckpt):
    def drop(t):
        del t["layers.0.mlp.down_proj.weight"]
        del t["norm.weight"]

    _rewrite_weights(ckpt, drop)
    with pytest.raises(CheckpointError, match="2 tensor\\(s\\) missing") as ei:
        load_model(ckpt)
    assert "layers.0.mlp.down_proj.weight" in str(ei.value) and "norm.weight" in str(ei.value)


def test_unexpected_tensors(ckpt):
    _rewrite_weights(ckpt, lambda t: t.__setitem__("layers.0.mlp.extra.weight", torch.zeros(2)))
    with pytest.raises(
        CheckpointError,
        match=r"1 unexpected tensor\(s\).*layers\.0\.mlp\.extra\.weight \(model\.safetensors\)",
    ):
        load_model(ckpt)


def test_integer_tensor_rejected(ckpt):
    _rewrite_weights(
        ckpt, lambda t: t.__setitem__("norm.weight", torch.ones(32, dtype=torch.int32))
    )
    with pytest.raises(CheckpointError, match=r"norm\.weight.*dtype I32"):
        load_model(ckpt)


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_missing(ckpt):
    (ckpt / "tokenizer.json").unlink()
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: missing file"):
        load_model(ckpt)


def test_tokenizer_unreadable(ckpt):
    (ckpt / "tokenizer.json").write_text('{"model": 42}')
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: cannot be read"):
        load_model(ckpt)


def test_tokenizer_without_mask_token(tmp_path):
    """An HF-dialect checkpoint (no mask id in config.json) whose tokenizer has no
    mask token either."""
    folder = tmp_path / "nomask"
    write_diffill_checkpoint(folder)
    raw = json.loads((folder / "config.json").read_text())
    hf = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": raw["vocab_size"],
        "hidden_size": raw["hidden_size"],
        "intermediate_size": raw["intermediate_size"],
        "num_hidden_layers": raw["num_hidden_layers"],
        "num_attention_heads": raw["num_attention_heads"],
        "num_key_value_heads": raw["num_key_value_heads"],
    }
    (folder / "config.json").write_text(json.dumps(hf))
    make_tokenizer(64, specials=("<|bos|>", "<|eos|>", "<|pad|>")).save(
        str(folder / "tokenizer.json")
    )
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: no mask token"):
        load_model(folder)


def test_tokenizer_larger_than_embedding(ckpt):
    make_tokenizer(80).save(str(ckpt / "tokenizer.json"))
    with pytest.raises(
        TokenizerError, match=r"tokenizer\.json: has 80 tokens but config\.json vocab_size is 64"
    ):
        load_model(ckpt)


# --------------------------------------------------------------------------- nothing stays resident


class _Tracked:
    """Records weak references to every Transformer the loader builds and every
    tensor it reads."""

    def __init__(self, monkeypatch):
        self.models: list[weakref.ref] = []
        self.tensors: list[weakref.ref] = []
        base = checkpoint_files.Transformer
        outer = self

        class Recording(base):  # type: ignore[misc, valid-type]
            def __init__(self, cfg):
                super().__init__(cfg)
                outer.models.append(weakref.ref(self))

        monkeypatch.setattr(checkpoint_files, "Transformer", Recording)

    def alive(self) -> tuple[int, int]:
        gc.collect()
        return (
            sum(r() is not None for r in self.models),
            sum(r() is not None for r in self.tensors),
        )


def _fail_on_nth_read(monkeypatch, tracked: _Tracked, n: int) -> None:
    """Make the data phase fail on its n-th tensor read (after n-1 succeeded)."""
    real = checkpoint_files.safe_open
    count = {"reads": 0}

    class Handle:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def get_tensor(self, name):
            count["reads"] += 1
            if count["reads"] >= n:
                raise OSError("simulated read failure")
            t = self.inner.get_tensor(name)
            tracked.tensors.append(weakref.ref(t))
            return t

    class Opener:
        def __init__(self, *a, **kw):
            self.cm = real(*a, **kw)

        def __enter__(self):
            return Handle(self.cm.__enter__())

        def __exit__(self, *exc):
            return self.cm.__exit__(*exc)

    monkeypatch.setattr(checkpoint_files, "safe_open", Opener)


def test_failed_read_leaves_nothing_alive(ckpt, monkeypatch):
    tracked = _Tracked(monkeypatch)
    _fail_on_nth_read(monkeypatch, tracked, n=5)
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors: failed while reading tensor data"
    ) as ei:
        load_model(ckpt)
    assert len(tracked.tensors) == 4 and tracked.models
    # even while the caller still holds the exception (and its traceback)
    assert ei.value is not None
    assert tracked.alive() == (0, 0)


def test_failed_assign_leaves_nothing_alive(ckpt, monkeypatch):
    tracked = _Tracked(monkeypatch)
    _fail_on_nth_read(monkeypatch, tracked, n=10_000)  # record reads, never fail

    def boom(self, *a, **kw):
        raise RuntimeError("simulated failure while assigning")

    monkeypatch.setattr(loader_mod.Transformer, "load_state_dict", boom)
    with pytest.raises(
        CheckpointError, match="could not load the weights.*simulated failure"
    ) as ei:
        load_model(ckpt)
    assert tracked.tensors and tracked.models
    assert ei.value is not None
    assert tracked.alive() == (0, 0)


@pytest.mark.parametrize("case", ["shape", "missing", "unexpected", "corrupt"])
def test_header_errors_leave_nothing_alive(ckpt, monkeypatch, case):
    if case == "shape":
        _rewrite_weights(ckpt, lambda t: t.__setitem__("norm.weight", torch.ones(31)))
    elif case == "missing":
        _rewrite_weights(ckpt, lambda t: t.pop("norm.weight"))
    elif case == "unexpected":
        _rewrite_weights(ckpt, lambda t: t.__setitem__("bogus", torch.ones(1)))
    else:
        _corrupt(ckpt / "model.safetensors", "truncated data")
    tracked = _Tracked(monkeypatch)
    _fail_on_nth_read(monkeypatch, tracked, n=10_000)
    with pytest.raises(CheckpointError) as ei:
        load_model(ckpt)
    assert ei.value is not None
    assert tracked.tensors == []  # validation happens before any tensor data is read
    assert tracked.alive() == (0, 0)


def test_successful_load_then_release(ckpt, monkeypatch):
    """Control for the tests above: the tracker does see a live model while the
    LoadedModel is referenced, and it goes away with it (no global cache)."""
    tracked = _Tracked(monkeypatch)
    lm = load_model(ckpt)
    assert tracked.alive()[0] >= 1
    del lm
    assert tracked.alive()[0] == 0


def test_out_of_memory_keeps_its_type_and_frees(ckpt, monkeypatch):
    tracked = _Tracked(monkeypatch)
    _fail_on_nth_read(monkeypatch, tracked, n=10_000)

    def oom(self, *a, **kw):
        raise MemoryError("simulated out of memory")

    monkeypatch.setattr(loader_mod.Transformer, "load_state_dict", oom)
    with pytest.raises(MemoryError, match="simulated out of memory") as ei:
        load_model(ckpt)
    assert ei.value is not None and tracked.tensors
    assert tracked.alive() == (0, 0)
