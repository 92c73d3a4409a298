"""``diffill info``: the report sections, text and JSON, errors."""

from __future__ import annotations

import json
import subprocess
import sys

from diffill.cli import main as cli_main
from support import write_diffill_checkpoint


def test_info_json(tiny_ckpt, capsys):
    rc = cli_main(["info", "--model", str(tiny_ckpt[0]), "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    m = report["model"]
    assert m["family"] == "diffill" and m["path"] == str(tiny_ckpt[0].resolve())
    assert m["architectures"] == ["DiffillForMaskedDiffusion"]
    assert m["parameters"] == sum(p.numel() for p in tiny_ckpt[1].parameters())
    assert (m["vocab_size"], m["layers"], m["heads"], m["kv_heads"]) == (64, 2, 4, 2)
    assert m["shift_logits"] is False
    assert report["runtime"] == {"device": "cpu", "dtype": "float32", "attention_backend": "sdpa"}
    assert report["special_tokens"]["mask"] == {"id": 3, "token": "<|mask|>"}
    assert report["special_tokens"]["bos"] == {"id": 0, "token": "<|bos|>"}
    assert report["provenance"] == {"corpus": "unit-test", "steps": 3}


def test_info_text_and_sections(tiny_ckpt, capsys, monkeypatch):
    from diffill.lsp_server.commands import info

    monkeypatch.setattr(
        info, "SECTIONS", [*info.SECTIONS, ("extra", lambda lm, args: {"answer": 42})]
    )
    assert cli_main(["info", "--model", str(tiny_ckpt[0])]) == 0
    out = capsys.readouterr().out
    for needle in (
        "[model]",
        "[runtime]",
        "[special_tokens]",
        "[provenance]",
        "[extra]",
        "answer",
        "<|mask|>",
        "sdpa",
    ):
        assert needle in out


def test_info_without_provenance_omits_section(tmp_path, capsys):
    write_diffill_checkpoint(tmp_path)
    assert cli_main(["info", "--model", str(tmp_path), "--json"]) == 0
    assert "provenance" not in json.loads(capsys.readouterr().out)


def test_info_bad_model(tmp_path, capsys):
    assert cli_main(["info", "--model", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert "diffill info:" in err and "no such folder" in err


def test_info_subprocess(tiny_ckpt):
    r = subprocess.run(
        [sys.executable, "-m", "diffill.cli", "info", "--model", str(tiny_ckpt[0]), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["family"] == "diffill"
