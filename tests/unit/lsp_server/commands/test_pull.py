"""``diffill pull`` end to end: the real huggingface_hub client against a fake hub on
127.0.0.1 (HF_ENDPOINT) serving tiny checkpoints; then ``--model NAME`` offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import tiny_config, write_diffill_checkpoint
from support.fake_hub import FakeHub

pytest.importorskip("huggingface_hub")

REPO = "fredzzp/open-dcoder-0.5B"  # what the short name open-dcoder-0.5b stands for


def _files(tmp: Path) -> dict[str, bytes]:
    folder = tmp / "src"
    # ~25 MB of weights: more than huggingface_hub's 10 MiB download chunk, so a dropped
    # connection is resumed from the last whole chunk (a Range request), not from byte 0
    write_diffill_checkpoint(folder, tiny_config(vocab_size=64, hidden_size=64,
                                                 intermediate_size=16384))
    out = {p.name: p.read_bytes() for p in folder.iterdir()}
    out["README.md"] = b"# tiny\n"
    out["modeling_x.py"] = b"raise SystemExit('remote code must not be fetched')\n"
    out["pytorch_model.bin"] = b"\0" * 10  # not fetched either
    return out


def _run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diffill.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.fixture()
def hub(tmp_path):
    with FakeHub() as h:
        h.add_repo(REPO, _files(tmp_path))
        env = {**os.environ, "HF_ENDPOINT": h.url, "HF_HOME": str(tmp_path / "hf"),
               "DIFFILL_HOME": str(tmp_path / "diffill"), "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_XET": "1",
               "HF_HUB_ETAG_TIMEOUT": "5", "HF_HUB_DOWNLOAD_TIMEOUT": "5"}
        env.pop("HF_HUB_OFFLINE", None)
        env.pop("HF_TOKEN", None)
        yield h, env, tmp_path


def _gets(h: FakeHub, name: str) -> list[str | None]:
    return [rng for m, p, rng in h.log if m == "GET" and p.endswith("/" + name)]


def test_pull_then_model_by_name_offline(hub):
    h, env, tmp = hub
    h.drop["model.safetensors"] = 1  # the connection drops once mid-file: resumed in the same run
    r = _run(env, "pull", "open-dcoder-0.5b")
    assert r.returncode == 0, r.stderr
    assert "--model open-dcoder-0.5b" in r.stdout and "GiB" in r.stdout
    got = _gets(h, "model.safetensors")
    assert got == [None, "bytes=10485760-"]  # resumed after the first 10 MiB chunk
    fetched = {p.rsplit("/", 1)[-1] for m, p, _ in h.log if m == "GET" and "/resolve/" in p}
    assert fetched == {"config.json", "tokenizer.json", "model.safetensors"}  # only what diffill reads
    reg = json.loads((tmp / "diffill" / "pulled.json").read_text())["entries"]
    assert reg[0]["repo_id"] == REPO and reg[0]["name"] == "open-dcoder-0.5b"
    # --model NAME resolves from the local registry: the hub is gone, nothing connects
    dead = {**env, "HF_ENDPOINT": "http://127.0.0.1:9"}
    for spec in ("open-dcoder-0.5b", REPO):
        r = _run(dead, "info", "--model", spec, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["model"]["path"] == reg[0]["path"]


def test_a_failed_download_is_never_picked_up(hub):
    h, env, tmp = hub
    h.drop["model.safetensors"] = 100  # every try is cut: the run gives up ...
    r = _run(env, "pull", REPO)
    assert r.returncode == 1 and "download failed" in r.stderr, r.stderr
    assert len(_gets(h, "model.safetensors")) == 6  # the client's own retries (5), resuming
    assert not (tmp / "diffill" / "pulled.json").exists()  # ... nothing is recorded ...
    r = _run(env, "info", "--model", REPO)
    assert r.returncode == 1 and "diffill pull" in r.stderr  # ... so --model cannot pick it up
    h.drop.clear()
    r = _run(env, "pull", REPO)  # the next run fetches what is missing and succeeds
    assert r.returncode == 0, r.stderr
    assert _run(env, "info", "--model", REPO).returncode == 0


def test_unknown_repo_missing_file_and_corrupt_header(hub):
    h, env, tmp = hub
    r = _run(env, "pull", "nobody/nothing")
    assert r.returncode == 1 and "repository not found" in r.stderr
    h.hidden.add("model.safetensors")  # listed, but the hub has lost it
    r = _run(env, "pull", REPO)
    assert r.returncode == 1 and "missing on the hub" in r.stderr, r.stderr
    h.hidden.clear()
    bad = dict(h.repos[REPO]["files"])
    bad["model.safetensors"] = b"\xff" * 64  # a header that is not safetensors
    h.add_repo("someone/corrupt", bad)
    r = _run(env, "pull", "someone/corrupt", "--dir", str(tmp / "out"))
    assert r.returncode == 1 and "does not load" in r.stderr and "safetensors" in r.stderr
    assert not (tmp / "out").exists() and not (tmp / "out.partial").exists()
    assert not (tmp / "diffill" / "pulled.json").exists()
    h.add_repo("someone/nocfg", {"model.safetensors": b"x"})
    r = _run(env, "pull", "someone/nocfg")
    assert r.returncode == 1 and "no config.json" in r.stderr


def test_pull_into_a_folder(hub):
    h, env, tmp = hub
    r = _run(env, "pull", REPO, "--dir", str(tmp / "ckpt"))
    assert r.returncode == 0, r.stderr
    assert f"--model {tmp / 'ckpt'}" in r.stdout
    assert (tmp / "ckpt" / "model.safetensors").is_file() and not (tmp / "ckpt.partial").exists()
    r = _run(env, "pull", REPO, "--dir", str(tmp / "ckpt"))
    assert r.returncode == 1 and "already exists" in r.stderr
