"""``diffill complete``: 1-based positions, clear input errors, a real run on a checkpoint,
the exit status (0 suggestion, 1 none, 2 usage, 3 load, 4 completion failed) and the latency
budget, the last two on checkpoints whose answer is certain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from diffill.cli import main as cli_main
from diffill.lsp_server.commands.complete import (
    EXIT_CODES,
    InputError,
    budget_note,
    position_offset,
)
from support import ROOT
from support.constant_checkpoint import PAD_ID, word_id, write_constant_checkpoint

W7_ID = word_id(7)


@pytest.fixture(scope="module")
def pad_model(tmp_path_factory) -> Path:
    """Writes only <|pad|>: the middle is always empty."""
    return write_constant_checkpoint(tmp_path_factory.mktemp("pad-model"), PAD_ID)


@pytest.fixture(scope="module")
def w7_model(tmp_path_factory) -> Path:
    """Writes only "w7": the middle is never empty."""
    return write_constant_checkpoint(tmp_path_factory.mktemp("w7-model"), W7_ID)


def test_positions_are_one_based():
    text = "ab\ncd\r\nef"
    assert position_offset(text, 1, 1) == 0
    assert position_offset(text, 1, 3) == 2  # end of line 1
    assert position_offset(text, 2, 2) == 4
    assert position_offset(text, 2, 3) == 5  # before "\r\n"
    assert position_offset(text, 3, 3) == len(text)
    assert position_offset("😀x", 1, 2) == 1  # columns count code points


@pytest.mark.parametrize(
    "line,col,msg",
    [(0, 1, "1-based"), (1, 0, "1-based"), (4, 1, "has 3 line"), (2, 4, "max col 3")],
)
def test_out_of_range_positions(line, col, msg):
    with pytest.raises(InputError, match=msg):
        position_offset("ab\ncd\nef", line, col)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli_main(["complete", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_missing_binary_and_huge_files(tmp_path, capsys):
    rc, _, err = run_cli(capsys, str(tmp_path / "nope.py"), "--line", "1", "--col", "1")
    assert rc == 2 and "no such file" in err
    binary = tmp_path / "b.bin"
    binary.write_bytes(b"\x7fELF\x00\x01\x02")
    rc, _, err = run_cli(capsys, str(binary), "--line", "1", "--col", "1")
    assert rc == 2 and "binary" in err
    latin = tmp_path / "l.py"
    latin.write_bytes(b"x = '\xe9'\n")
    rc, _, err = run_cli(capsys, str(latin), "--line", "1", "--col", "1")
    assert rc == 2 and "UTF-8" in err
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * 100_000)
    rc, _, err = run_cli(capsys, str(big), "--line", "1", "--col", "1", "--max-file-mb", "0.1")
    assert rc == 2 and "larger than" in err
    rc, _, err = run_cli(capsys, str(big), "--line", "100002", "--col", "1")
    assert rc == 2 and "--line 100002" in err


def test_bad_model_path_is_reported(tmp_path, capsys):
    src = tmp_path / "a.py"
    src.write_text("x = \n")
    rc, _, err = run_cli(capsys, str(src), "--line", "1", "--col", "5", "--model", str(tmp_path / "none"))
    assert rc == 3 and "cannot load model" in err


def test_complete_json_on_a_checkpoint(tmp_path, capsys, model_dir):
    """The scripted checkpoint (``model_dir``): "return" after add_numbers' body -> " total"."""
    src = tmp_path / "a.py"
    head = "def add_numbers(a, b):\n    total = a + b\n    return "
    src.write_text(head + "\n\nprint(add_numbers(1, 2))\n")
    rc, out, err = run_cli(capsys, str(src), "--line", "3", "--col", "12", "--model", str(model_dir),
                           "--steps", "2", "--max-tokens", "8", "--n", "2", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["line"] == 3 and data["col"] == 12 and data["offset"] == len(head)
    assert data["prefix_tokens"] > 0 and data["suffix_tokens"] > 0
    # both hole lengths (4 and 8) give the same middle: one suggestion
    assert [s["text"] for s in data["suggestions"]] == ["total"]
    assert data["model"]["family"]


def test_complete_plain_output(tmp_path, capsys, model_dir):
    src = tmp_path / "a.py"
    src.write_text("def add_numbers(a, b):\n    total = \n")
    rc, out, err = run_cli(capsys, str(src), "--line", "2", "--col", "13", "--model", str(model_dir),
                           "--steps", "2", "--max-tokens", "4")
    assert (rc, out) == (0, "a + b\n"), err
    src.write_text("x = [1, 2, \n")  # nothing in the script here
    rc, out, err = run_cli(capsys, str(src), "--line", "1", "--col", "12", "--model", str(model_dir),
                           "--steps", "2", "--max-tokens", "4")
    assert rc == 1 and out == "" and "no suggestion" in err, (rc, out, err)


# --------------------------------------------------------------------------- exit status


@pytest.fixture()
def words(tmp_path) -> Path:
    src = tmp_path / "words.txt"  # not Python: no syntax guard
    src.write_text("w1 w2 w3\nw4 \nw5 w6\n")
    return src


def test_exit_0_with_a_suggestion(capsys, words, w7_model):
    rc, out, err = run_cli(capsys, str(words), "--line", "2", "--col", "4", "--model", str(w7_model),
                           "--steps", "2", "--max-tokens", "4")
    assert rc == 0, err
    assert out.startswith("w7") and "no suggestion" not in err


@pytest.mark.parametrize("fmt", [[], ["--json"]])
def test_exit_1_when_nothing_to_suggest(capsys, words, pad_model, fmt):
    rc, out, err = run_cli(capsys, str(words), "--line", "2", "--col", "4", "--model", str(pad_model),
                           "--steps", "2", "--max-tokens", "4", *fmt)
    assert rc == 1
    assert "no suggestion" in err
    if fmt:
        data = json.loads(out)
        assert data["suggestions"] == [] and data["exit_status"] == 1
    else:
        assert out == ""


def test_exit_2_for_usage_and_bad_input(capsys, words, w7_model):
    with pytest.raises(SystemExit) as e:  # argparse: --line missing
        cli_main(["complete", str(words), "--col", "1"])
    assert e.value.code == 2
    rc, _, err = run_cli(capsys, str(words), "--line", "9", "--col", "1", "--model", str(w7_model))
    assert rc == 2 and "--line 9" in err
    rc, _, err = run_cli(capsys, str(words), "--line", "1", "--col", "1", "--model", str(w7_model),
                         "--latency-budget-ms", "0")
    # the flag and its value are named, as typed; nothing about what an editor would keep
    assert rc == 2 and "--latency-budget-ms 0.0: expected" in err and "kept" not in err, err
    rc, _, err = run_cli(capsys, str(words), "--line", "1", "--col", "1", "--model", str(w7_model),
                         "--steps", "0")
    assert (rc, err.strip()) == (2, "diffill complete: --steps 0: expected `int` >= 1")


def test_standard_input_gets_the_syntax_guard(capsys, w7_model, monkeypatch):
    """``diffill complete -`` used to run with the guard off: "w7" after ``return 1`` (which
    makes ``1w7``, a syntax error) was printed. Standard input is Python unless --language
    says otherwise."""
    import io
    import sys

    def stdin() -> None:
        data = b"def f():\n    return 1\n"
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))

    args = ("-", "--line", "2", "--col", "13", "--model", str(w7_model), "--steps", "2",
            "--max-tokens", "4")
    stdin()
    rc, out, err = run_cli(capsys, *args)
    assert (rc, out) == (1, ""), err
    stdin()
    rc, out, err = run_cli(capsys, *args, "--language", "plaintext")
    assert rc == 0 and out.startswith("w7"), err


def test_exit_4_when_the_model_fails(capsys, words, w7_model, monkeypatch):
    monkeypatch.setenv("DIFFILL_DEBUG_FAULT", "RuntimeError:5")
    rc, out, err = run_cli(capsys, str(words), "--line", "2", "--col", "4", "--model", str(w7_model),
                           "--steps", "2", "--max-tokens", "4")
    assert rc == 4 and out == ""
    assert "completion failed: RuntimeError: injected fault" in err


def test_exit_codes_are_documented(capsys):
    with pytest.raises(SystemExit):
        cli_main(["complete", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for code, meaning in EXIT_CODES.items():
        assert f"{code} {' '.join(meaning.split()[:3])}" in help_text
    readme = (ROOT / "README.md").read_text()
    assert "exit status" in readme and "1 when there is nothing to suggest" in readme


# --------------------------------------------------------------------------- latency budget


def test_budgeted_run_reports_its_budget(capsys, words, w7_model):
    rc, out, err = run_cli(capsys, str(words), "--line", "2", "--col", "4", "--model", str(w7_model),
                           "--max-tokens", "4", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["latency_budget_ms"] == 200.0  # the CPU default
    assert data["warmup_ms"] > 0 and data["steps"] >= 1 and data["model_calls"] >= 1
    assert data["import_s"] >= 0 and data["load_s"] > 0
    assert data["over_budget"] == (data["complete_ms"] > 200.0)
    assert (data["budget_note"] is None) == (not data["over_budget"])


def test_a_budget_no_step_fits_is_explained(capsys, words, w7_model):
    rc, out, err = run_cli(capsys, str(words), "--line", "2", "--col", "4", "--model", str(w7_model),
                           "--max-tokens", "4", "--latency-budget-ms", "0.001", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["steps"] == 1 and data["over_budget"] is True  # one step is the least
    assert "one step" in data["budget_note"] and "0.001 ms latency budget" in data["budget_note"]
    assert f"diffill complete: {data['budget_note']}" in err


def test_fixed_steps_have_no_warm_up_and_no_note(capsys, words, w7_model):
    rc, out, err = run_cli(capsys, str(words), "--line", "2", "--col", "4", "--model", str(w7_model),
                           "--max-tokens", "4", "--steps", "3", "--latency-budget-ms", "0.001",
                           "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["warmup_ms"] is None and data["steps"] == 3 and data["budget_note"] is None
    assert err == ""


def test_budget_note_says_why():
    note = budget_note(450.0, 200.0, calls=2, warmup_ms=80.0, max_steps=16)
    assert note.startswith("the completion took 450 ms, over the 200 ms latency budget")
    assert "2 model calls" in note and "about 2 step(s) fit" in note
    note = budget_note(450.0, 200.0, calls=1, warmup_ms=300.0, max_steps=16)
    assert "model calls" not in note and "one step of this request already takes longer" in note


def test_the_gc_freeze_at_exit_is_only_for_the_program():
    """`diffill complete` speeds its own exit up (atexit gc.freeze), never a host process's."""
    import subprocess
    import sys

    from diffill.lsp_server.commands.complete import _diffill_is_the_program

    assert not _diffill_is_the_program()  # pytest is the program here
    probe = "from diffill.lsp_server.commands.complete import _diffill_is_the_program as f\n"
    like_console_script = "from diffill.cli import main\n" + probe + "print(f())"
    host = probe + "print(f())"
    for code, want in ((like_console_script, "True"), (host, "False")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == want, out.stderr
