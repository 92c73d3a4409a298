"""The int8 weights cache: a checkpoint's int8 codes kept on disk between loads.

Making int8 weights (:mod:`.quant`) from a 0.5B bf16 checkpoint reads 0.99 GB and quantizes
494M weights (~3 s on the 2-core test machine) before torch packs them (~2-3 s); the codes
are the same every time. The first int8 load of a checkpoint writes them here; the next
reads them back (a plain read, ~0.2 s) and only packs. The packed FBGEMM layout itself has no
public form to save: packing stays, spread over a few threads (torch releases the GIL).

Where: ``$DIFFILL_INT8_CACHE`` (a folder; ``off`` disables it), else
``$XDG_CACHE_HOME/diffill/int8`` (``~/.cache/diffill/int8``), never inside the checkpoint
folder. By default only checkpoints of :data:`CACHE_MIN_PARAMS` parameters and more are
cached (a few-MB model quantizes in milliseconds); a folder named explicitly
(``DIFFILL_INT8_CACHE`` or ``load_model(int8_cache=...)``) caches any size.

One file per checkpoint folder, ``<folder hash>-<key hash>.safetensors``; the key is the
cache format, diffill's and torch's versions, the folder and each weights file's name, size
and modification time. Writing a new key for a folder removes that folder's older file. The
file is an ordinary safetensors file (readable by any safetensors tool): per block linear
``<name>.q`` (int8 [N, K]) and ``<name>.scale`` (fp32 [N]), the head as ``head.q`` /
``head.scale``, and the embedding table as stored in the checkpoint (``embed_tokens.weight``).
Its metadata carries the key and a CRC-32 of every tensor. It is written to a temporary name
and renamed into place when complete, so a reader never sees a partial file.

Reading: the header is checked against the key and the expected names, dtypes and shapes, the
file's size against the header; every tensor's CRC as it is read. Anything wrong -- a
truncated, corrupt or foreign file -- raises :class:`CacheInvalid`: the loader logs one line,
ignores the file and builds (and rewrites) it from the checkpoint.

The codes are read into the process's own memory one tensor at a time (they are packed and
let go: the peak is the packed weights plus one tensor). The embedding table is a lookup, so
it stays a private (copy-on-write) memory map of the cache file (:meth:`CacheReader.mapped`): only the
rows the requests touch are resident (272 MB of bf16 for the 0.5B shape otherwise). The
cache file is only ever replaced by a rename, never rewritten in place, so the mapping stays
valid while the server runs, even if the file is deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import __version__ as DIFFILL_VERSION

__all__ = [
    "CACHE_ENV",
    "CACHE_MIN_PARAMS",
    "CacheInvalid",
    "CacheReader",
    "CacheWriter",
    "FileEmbedding",
    "cache_file",
    "resolve_cache_dir",
]

log = logging.getLogger("diffill.model.int8_cache")

CACHE_ENV = "DIFFILL_INT8_CACHE"
CACHE_MIN_PARAMS = 10_000_000
"""By default only checkpoints of this many parameters and more are cached (module doc)."""
FORMAT = "diffill-int8-cache-1"
_OFF = {"off", "0", "no", "none", "false"}
_CODES = {torch.int8: "I8", torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
          torch.float64: "F64", torch.uint8: "U8"}
_DTYPES = {v: k for k, v in _CODES.items()}
_CHUNK = 16 << 20  # bytes per read when a tensor is checked but not kept


class CacheInvalid(ValueError):
    """A cache file that cannot be used (truncated, corrupt, another key); the message says why."""


def resolve_cache_dir(setting: str | Path | bool | None = None, *, params: int = 0) -> Path | None:
    """The cache folder, or None for no cache. ``setting``: None = ``$DIFFILL_INT8_CACHE``, else
    the default folder for checkpoints of at least :data:`CACHE_MIN_PARAMS` parameters;
    False / ``off`` = none; a path = that folder (any size)."""
    if setting is False:
        return None
    if setting is None or setting is True:
        env = os.environ.get(CACHE_ENV, "").strip()
        if env:
            setting = env
        elif setting is None and params < CACHE_MIN_PARAMS:
            return None
        else:
            base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
            return Path(base).expanduser() / "diffill" / "int8"
    if str(setting).strip().lower() in _OFF:
        return None
    return Path(setting).expanduser()


def cache_file(cache_dir: Path, folder: Path, files: list[Path]) -> tuple[Path, dict[str, str]]:
    """The cache file of a checkpoint (folder, weights files) and the key it must carry."""
    key: dict[str, str] = {"format": FORMAT, "diffill": DIFFILL_VERSION, "torch": torch.__version__,
                           "folder": str(folder)}
    for p in files:
        st = p.stat()
        key[f"file:{p.name}"] = f"{st.st_size}:{st.st_mtime_ns}"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    stem = hashlib.sha256(str(folder).encode()).hexdigest()[:16]
    return cache_dir / f"{stem}-{digest}.safetensors", key


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header (JSON) and the offset its tensor data starts at."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CacheInvalid(f"{path}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > 100 << 20:
            raise CacheInvalid(f"{path}: header length {n} is not plausible")
        text = f.read(n)
    if len(text) != n:
        raise CacheInvalid(f"{path}: truncated header")
    try:
        header = json.loads(text)
    except ValueError as e:
        raise CacheInvalid(f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CacheInvalid(f"{path}: header is not an object")
    return header, 8 + n


_scratch = threading.local()


def scratch(nbytes: int) -> torch.Tensor:
    """This thread's reusable byte buffer of at least ``nbytes`` (its first ``nbytes``): reads
    of codes that are packed and let go reuse it instead of faulting in fresh pages each time."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < nbytes:
        buf = _scratch.buf = torch.empty(nbytes, dtype=torch.uint8)
    return buf[:nbytes]


def read_into(fd: int, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...],
              crc: int = 0, out: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """``nbytes`` at ``offset`` of file ``fd`` as a tensor -- new (the process's own memory),
    or a view of ``out`` (uint8, ``nbytes`` long) -- read positionally (safe from several
    threads), and the CRC-32 of those bytes continued from ``crc``."""
    buf = torch.empty(nbytes, dtype=torch.uint8) if out is None else out
    mv = memoryview(buf.numpy()) if nbytes else memoryview(b"")
    got = 0
    while got < nbytes:
        n = os.preadv(fd, [mv[got:]], offset + got)
        if n <= 0:
            raise CacheInvalid(f"short read at byte {offset + got}")
        got += n
    crc = zlib.crc32(mv, crc)
    return buf.view(dtype).view(shape), crc


class CacheReader:
    """An open cache file checked against its key and the tensors expected
    (name -> (dtype, shape)); raises :class:`CacheInvalid`."""

    def __init__(self, path: Path, key: dict[str, str],
                 expected: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> None:
        self.path = path
        header, self._base = read_header(path)
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or meta.get("key") != json.dumps(key, sort_keys=True):
            raise CacheInvalid(f"{path}: made for another checkpoint or diffill version")
        try:
            self._crcs = {k: int(v, 16) for k, v in json.loads(meta["crc"]).items()}
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise CacheInvalid(f"{path}: no usable checksums ({e})") from None
        self._spans: dict[str, tuple[int, int]] = {}
        for name, (dtype, shape) in expected.items():
            h = header.get(name)
            if not isinstance(h, dict):
                raise CacheInvalid(f"{path}: no tensor {name!r}")
            if h.get("dtype") != _CODES[dtype] or tuple(h.get("shape", ())) != tuple(shape):
                raise CacheInvalid(f"{path}: tensor {name!r} is {h.get('dtype')} {h.get('shape')}, "
                                   f"expected {_CODES[dtype]} {list(shape)}")
            begin, stop = h.get("data_offsets", (0, -1))
            nbytes = dtype.itemsize * math.prod(shape)
            if stop - begin != nbytes or begin < 0 or name not in self._crcs:
                raise CacheInvalid(f"{path}: tensor {name!r} has a bad extent or no checksum")
            self._spans[name] = (self._base + begin, nbytes)
        ends = [h["data_offsets"][1] for h in header.values()
                if isinstance(h, dict) and isinstance(h.get("data_offsets"), list)]
        size = path.stat().st_size
        if size != self._base + max(ends, default=0):
            raise CacheInvalid(f"{path}: {size} bytes, the header describes "
                               f"{self._base + max(ends, default=0)}: truncated or overwritten")
        self.expected = expected
        self._fd = os.open(path, os.O_RDONLY)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> CacheReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, name: str, reuse: bool = False) -> torch.Tensor:
        """Tensor ``name`` read into own memory, its CRC checked; ``reuse``: into this thread's
        :func:`scratch` buffer (valid until the thread's next ``reuse`` read)."""
        dtype, shape = self.expected[name]
        offset, nbytes = self._spans[name]
        t, crc = read_into(self._fd, offset, nbytes, dtype, shape,
                           out=scratch(nbytes) if reuse else None)
        self.check(name, crc)
        return t

    def check(self, name: str, crc: int) -> None:
        """Raise :class:`CacheInvalid` unless ``crc`` is tensor ``name``'s CRC."""
        if crc != self._crcs[name]:
            raise CacheInvalid(f"{self.path}: tensor {name!r} fails its checksum (corrupt)")

    def verify(self, name: str) -> None:
        """Check tensor ``name``'s CRC by reading it a piece at a time (nothing kept)."""
        dtype, _ = self.expected[name]
        offset, nbytes = self._spans[name]
        crc, done = 0, 0
        buf = torch.empty(min(_CHUNK, nbytes), dtype=torch.uint8)
        while done < nbytes:
            n = min(_CHUNK, nbytes - done)
            _, crc = read_into(self._fd, offset + done, n, torch.uint8, (n,), crc, out=buf[:n])
            done += n
        self.check(name, crc)

    def embedding(self, name: str) -> FileEmbedding:
        """Tensor ``name`` (a table) as a :class:`FileEmbedding` over this file."""
        return FileEmbedding(self.path, self._spans[name][0], self.mapped(name))

    def mapped(self, name: str) -> torch.Tensor:
        """Tensor ``name`` as a view of a private (copy-on-write) memory map of the file: its
        pages are read, and count as resident, only where touched."""
        dtype, shape = self.expected[name]
        offset, nbytes = self._spans[name]
        whole = torch.from_file(str(self.path), shared=False, size=offset + nbytes, dtype=torch.uint8)
        return whole[offset:offset + nbytes].view(dtype).view(shape)


class FileEmbedding(nn.Module):
    """``nn.Embedding``'s lookup of a table kept in a cache file: each distinct id's row is
    read from the file (``pread``) into the result, so the table costs no resident memory.
    A memory map would: the kernel maps the file around every faulted row (large folios), and
    300 random ids made 136 MB of the 272 MB table resident on the test machine. A lookup of
    a 2K-token canvas is a few ms of reads against a step of seconds. ``weight`` is the table
    as a map of the file (counted by ``parameters()``, never read by a lookup; the lookup falls
    back to it when the file can no longer be opened)."""

    def __init__(self, path: Path, offset: int, weight: torch.Tensor) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.path, self.offset = str(path), offset
        self.row_bytes = self.embedding_dim * weight.dtype.itemsize

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        if flat.numel() == 0:
            return F.embedding(ids, self.weight)
        uniq, inverse = torch.unique(flat, return_inverse=True)
        if int(uniq[0]) < 0 or int(uniq[-1]) >= self.num_embeddings:
            raise IndexError("index out of range in self")
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:  # the file is gone: the map still holds its pages
            return F.embedding(ids, self.weight)
        try:
            rows = torch.empty(len(uniq), self.embedding_dim, dtype=self.weight.dtype)
            raw = rows.view(torch.uint8).numpy()
            for i, tok in enumerate(uniq.tolist()):
                if os.preadv(fd, [raw[i]], self.offset + tok * self.row_bytes) != self.row_bytes:
                    return F.embedding(ids, self.weight)
        finally:
            os.close(fd)
        return rows[inverse].view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, rows read from {self.path}"


class CacheWriter:
    """Writes a cache file tensor by tensor, in the order of ``layout`` (name -> (dtype,
    shape)), to a temporary file renamed into place by :meth:`finish`; a tensor may come in
    several row pieces (:meth:`write` appends). Any OS error is the caller's to log: the
    load goes on without a cache."""

    def __init__(self, path: Path, key: dict[str, str],
                 layout: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> None:
        self.path = path
        self.key = key
        self.layout = layout
        header: dict[str, Any] = {}
        off = 0
        for name, (dtype, shape) in layout.items():
            n = dtype.itemsize * math.prod(shape)
            header[name] = {"dtype": _CODES[dtype], "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
        self._header = header
        self._sizes = {name: h["data_offsets"][1] - h["data_offsets"][0] for name, h in header.items()}
        self._crcs = {name: 0 for name in layout}
        self._written = {name: 0 for name in layout}
        self._order = list(layout)
        self._pos = 0  # index in _order of the tensor being written
        self.failed: BaseException | None = None  # the OS error that stopped the writing
        path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self._f = open(self._tmp, "wb")  # noqa: SIM115 (open until finish / abort)
        try:
            self._hlen = len(self._encode_header())
            self._f.write(struct.pack("<Q", self._hlen))
            self._f.write(self._encode_header())
        except BaseException:
            self.abort()
            raise

    def _encode_header(self) -> bytes:
        crc = json.dumps({k: f"{v:08x}" for k, v in self._crcs.items()}, sort_keys=True)
        h = {"__metadata__": {"format": FORMAT, "key": json.dumps(self.key, sort_keys=True), "crc": crc},
             **self._header}
        raw = json.dumps(h, separators=(",", ":")).encode()
        return raw + b" " * (-len(raw) % 8)  # data 8-byte aligned (the header is fixed-length)

    def write(self, name: str, t: torch.Tensor) -> None:
        """Append ``t`` (the next rows of tensor ``name``, in layout order). An OS error (a
        full disk) stops the writing for good: logged once, the temporary file dropped, later
        calls do nothing and :meth:`finish` raises it."""
        if self.failed is not None:
            return
        try:
            self._write(name, t)
        except OSError as e:
            self.failed = e
            log.warning("int8 weights cache not written (%s): %s", self.path, e)
            self.abort()

    def _write(self, name: str, t: torch.Tensor) -> None:
        if self._order[self._pos] != name:
            if self._written[self._order[self._pos]] != self._sizes[self._order[self._pos]]:
                raise ValueError(f"cache writer: {self._order[self._pos]!r} incomplete before {name!r}")
            self._pos += 1
            if self._order[self._pos] != name:
                raise ValueError(f"cache writer: {name!r} out of order")
        dtype, _ = self.layout[name]
        mv = memoryview(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
        if t.dtype != dtype or self._written[name] + len(mv) > self._sizes[name]:
            raise ValueError(f"cache writer: tensor {name!r} too long or of another dtype")
        self._f.write(mv)
        self._crcs[name] = zlib.crc32(mv, self._crcs[name])
        self._written[name] += len(mv)

    def finish(self) -> None:
        """Checksums into the header, the file into place, the folder's older files removed."""
        if self.failed is not None:
            raise self.failed
        try:
            short = [n for n in self._order if self._written[n] != self._sizes[n]]
            if short:
                raise ValueError(f"cache writer: tensors not written: {', '.join(short[:3])}")
            header = self._encode_header()
            if len(header) != self._hlen:
                raise ValueError("cache writer: header changed length")
            self._f.seek(8)
            self._f.write(header)
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        stem = self.path.name.split("-")[0]
        for old in self.path.parent.glob(f"{stem}-*.safetensors"):
            if old != self.path:
                with contextlib.suppress(OSError):
                    old.unlink()

    def abort(self) -> None:
        """Drop the temporary file (nothing replaces the cache file)."""
        with contextlib.suppress(OSError):
            self._f.close()
        with contextlib.suppress(OSError):
            self._tmp.unlink()
