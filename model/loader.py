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
   tensor) and the resident model does not depend on the file afterwards. int8 weights
   on a CPU (:mod:`.quant`) come from the int8 weights cache (:mod:`.int8_cache`) or are
   quantized a tensor at a time from private reads of the file, and packed on a few threads
   (:func:`_materialise_int8`).

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

import errno
import json
import logging
import math
import os
import re
import resource
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch.overrides import TorchFunctionMode

from .config import ConfigError, ModelConfig, read_config
from .int8_cache import (
    CacheInvalid,
    CacheReader,
    CacheWriter,
    cache_file,
    read_header,
    read_into,
    resolve_cache_dir,
)
from .quant import (
    PACK_ROWS,
    Int8Linear,
    count_parameters,
    pack_int8,
    quantize_per_channel,
    resolve_weights,
)
from .recipes import CheckpointFacts, RecipeError, choose_recipe, resolve_recipe
from .runtime import ensure_cpu_threads
from .tokenizer import Tokenizer, TokenizerError
from .transformer import Transformer
from .weights import SKIP, map_name, to_checkpoint_names

log = logging.getLogger("diffill.model.loader")

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

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"

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
# safetensors header dtype codes that hold real-valued weights we can convert
_FLOAT_CODES = {"F64", "F32", "F16", "BF16"}


class CheckpointError(ValueError):
    """A checkpoint folder or weights file that cannot be loaded; the message names
    the file and the tensor."""


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
    weights: str = "fp32"  # "fp32" (``dtype``) or "int8" (model.quant; CPU)

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


# --------------------------------------------------------------------------- files


def _weight_files(folder: Path) -> tuple[list[Path], dict[str, Path] | None]:
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
class _Entry:
    file: Path
    ckpt_name: str
    shape: tuple[int, ...]


def _scan(
    files: list[Path],
    index: dict[str, Path] | None,
    cfg: ModelConfig,
    expected: dict[str, tuple[int, ...]],
) -> dict[str, _Entry]:
    """Read every header, map names, and check the set of tensors and their shapes
    against ``expected`` (Transformer name -> shape). Reads no tensor data."""
    plan: dict[str, _Entry] = {}
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
            plan[target] = _Entry(path, n, shapes[n])
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


def _read_tensors(
    plan: dict[str, _Entry], device: torch.device, dtype: torch.dtype, out: dict[str, torch.Tensor],
) -> None:
    """Read each planned tensor from its memory-mapped file into ``out`` (Transformer
    name -> tensor), converted to ``dtype`` on ``device`` one at a time, so the peak
    is the model plus one tensor. Tensors are read straight onto CUDA when the target
    is CUDA; on CPU each is copied out of the map into the process's own memory (int8
    weights: :func:`_materialise_int8`)."""
    by_file: dict[Path, list[str]] = {}
    for target, e in plan.items():
        by_file.setdefault(e.file, []).append(target)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        st_device = f"cuda:{index}"
    else:
        st_device = "cpu"
    # On CPU, get_tensor returns a view of the file's shared memory map: copy it, so
    # the resident model never changes (or faults) when the file is rewritten.
    private_copy = st_device == "cpu"
    for path, targets in by_file.items():
        try:
            with safe_open(str(path), framework="pt", device=st_device) as f:
                for target in targets:
                    t = f.get_tensor(plan[target].ckpt_name)
                    out[target] = t.to(device=device, dtype=dtype, copy=private_copy)
                    del t
        except Exception as e:
            raise CheckpointError(f"{path}: failed while reading tensor data ({e})") from e


_BLOCK_LINEAR = re.compile(r"^layers\.\d+\.(self_attn|mlp)\.[a-z_]+_proj\.weight$")

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


def _skeleton(cfg: ModelConfig) -> Transformer:
    """The Transformer on the meta device (shapes, no storage, no initialisation)."""
    with torch.device("meta"), _SkipMetaInit():
        return Transformer(cfg)


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Transformer state_dict name -> shape, from a model on the meta device (no storage)."""
    return {k: tuple(v.shape) for k, v in _skeleton(cfg).state_dict().items()}


def _materialise(
    cfg: ModelConfig,
    plan: dict[str, _Entry],
    device: torch.device,
    dtype: torch.dtype,
    folder: Path,
    weights: str = "fp32",
    files: list[Path] | None = None,
    int8_cache: str | Path | bool | None = None,
) -> Transformer:
    """Build the Transformer on the meta device (:func:`_skeleton`) and assign the
    checkpoint's tensors to it, so every weight is allocated once. On any failure,
    everything built here is released (locals dropped, traceback frames cleared)
    before raising. ``weights='int8'`` (CPU): :func:`_materialise_int8`."""
    state: dict[str, torch.Tensor] = {}
    model: Transformer | None = None
    try:
        if weights == "int8":
            model = _materialise_int8(cfg, plan, dtype, folder, files or [], int8_cache)
        else:
            model = _skeleton(cfg)
            _read_tensors(plan, device, dtype, state)
            model.load_state_dict(state, strict=True, assign=True)
            state.clear()
            _check_no_meta(model, folder)
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


def _check_no_meta(model: Transformer, folder: Path) -> None:
    leftover = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if leftover:
        raise CheckpointError(f"{folder}: no data for {', '.join(leftover[:5])}")


# --------------------------------------------------------------------------- int8 weights

_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
              "BF16": torch.bfloat16}
EMBED = "embed_tokens.weight"


def _int8_layout(cfg: ModelConfig, plan: dict[str, _Entry], embed_dtype: torch.dtype,
                 ) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """The tensors of a checkpoint's int8 cache file, in the order they are written
    (:mod:`.int8_cache`): the embedding first (it is mapped: its offset stays aligned), each
    block linear's codes and scales, the head's in :data:`~.quant.PACK_ROWS`-row pieces."""
    layout: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {EMBED: (embed_dtype, plan[EMBED].shape)}
    for n in plan:
        if _BLOCK_LINEAR.match(n):
            rows, cols = plan[n].shape
            layout[f"{n}.q"] = (torch.int8, (rows, cols))
            layout[f"{n}.scale"] = (torch.float32, (rows,))
    vocab, hidden = plan["lm_head.weight" if "lm_head.weight" in plan else EMBED].shape
    for i, lo in enumerate(range(0, vocab, PACK_ROWS)):
        n = min(PACK_ROWS, vocab - lo)
        layout[f"head.{i}.q"] = (torch.int8, (n, hidden))
        layout[f"head.{i}.scale"] = (torch.float32, (n,))
    return layout


def _pack_workers() -> int:
    """Threads that read, quantize and pack int8 weights (torch and file reads release the GIL)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(4, n))


_libc: Any = None


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


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the OS (glibc ``malloc_trim``; elsewhere nothing).
    The int8 load frees a tensor-sized temporary per weight on several threads, and glibc keeps
    such freed blocks in its per-thread arenas: 0.45 GB of the 0.5B load's RSS until trimmed."""
    global _libc
    try:
        if _libc is None:
            import ctypes  # only where the int8 load trims the heap

            _libc = ctypes.CDLL("libc.so.6")
        _libc.malloc_trim(0)
    except (OSError, AttributeError):
        _libc = False


TRIM_EVERY = 8
""":func:`_ordered` trims the C heap (:func:`release_free_memory`) after this many results."""


def _ordered(fn: Callable[[Any], Any], items: list[Any], workers: int) -> Iterator[tuple[Any, Any]]:
    """(item, fn(item)) in the order of ``items``, ``workers`` at a time (a few results ahead
    at most, so what waits to be consumed stays small); the C heap trimmed every
    :data:`TRIM_EVERY` results, so freed temporaries do not pile up."""
    n = 0

    def tick() -> None:
        nonlocal n
        n += 1
        if n % TRIM_EVERY == 0:
            release_free_memory()

    if workers <= 1:
        for it in items:
            yield it, fn(it)
            tick()
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="diffill-int8") as ex:
        pending: deque[tuple[Any, Future[Any]]] = deque()
        try:
            for it in items:
                pending.append((it, ex.submit(fn, it)))
                if len(pending) > workers:
                    done_it, fut = pending.popleft()
                    yield done_it, fut.result()
                    tick()
            while pending:
                done_it, fut = pending.popleft()
                yield done_it, fut.result()
                tick()
        finally:
            for _, fut in pending:
                fut.cancel()


def _materialise_int8(cfg: ModelConfig, plan: dict[str, _Entry], dtype: torch.dtype, folder: Path,
                      files: list[Path], int8_cache: str | Path | bool | None) -> Transformer:
    """The model with int8 weights (:mod:`.quant`) for a CPU, from the int8 weights cache
    (:mod:`.int8_cache`) when it holds a good copy for this checkpoint, else from the
    checkpoint, writing the cache. A cache file that does not check out is logged, ignored and
    rewritten; a cache that cannot be written is logged and the load goes on without it."""
    params = sum(math.prod(e.shape) for e in plan.values())
    cdir = resolve_cache_dir(int8_cache, params=params)
    if cdir is None:
        return _build_int8(cfg, plan, dtype, folder)
    path, key = cache_file(cdir, folder, files)
    headers = {p: read_header(p)[0] for p in files}
    code = headers[plan[EMBED].file][plan[EMBED].ckpt_name]["dtype"]
    layout = _int8_layout(cfg, plan, _ST_DTYPES[code])
    if path.is_file():
        try:
            with CacheReader(path, key, layout) as reader:
                model = _build_int8(cfg, plan, dtype, folder, reader=reader)
            log.info("int8 weights read from the cache %s", path)
            return model
        except (CacheInvalid, OSError) as e:
            log.warning("int8 weights cache %s ignored and rebuilt from the checkpoint: %s", path, e)
    writer = None
    try:
        writer = CacheWriter(path, key, layout)
    except OSError as e:
        log.warning("int8 weights cache not written (%s): %s", path, e)
    model = _build_int8(cfg, plan, dtype, folder, writer=writer)
    if writer is None:
        return model
    try:
        writer.finish()
        with CacheReader(path, key, layout) as reader:  # the table looked up from the new file
            model.embed_tokens = reader.embedding(EMBED)
        log.info("int8 weights cache written: %s", path)
    except (CacheInvalid, OSError, ValueError) as e:
        writer.abort()
        log.warning("int8 weights cache not written (%s): %s", path, e)
        header, base = headers[plan[EMBED].file], read_header(plan[EMBED].file)[1]
        table = _read_rows(plan[EMBED], header, base)  # the table in own memory after all
        model.embed_tokens.weight = torch.nn.Parameter(table, requires_grad=False)
    _check_no_meta(model, folder)
    return model


def _read_rows(e: _Entry, header: dict[str, Any], base: int, lo: int = 0,
               hi: int | None = None) -> torch.Tensor:
    """Rows ``lo:hi`` of a checkpoint tensor in its stored dtype, read into own memory (no
    memory map: nothing of the file stays resident)."""
    h = header[e.ckpt_name]
    dt = _ST_DTYPES[h["dtype"]]
    begin, end = h["data_offsets"]
    rows = e.shape[0]
    hi = rows if hi is None else hi
    row = (end - begin) // rows if rows else 0
    fd = os.open(e.file, os.O_RDONLY)
    try:
        t, _ = read_into(fd, base + begin + lo * row, (hi - lo) * row, dt, (hi - lo, *e.shape[1:]))
    except CacheInvalid as err:  # a short read: the file changed since it was checked
        raise CheckpointError(f"{e.file}: tensor {e.ckpt_name!r}: {err}") from None
    finally:
        os.close(fd)
    return t


def _build_int8(cfg: ModelConfig, plan: dict[str, _Entry], dtype: torch.dtype, folder: Path, *,
                reader: CacheReader | None = None, writer: CacheWriter | None = None) -> Transformer:
    """Build the int8 model: the small tensors (norms, biases) from the checkpoint in
    ``dtype``, the embedding table as stored (a lookup; a map of the cache file when read
    from it), every block linear and the head made int8 a tensor (head: a piece) at a time,
    from the ``reader``'s codes or quantized from the checkpoint (and handed to ``writer``),
    packed on :func:`_pack_workers` threads. The peak is the resident model plus a few
    tensors in flight; the numbers are the same whichever way the codes come."""
    model = _skeleton(cfg)
    linears = [n for n in plan if _BLOCK_LINEAR.match(n)]
    big = {*linears, EMBED, "lm_head.weight"}
    state: dict[str, torch.Tensor] = {}
    _read_tensors({n: e for n, e in plan.items() if n not in big}, torch.device("cpu"), dtype, state)
    files = {e.file for e in plan.values()}
    headers = {} if reader is not None else {p: read_header(p) for p in files}

    def from_ckpt(name: str, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        header, base = headers[plan[name].file]
        return _read_rows(plan[name], header, base, lo, hi)

    vocab = plan[EMBED].shape[0]
    table: torch.Tensor | None = None
    if reader is not None:
        reader.verify(EMBED)
        model.embed_tokens = reader.embedding(EMBED)  # the lookup reads rows from the file
    elif writer is not None:  # copied into the cache a piece at a time, looked up from there
        for lo in range(0, vocab, PACK_ROWS):
            writer.write(EMBED, from_ckpt(EMBED, lo, min(vocab, lo + PACK_ROWS)))
    else:
        table = from_ckpt(EMBED)
        state[EMBED] = table
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.unexpected_keys:
        raise CheckpointError(f"{folder}: unexpected {', '.join(result.unexpected_keys[:5])}")
    state.clear()

    def codes(name: str, lo: int, hi: int, source: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        if reader is not None:  # the codes into this thread's scratch buffer: packing copies them
            return reader.read(f"{name}.q", reuse=True), reader.read(f"{name}.scale")
        if source == EMBED and table is not None:
            return quantize_per_channel(table[lo:hi])
        return quantize_per_channel(from_ckpt(source or name, lo, hi))

    def linear(name: str) -> tuple[list[Any], list[tuple[torch.Tensor, torch.Tensor]]]:
        rows = plan[name].shape[0]
        mod_name = name.removesuffix(".weight")
        bias = model.get_submodule(mod_name).bias
        b = None if bias is None else bias.detach().float().contiguous()
        q, s = codes(name, 0, rows, None)
        packed = [pack_int8(q[i:i + PACK_ROWS], s[i:i + PACK_ROWS],
                            None if b is None else b[i:i + PACK_ROWS]) for i in range(0, rows, PACK_ROWS)]
        return packed, [(q, s)] if writer is not None else []

    workers = _pack_workers()
    for name, (packed, kept) in _ordered(linear, linears, workers):
        if writer is not None:
            writer.write(f"{name}.q", kept[0][0])
            writer.write(f"{name}.scale", kept[0][1])
        parent, _, attr = name.removesuffix(".weight").rpartition(".")
        rows, cols = plan[name].shape
        owner = model.get_submodule(parent)
        setattr(owner, attr, Int8Linear.from_packed(packed, rows, cols, getattr(owner, attr).bias is not None))

    head_src = "lm_head.weight" if "lm_head.weight" in plan else EMBED
    vocab, hidden = plan[head_src].shape

    def head_piece(i: int) -> tuple[Any, tuple[torch.Tensor, torch.Tensor] | None]:
        lo, hi = i * PACK_ROWS, min(vocab, (i + 1) * PACK_ROWS)
        q, s = codes(f"head.{i}", lo, hi, head_src)
        return pack_int8(q, s), (q, s) if writer is not None else None

    pieces = []
    for i, (packed, kept) in _ordered(head_piece, list(range(-(-vocab // PACK_ROWS))), workers):
        if writer is not None:
            writer.write(f"head.{i}.q", kept[0])
            writer.write(f"head.{i}.scale", kept[1])
        pieces.append(packed)
    model.int8_head = Int8Linear.from_packed(pieces, vocab, hidden, False)
    if model.lm_head is not None:  # untied: the float head is not kept
        model.lm_head.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    model.weights = "int8"
    if writer is None:  # with a writer the table comes from the finished file (the caller)
        _check_no_meta(model, folder)
    release_free_memory()
    return model


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
) -> tuple[ModelConfig, Any, Tokenizer, list[Path], dict[str, _Entry]]:
    """Phase 1: config, tokenizer, recipe and every safetensors header; reads no tensor data."""
    cfg, dialect = read_config(folder)
    cfg, tok = _tokenizer_phase(folder, cfg, recipe)
    files, index = _weight_files(folder)
    plan = _scan(files, index, cfg, _expected_shapes(cfg))
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
    weights: ``auto`` | ``fp32`` | ``int8`` (None: ``DIFFILL_WEIGHTS``, else ``auto``):
        int8 matmuls for the blocks and the head on a CPU (:mod:`.quant`; ``auto``: for
        models of 100M parameters and more); fp32 keeps ``dtype``. int8 implies a float32
        ``dtype`` for what stays floating point (embedding, norms).
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
            files, index = _weight_files(folder)
            plan = _scan(files, index, cfg0, _expected_shapes(cfg0))
            params = sum(math.prod(e.shape) for e in plan.values())
            w = resolve_weights(weights, device=dev, params=params) if dev.type == "cpu" else \
                resolve_weights(weights or "fp32", device=dev, params=params)
            target_dtype = resolve_dtype(cfg0, dev, dtype)
            if w == "int8" and target_dtype != torch.float32:
                if dtype is not None:
                    raise ValueError(f"weights 'int8' keeps float32 around the int8 matmuls, not {dtype}")
                target_dtype = torch.float32
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
