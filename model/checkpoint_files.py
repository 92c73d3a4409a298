"""A checkpoint's weights files, read as :mod:`.loader` does: which safetensors files
(one, or the shards an index lists), their headers checked against the Transformer's own
names and shapes with no tensor data read (:func:`scan_headers`, phase 1), the tensors read a
file at a time (:func:`read_tensors`), and the meta-device :func:`skeleton` they are assigned
to. Every failure is a :class:`CheckpointError` naming the file and the tensor."""

from __future__ import annotations

import errno
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch.overrides import TorchFunctionMode

from .config import ModelConfig
from .transformer import Transformer
from .weights import SKIP, map_name, to_checkpoint_names

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"

# safetensors header dtype codes that hold real-valued weights we can convert
_FLOAT_CODES = {"F64", "F32", "F16", "BF16"}


class CheckpointError(ValueError):
    """A checkpoint folder or weights file that cannot be loaded; the message names
    the file and the tensor."""


def weight_files(folder: Path) -> tuple[list[Path], dict[str, Path] | None]:
    """The safetensors files of a checkpoint and, for a sharded one, the index's
    tensor -> file map."""
    index = folder / INDEX_NAME
    if index.is_file():
        try:
            data = json.loads(index.read_text())
        except (ValueError, OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{index}: not valid JSON ({e})") from None
        wm = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise CheckpointError(f"{index}: field weight_map missing or empty")
        by_name: dict[str, Path] = {}
        files: list[Path] = []
        for name, fname in wm.items():
            if (
                not isinstance(fname, str)
                or "/" in fname
                or "\\" in fname
                or fname in ("", ".", "..")
            ):
                raise CheckpointError(
                    f"{index}: weight_map[{name!r}] is not a file name: {fname!r}"
                )
            p = folder / fname
            if p not in files:
                if not p.is_file():
                    raise CheckpointError(
                        f"{index}: names shard {fname!r} (for tensor {name!r}) but {p} does not exist"
                    )
                files.append(p)
            by_name[name] = p
        return files, by_name
    single = folder / WEIGHTS_NAME
    if single.is_file():
        return [single], None
    others = sorted(p.name for p in folder.glob("*.safetensors"))
    if others:
        raise CheckpointError(
            f"{folder}: found {', '.join(others[:4])} but neither {WEIGHTS_NAME} nor {INDEX_NAME}"
        )
    bins = sorted(p.name for p in folder.glob("*.bin")) + sorted(
        p.name for p in folder.glob("*.pt")
    )
    hint = f" (found {', '.join(bins[:3])}: convert it to safetensors)" if bins else ""
    raise CheckpointError(f"{folder}: no {WEIGHTS_NAME} or {INDEX_NAME}{hint}")


@dataclass
class TensorEntry:
    """Where one of the Transformer's tensors is in the checkpoint: its file, its name there, its shape."""

    file: Path
    ckpt_name: str
    shape: tuple[int, ...]


def scan_headers(
    files: list[Path],
    index: dict[str, Path] | None,
    cfg: ModelConfig,
    expected: dict[str, tuple[int, ...]],
) -> dict[str, TensorEntry]:
    """Read every header, map names, and check the set of tensors and their shapes
    against ``expected`` (Transformer name -> shape). Reads no tensor data."""
    plan: dict[str, TensorEntry] = {}
    unexpected: list[str] = []
    seen: dict[str, Path] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                names = list(f.keys())
                shapes = {}
                for n in names:
                    sl = f.get_slice(n)
                    code = sl.get_dtype()
                    if code not in _FLOAT_CODES:
                        raise CheckpointError(
                            f"{path}: tensor {n!r} has dtype {code}; only float weights "
                            f"({', '.join(sorted(_FLOAT_CODES))}) can be loaded (quantized checkpoints are not supported)"
                        )
                    shapes[n] = tuple(int(s) for s in sl.get_shape())
        except CheckpointError:
            raise
        except Exception as e:  # safetensors raises its own SafetensorError / OSError
            if is_out_of_memory(e):
                raise MemoryError(f"{path}: out of memory while mapping the weights ({e})") from None
            raise CheckpointError(
                f"{path}: not a readable safetensors file, truncated or corrupt ({e})"
            ) from None
        for n in names:
            if n in seen:
                raise CheckpointError(f"{path}: tensor {n!r} also appears in {seen[n]}")
            seen[n] = path
            if index is not None and n in index and index[n] != path:
                raise CheckpointError(
                    f"{path}: holds tensor {n!r} that {INDEX_NAME} places in {index[n].name}"
                )
            target = map_name(cfg.family, n, tied=cfg.tie_embeddings)
            if target == SKIP:
                continue
            if target is None or target not in expected:
                unexpected.append(f"{n} ({path.name})")
                continue
            if target in plan:
                raise CheckpointError(
                    f"{path}: tensor {n!r} and {plan[target].ckpt_name!r} both map to {target!r}"
                )
            if shapes[n] != expected[target]:
                raise CheckpointError(
                    f"{path}: tensor {n!r} has shape {list(shapes[n])}, expected "
                    f"{list(expected[target])} for this config.json"
                )
            plan[target] = TensorEntry(path, n, shapes[n])
    if index is not None:
        absent = [n for n in index if n not in seen]
        if absent:
            raise CheckpointError(
                f"{files[0].parent / INDEX_NAME}: lists {len(absent)} tensor(s) not found in their shards, "
                f"e.g. {', '.join(absent[:5])}"
            )
    if unexpected:
        raise CheckpointError(
            f"{files[0].parent}: {len(unexpected)} unexpected tensor(s) for family "
            f"{cfg.family!r}: {', '.join(unexpected[:8])}" + (" ..." if len(unexpected) > 8 else "")
        )
    missing = [n for n in expected if n not in plan]
    if missing:
        names = to_checkpoint_names(cfg.family, missing[:8], tied=cfg.tie_embeddings)
        raise CheckpointError(
            f"{files[0].parent}: {len(missing)} tensor(s) missing for family {cfg.family!r}: "
            f"{', '.join(names.values())}" + (" ..." if len(missing) > 8 else "")
        )
    return plan


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says the process ran out of memory: MemoryError, ENOMEM from mmap
    (an OSError, or safetensors' own error whose text carries the OS message)."""
    if isinstance(e, MemoryError):
        return True
    if isinstance(e, OSError) and e.errno == errno.ENOMEM:
        return True
    msg = str(e)
    return "Cannot allocate memory" in msg or "os error 12)" in msg


def read_tensors(
    plan: dict[str, TensorEntry], device: torch.device, dtype: torch.dtype, out: dict[str, torch.Tensor],
    mapped: bool = False,
) -> None:
    """Read each planned tensor from its memory-mapped file into ``out`` (Transformer
    name -> tensor), converted to ``dtype`` on ``device`` one at a time, so the peak
    is the model plus one tensor. Tensors are read straight onto CUDA when the target
    is CUDA; on CPU each is copied out of the map into the process's own memory (int8
    weights: :func:`~.int8_load.materialise_int8`), unless ``mapped``: then a tensor the file
    already holds in ``dtype``, contiguous, stays the map's view (bf16 weights, :mod:`.quant`):
    no copy, and the pages are the page cache's, read as the first forward touches them."""
    by_file: dict[Path, list[str]] = {}
    for target, e in plan.items():
        by_file.setdefault(e.file, []).append(target)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        st_device = f"cuda:{index}"
    else:
        st_device = "cpu"
    # On CPU, get_tensor returns a view of the file's memory map (private, copy-on-write: the
    # model never writes to it, and writes would not reach the file). Copy it, so the resident
    # model never changes (or faults) when the file is rewritten in place; ``mapped`` accepts
    # that for half the memory (diffill pull replaces files by rename, which an open map survives).
    private_copy = st_device == "cpu"
    for path, targets in by_file.items():
        try:
            with safe_open(str(path), framework="pt", device=st_device) as f:
                for target in targets:
                    t = f.get_tensor(plan[target].ckpt_name)
                    keep = mapped and private_copy and t.dtype == dtype and t.is_contiguous()
                    out[target] = t if keep else t.to(device=device, dtype=dtype, copy=private_copy)
                    del t
        except Exception as e:
            raise CheckpointError(f"{path}: failed while reading tensor data ({e})") from e


BLOCK_LINEAR = re.compile(r"^layers\.\d+\.(self_attn|mlp)\.[a-z_]+_proj\.weight$")

# In-place initialisers that nn.Module constructors call (nn.init.* and the tensor methods
# they end in). On a meta tensor they have nothing to fill, yet some of them (normal_ on
# meta runs a Python reference implementation) import torch._dynamo on first use: ~2.9 s
# of a 3.4 s load of the shipped model on a 2-core machine. The skeleton skips them.
_INIT_NAMES = frozenset({
    "normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
    "xavier_uniform_", "xavier_normal_", "orthogonal_", "sparse_", "constant_", "ones_",
    "zeros_", "eye_", "dirac_", "fill_", "zero_", "bernoulli_", "exponential_",
})


class _SkipMetaInit(TorchFunctionMode):
    """Inside it, the initialisers above return their (meta) tensor untouched."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in _INIT_NAMES:
            # nn.init.* passes its tensor by keyword, Tensor methods as self
            t = args[0] if args else kwargs.get("tensor")
            if isinstance(t, torch.Tensor) and t.is_meta:
                return t
        return func(*args, **kwargs)


def skeleton(cfg: ModelConfig) -> Transformer:
    """The Transformer on the meta device (shapes, no storage, no initialisation)."""
    with torch.device("meta"), _SkipMetaInit():
        return Transformer(cfg)


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Transformer state_dict name -> shape, from a model on the meta device (no storage)."""
    return {k: tuple(v.shape) for k, v in skeleton(cfg).state_dict().items()}


def check_no_meta(model: Transformer, folder: Path) -> None:
    leftover = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if leftover:
        raise CheckpointError(f"{folder}: no data for {', '.join(leftover[:5])}")
