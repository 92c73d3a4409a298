"""The one place that decides how many CPU threads torch uses.

torch's default (one OpenMP thread per physical core) spin-waits between the small
kernels of a diffusion step: on a busy 2-core machine a micro-model completion took
~1.3 s instead of ~15 ms with 2 threads. diffill therefore uses
``max(1, min(4, cpu_count // 2))`` intra-op threads on CPU unless told otherwise.

Precedence, highest first:

1. an explicit ``configure_cpu_threads(n)`` (the CLI's ``--threads N``);
2. the environment variable ``DIFFILL_THREADS=N`` (set by ``--threads`` for commands
   whose model is loaded later, on another thread; also usable from an editor's
   server environment);
3. ``OMP_NUM_THREADS`` set by the user: torch read it at start-up, it is kept;
4. the default above.

:func:`~diffill.model.loader.load_model` (on CPU, before it copies the weights) and
:class:`~diffill.model.engine.Engine` (when built) call :func:`ensure_cpu_threads`: it
applies 2--4 only if nothing was configured yet, and then never raises the thread
count above what the process already uses (a test or host program that lowered it
keeps its value). On CUDA the CPU thread count hardly matters and nothing is changed.
"""

from __future__ import annotations

import os
import threading

import torch

ENV_VAR = "DIFFILL_THREADS"
MAX_DEFAULT_THREADS = 4

_lock = threading.Lock()
_configured: int | None = None
"""Threads set by :func:`configure_cpu_threads` (None: not configured yet)."""


def default_cpu_threads(cpu_count: int | None) -> int:
    """``max(1, min(4, cpu_count // 2))``; ``cpu_count`` None (unknown) gives 1."""
    return max(1, min(MAX_DEFAULT_THREADS, (cpu_count or 1) // 2))


def _is_cuda(device: object) -> bool:
    if device is None:
        return False
    return str(device).split(":")[0] == "cuda"


def resolve_cpu_threads(threads: int | None, *, cpu_count: int | None,
                        env: dict[str, str] | None = None) -> int | None:
    """The thread count to set (None: keep torch's): ``threads`` if given, else
    ``DIFFILL_THREADS``, else None when ``OMP_NUM_THREADS`` is set, else the default.
    ``env`` defaults to ``os.environ``."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        return threads
    env = os.environ if env is None else env
    raw = env.get(ENV_VAR, "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{ENV_VAR}={raw!r}: expected a positive integer")
        return n
    if env.get("OMP_NUM_THREADS", "").strip():
        return None
    return default_cpu_threads(cpu_count)


def configure_cpu_threads(threads: int | None = None, device: object = None) -> int | None:
    """Set torch's intra-op CPU threads (see the module doc for the precedence) and
    remember that they are configured. ``device`` a CUDA device: nothing changes.
    Returns the thread count set, or None when nothing was set."""
    global _configured
    if _is_cuda(device):
        return None
    n = resolve_cpu_threads(threads, cpu_count=os.cpu_count())
    with _lock:
        if n is not None:
            torch.set_num_threads(n)
        _configured = torch.get_num_threads()
    return n


def ensure_cpu_threads(device: object = None) -> int | None:
    """What :class:`Engine` calls: configure only if nothing did yet, never raising the
    count above the current one unless ``DIFFILL_THREADS`` asks for it. Returns the
    thread count set, or None."""
    global _configured
    if _configured is not None or _is_cuda(device):
        return None
    n = resolve_cpu_threads(None, cpu_count=os.cpu_count())
    with _lock:
        if _configured is not None:
            return None
        if n is not None and not os.environ.get(ENV_VAR, "").strip():
            n = min(n, torch.get_num_threads())
        if n is not None:
            torch.set_num_threads(n)
        _configured = torch.get_num_threads()
    return n


def resolve_device(name: str | torch.device) -> torch.device:
    """The one "auto" device rule: ``auto`` is CUDA when available, else the CPU; any other
    name is torch's (``cpu``, ``cuda``, ``cuda:1``, ...)."""
    if str(name) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def configured_cpu_threads() -> int | None:
    """The thread count configured so far (None: not configured)."""
    return _configured


__all__ = [
    "ENV_VAR",
    "configure_cpu_threads",
    "configured_cpu_threads",
    "default_cpu_threads",
    "ensure_cpu_threads",
    "resolve_cpu_threads",
    "resolve_device",
]
