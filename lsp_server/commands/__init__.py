"""The server side's ``diffill`` subcommands: ``complete``, ``serve``, ``serve-http``,
``info`` (one module each: ``add_parser`` + ``run``, dispatched by :mod:`diffill.cli`).

Shared here (torch-free, also used by the evaluation side's commands): the ``--threads``
option of the commands that run the model; the decision itself is
:mod:`diffill.model.runtime`'s."""

from __future__ import annotations

import argparse
import os
import sys

from ...model.limits import RECIPE_NAMES

THREADS_HELP = (
    "torch CPU threads for the model (default: max(1, min(4, cores // 2)); torch's own "
    "default, one per core, spin-waits between the small kernels of a diffusion step and "
    "makes completions many times slower on a busy machine). Also DIFFILL_THREADS=N; "
    "a user-set OMP_NUM_THREADS is kept. Ignored on CUDA"
)


DEVICE_HELP = (
    "torch device: cpu (the default: diffill never picks a GPU by itself), cuda (the first "
    "GPU), cuda:1 (another), or auto (cuda when torch sees one, else cpu). A GPU needs a CUDA "
    "build of torch (README, 'Which torch'); `diffill info --device cuda` checks it"
)


def add_device_option(p: argparse.ArgumentParser, *, default: str | None = "cpu",
                      note: str = "") -> None:
    p.add_argument("--device", default=default, help=DEVICE_HELP + note)


RECIPE_HELP = (
    "family infilling recipe to use instead of the one chosen from the checkpoint "
    f"({', '.join(RECIPE_NAMES)}; "
    "`diffill info` shows the one chosen and why)"
)


def add_recipe_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", default=None, metavar="NAME", help=RECIPE_HELP)


def add_threads_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=None, metavar="N", help=THREADS_HELP)


def check_threads(args: argparse.Namespace) -> str | None:
    """An error message when ``--threads`` is invalid, else None."""
    n = getattr(args, "threads", None)
    if n is not None and n < 1:
        return f"--threads must be >= 1, got {n}"
    return None


def threads_to_env(args: argparse.Namespace) -> None:
    """For commands whose model loads later on another thread (serve, serve-http):
    pass ``--threads`` on as ``DIFFILL_THREADS``, which the engine applies when it is
    built (importing torch here would delay the server's first answer)."""
    n = getattr(args, "threads", None)
    if n is not None:
        os.environ["DIFFILL_THREADS"] = str(n)


M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def one_malloc_arena() -> bool:
    """Make glibc's malloc keep one arena for every thread of this process (``mallopt
    M_ARENA_MAX 1``), before the server starts its threads; a no-op when the user set
    ``MALLOC_ARENA_MAX`` (glibc applied it already) or the C library is not glibc.

    Why: the model runs on a worker thread and the step plan on another; with an arena per
    thread, memory one thread freed (a long context's activations) stays resident in its
    arena while the other allocates afresh. ``diffill serve`` on the Open-dCoder-0.5B shape
    peaked at 1,279-1,306 MB after the background plan with glibc's default, 1,051-1,056 MB
    with one arena (``scripts/serve_ready.py --wait-plan``, twice each; BENCHMARKS.md)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    import ctypes  # only the commands that start a server need it

    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_ARENA_MAX, 1))
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to set
        return False


def server_process(args: argparse.Namespace, command: str) -> bool:
    """What ``serve`` and ``serve-http`` do before anything starts: check ``--threads`` (False
    after an error line naming ``command``), pass it on (:func:`threads_to_env`), keep one malloc
    arena (:func:`one_malloc_arena`) and never connect to a model hub (only ``pull`` does)."""
    err = check_threads(args)
    if err:
        print(f"diffill {command}: {err}", file=sys.stderr)
        return False
    threads_to_env(args)
    one_malloc_arena()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return True


def configure_threads(args: argparse.Namespace, device: object) -> None:
    """For commands that run the model on this thread right away."""
    from ...model.runtime import configure_cpu_threads  # torch: not for serve's `initialize`

    configure_cpu_threads(getattr(args, "threads", None), device)
