"""The ``diffill`` command line.

Each subcommand lives in its own module, on the side of the repository that owns it
(``diffill.lsp_server.commands``: complete, serve, serve-http, info, pull;
``diffill.evaluation.commands``: eval, bench; ``diffill.training.commands``: train,
corpus), exposing ``add_parser(subparsers)`` (which returns the parser) and
``run(args) -> int``. A subcommand appears only when its module exists, so
entry points that later work fills in are absent rather than stubs.

Only the chosen command's module is imported: the others are listed in
``diffill --help`` from the static :data:`COMMANDS` table (name, aliases, one-line
help), so ``diffill serve`` answers ``initialize`` without paying for torch or the
imports of commands it does not run. ``tests/unit/test_cli.py`` checks the table
against the modules' own ``add_parser``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from typing import NamedTuple

from . import __version__


class Command(NamedTuple):
    module: str
    """Full module name (``diffill.<side>.commands.<name>``)."""
    name: str
    """Name on the command line."""
    aliases: tuple[str, ...]
    help: str
    """The one-line help ``add_parser`` gives (shown by ``diffill --help``)."""


# Order shown in --help.
COMMANDS: tuple[Command, ...] = (
    Command("diffill.lsp_server.commands.complete", "complete", (),
            "fill the hole at FILE:LINE:COL and print the suggestion"),
    Command("diffill.lsp_server.commands.serve", "serve", (),
            "run the language server (stdio, or --tcp HOST:PORT)"),
    Command("diffill.lsp_server.commands.serve_http", "serve-http", ("serve_http",),
            "serve the model as an OpenAI-compatible /v1/completions API"),
    Command("diffill.lsp_server.commands.info", "info", (), "load a model and describe it"),
    Command("diffill.evaluation.commands.eval", "eval", (),
            "evaluate a model: HumanEval infilling pass@1, held-out exact match, baseline, frontier"),
    Command("diffill.evaluation.commands.bench", "bench", (),
            "measure infill latency (p50/p95, tokens/s) against autoregressive decoding"),
    Command("diffill.training.commands.train", "train", (),
            "train diffill's own masked-diffusion model on a pre-tokenised corpus"),
    Command("diffill.training.commands.corpus", "corpus", (),
            "build the permissively licensed Python corpus"),
    Command("diffill.lsp_server.commands.pull", "pull", (),
            "download a published checkpoint (the only command that goes online)"),
)

COMMAND_PACKAGES = ("diffill.lsp_server.commands", "diffill.evaluation.commands",
                    "diffill.training.commands")
"""The packages that hold command modules (every module in them is a command)."""


def _available() -> list[Command]:
    """The commands whose module exists (found without importing it)."""
    return [c for c in COMMANDS if importlib.util.find_spec(c.module) is not None]


def _chosen(argv: list[str], commands: list[Command]) -> Command | None:
    """The command named by the first non-option argument (the top-level parser takes
    no option with a value), or None."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return next((c for c in commands if arg == c.name or arg in c.aliases), None)
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: the command it names gets its module's full parser, the
    others a placeholder with their help line (``argv`` None: every command imported,
    as tests and documentation tools want)."""
    parser = argparse.ArgumentParser(
        prog="diffill",
        description="Fill-in-the-middle code completion from a masked-diffusion language model.",
    )
    parser.add_argument("--version", action="version", version=f"diffill {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = _available()
    chosen = _chosen(argv, commands) if argv is not None else None
    for cmd in commands:
        if argv is None or cmd is chosen:
            module = importlib.import_module(cmd.module)
            p = module.add_parser(sub)
            p.set_defaults(_run=module.run)
        else:
            sub.add_parser(cmd.name, aliases=list(cmd.aliases), help=cmd.help)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
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
