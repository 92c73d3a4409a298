"""The ``diffill`` command line (src_diffill/cli.py): the static command table matches
the command modules, and only the chosen command's module is imported."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest
from diffill import cli


def _registered(module_name: str) -> tuple[str, tuple[str, ...], str]:
    """(name, aliases, help) that a command module's own add_parser registers."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    module = importlib.import_module(module_name)
    p = module.add_parser(sub)
    [action] = sub._choices_actions
    names = [k for k, v in sub.choices.items() if v is p]
    return action.dest, tuple(n for n in names if n != action.dest), action.help


@pytest.mark.parametrize("cmd", cli._available(), ids=lambda c: c.name)
def test_table_matches_the_modules_add_parser(cmd: cli.Command):
    assert _registered(cmd.module) == (cmd.name, cmd.aliases, cmd.help)


def test_every_command_module_is_in_the_table():
    from pathlib import Path

    modules = set()
    for name in cli.COMMAND_PACKAGES:
        pkg = importlib.import_module(name)
        modules |= {f"{name}.{p.stem}" for p in Path(pkg.__file__).parent.glob("*.py")
                    if p.stem != "__init__"}
    assert modules == {c.module for c in cli._available()} == {c.module for c in cli.COMMANDS}


def test_only_the_chosen_command_is_imported():
    code = (
        "import sys\n"
        "from diffill.cli import build_parser\n"
        "p = build_parser(['serve', '--tcp', '127.0.0.1:1'])\n"
        "a = p.parse_args(['serve', '--tcp', '127.0.0.1:1'])\n"
        "mods = sorted(m for m in sys.modules if '.commands.' in m)\n"
        "print(a._run.__module__, mods, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["diffill.lsp_server.commands.serve",
                                  "['diffill.lsp_server.commands.serve']", "False"]


def test_help_lists_every_command_without_importing_them():
    code = (
        "import sys\n"
        "from diffill.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('IMPORTED', [m for m in sys.modules if '.commands.' in m],"
        " 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    help_text, imported = out.stdout.split("IMPORTED")
    assert imported.split() == ["[]", "False"]
    for cmd in cli._available():
        assert cmd.name in help_text


def test_alias_and_unknown_command():
    for name in ("serve_http", "serve-http"):  # the alias selects the module too
        args = cli.build_parser([name]).parse_args([name])
        assert args._run.__module__ == "diffill.lsp_server.commands.serve_http"
    with pytest.raises(SystemExit) as e:
        cli.main(["no-such-command"])
    assert e.value.code == 2
