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


FOREIGN = {
    "command": "/work/venv/bin/diffill train --data /work/data/tokens --out=/home/alice/runs/v4"
    " --init-from model/default_model --note https://example.org/a/b",
    "init_from": {"checkpoint": "/root/runs/ar/checkpoints/step-0002103",
                  "init_from": {"checkpoint": "/work/main/model/default_model"}},
    "inputs": ["/srv/corpus/manifest.json", "relative/path.txt", "/home/me/models/x"],
}


def test_info_provenance_hides_the_training_machines_paths(tmp_path, capsys, monkeypatch):
    """Provenance is written where the model was trained; ``diffill info`` shows its paths
    shortened (text and JSON), and leaves the checkpoint's own record as it is."""
    monkeypatch.setenv("HOME", "/home/me")
    folder = tmp_path / "ckpt"
    write_diffill_checkpoint(folder, provenance=FOREIGN)
    on_disk = (folder / "config.json").read_text()
    for args in (["--json"], []):
        assert cli_main(["info", "--model", str(folder), *args]) == 0
        out = capsys.readouterr().out
        prov = json.loads(out)["provenance"] if args else out.split("[provenance]", 1)[1]
        text = json.dumps(prov) if args else prov
        for foreign in ("/work/", "/home/", "/root/", "/srv/"):
            assert foreign not in text, (foreign, text)
        for kept in (".../bin/diffill train", ".../data/tokens", "--out=.../runs/v4",
                     ".../checkpoints/step-0002103", ".../model/default_model",
                     "model/default_model", "https://example.org/a/b", "relative/path.txt",
                     "~/models/x"):
            assert kept in text, (kept, text)
    assert (folder / "config.json").read_text() == on_disk


def test_anonymise_paths_rules():
    from diffill.lsp_server.commands.info import anonymise_paths

    home = "/home/me"
    assert anonymise_paths("/home/me/models/x", home) == "~/models/x"
    assert anonymise_paths("/home/meg/models/x", home) == ".../models/x"
    assert anonymise_paths("/opt", home) == "opt"
    assert anonymise_paths("a/b ./c ~/d http://h/p 1.2e-3", home) == "a/b ./c ~/d http://h/p 1.2e-3"
    assert anonymise_paths({"k": [3, None, "--x=/a/b/c"]}, home) == {"k": [3, None, "--x=.../b/c"]}
    once = anonymise_paths("/a/b/c d", home)
    assert anonymise_paths(once, home) == once == ".../b/c d"


def test_shipped_model_info_names_no_other_machine(capsys):
    """The shipped checkpoint was trained elsewhere: nothing in ``diffill info`` but the
    local model folder itself is an absolute path."""
    assert cli_main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    local = report["model"].pop("path")
    rest = json.dumps(report)
    for foreign in ("/work/", "/home/", "/root/"):
        assert foreign not in rest.replace(local, "<model>"), foreign
