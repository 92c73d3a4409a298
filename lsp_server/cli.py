"""The ``diffill`` command line.

Each subcommand lives in its own module under ``diffill.lsp_server.commands``
exposing ``add_parser(subparsers)`` (which returns the parser) and
``run(args) -> int``. A subcommand appears only when its module exists, so
entry points that later work fills in are absent rather than stubs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from diffill import __version__

# Order shown in --help.
COMMANDS = ("complete", "serve", "serve_http", "info", "eval", "bench", "train", "corpus")


def _available() -> list[str]:
    out = []
    for name in COMMANDS:
        mod = f"diffill.lsp_server.commands.{name}"
        if importlib.util.find_spec(mod) is not None:
            out.append(name)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffill",
        description="Fill-in-the-middle code completion from a masked-diffusion language model.",
    )
    parser.add_argument("--version", action="version", version=f"diffill {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _available():
        module = importlib.import_module(f"diffill.lsp_server.commands.{name}")
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
