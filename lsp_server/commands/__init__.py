"""The server side's ``diffill`` subcommands: ``complete``, ``serve``, ``serve-http``,
``info`` (one module each: ``add_parser`` + ``run``, dispatched by :mod:`diffill.cli`).

Shared here (torch-free, also used by the evaluation side's commands): the ``--threads``
option of the commands that run the model; the decision itself is
:mod:`diffill.model.runtime`'s."""

from __future__ import annotations

import argparse
import os

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


def configure_threads(args: argparse.Namespace, device: object) -> None:
    """For commands that run the model on this thread right away."""
    from ...model.runtime import configure_cpu_threads  # torch: not for serve's `initialize`

    configure_cpu_threads(getattr(args, "threads", None), device)
