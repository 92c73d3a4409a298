"""The int8 model for a CPU (:mod:`.quant`), built as :mod:`.loader`'s phase 2 when the
weights are int8: from the int8 weights cache (:mod:`.int8_cache`) when it holds a good copy,
else quantized a tensor at a time from private reads of the checkpoint (no memory map) while
the cache is written; packed on a few threads, the C heap trimmed as it goes
(:func:`release_free_memory`), so the peak is the resident model plus a few tensors."""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from .checkpoint_files import (
    BLOCK_LINEAR,
    CheckpointError,
    TensorEntry,
    check_no_meta,
    read_tensors,
    skeleton,
)
from .config import ModelConfig
from .int8_cache import (
    CacheInvalid,
    CacheReader,
    CacheWriter,
    cache_file,
    read_header,
    read_into,
    resolve_cache_dir,
)
from .quant import PACK_ROWS, Int8Linear, pack_int8, quantize_per_channel
from .transformer import Transformer

log = logging.getLogger("diffill.model.int8_load")

_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
              "BF16": torch.bfloat16}
EMBED = "embed_tokens.weight"


def _int8_layout(cfg: ModelConfig, plan: dict[str, TensorEntry], embed_dtype: torch.dtype,
                 ) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """The tensors of a checkpoint's int8 cache file, in the order they are written
    (:mod:`.int8_cache`): the embedding first (it is mapped: its offset stays aligned), each
    block linear's codes and scales, the head's in :data:`~.quant.PACK_ROWS`-row pieces."""
    layout: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {EMBED: (embed_dtype, plan[EMBED].shape)}
    for n in plan:
        if BLOCK_LINEAR.match(n):
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


def materialise_int8(cfg: ModelConfig, plan: dict[str, TensorEntry], dtype: torch.dtype, folder: Path,
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
    check_no_meta(model, folder)
    return model


def _read_rows(e: TensorEntry, header: dict[str, Any], base: int, lo: int = 0,
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


def _build_int8(cfg: ModelConfig, plan: dict[str, TensorEntry], dtype: torch.dtype, folder: Path, *,
                reader: CacheReader | None = None, writer: CacheWriter | None = None) -> Transformer:
    """Build the int8 model: the small tensors (norms, biases) from the checkpoint in
    ``dtype``, the embedding table as stored (a lookup; a map of the cache file when read
    from it), every block linear and the head made int8 a tensor (head: a piece) at a time,
    from the ``reader``'s codes or quantized from the checkpoint (and handed to ``writer``),
    packed on :func:`_pack_workers` threads. The peak is the resident model plus a few
    tensors in flight; the numbers are the same whichever way the codes come."""
    model = skeleton(cfg)
    linears = [n for n in plan if BLOCK_LINEAR.match(n)]
    big = {*linears, EMBED, "lm_head.weight"}
    state: dict[str, torch.Tensor] = {}
    read_tensors({n: e for n, e in plan.items() if n not in big}, torch.device("cpu"), dtype, state)
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
        check_no_meta(model, folder)
    release_free_memory()
    return model
