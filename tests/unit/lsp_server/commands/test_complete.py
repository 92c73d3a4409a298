"""``diffill complete``: 1-based positions, clear input errors, a real run on a checkpoint."""

from __future__ import annotations

import json

import pytest
from diffill.cli import main as cli_main
from diffill.lsp_server.commands.complete import InputError, position_offset


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
    assert rc == 1 and "cannot load model" in err


def test_complete_json_on_a_checkpoint(tmp_path, capsys, model_dir):
    src = tmp_path / "a.py"
    src.write_text("def add(a, b):\n    return \n\nprint(add(1, 2))\n")
    rc, out, err = run_cli(capsys, str(src), "--line", "2", "--col", "12", "--model", str(model_dir),
                           "--steps", "2", "--max-tokens", "8", "--n", "2", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["line"] == 2 and data["col"] == 12 and data["offset"] == len("def add(a, b):\n    return ")
    assert data["prefix_tokens"] > 0 and data["suffix_tokens"] > 0
    assert len(data["suggestions"]) <= 2
    for s in data["suggestions"]:
        assert s["text"].strip() and s["text"] == s["text"].rstrip()  # post-processed
    assert data["model"]["family"]


def test_complete_plain_output(tmp_path, capsys, model_dir):
    src = tmp_path / "a.py"
    src.write_text("x = [1, 2, \n")
    rc, out, err = run_cli(capsys, str(src), "--line", "1", "--col", "12", "--model", str(model_dir),
                           "--steps", "2", "--max-tokens", "4")
    assert rc == 0, err
    assert out or "no suggestion" in err
