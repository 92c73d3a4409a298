"""``diffill pull`` end to end: the real huggingface_hub client against a fake hub on
127.0.0.1 (HF_ENDPOINT) serving tiny checkpoints; then ``--model NAME`` offline. Also a
hub that accepts connections and never answers, or stalls mid-file: every wait is bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import tiny_config, write_diffill_checkpoint
from support.fake_hub import FakeHub

pytest.importorskip("huggingface_hub")

REPO = "fredzzp/open-dcoder-0.5B"  # what the short name open-dcoder-0.5b stands for


def _files(tmp: Path) -> dict[str, bytes]:
    folder = tmp / "src"
    # ~25 MB of weights: a dropped connection is resumed from the bytes on disk (a Range
    # request), not from byte 0
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


def _timed(env: dict[str, str], *argv: str, limit: float = 120):
    """Run diffill; returns (exit code, stdout, [(seconds before the exit, stderr line)])."""
    p = subprocess.Popen([sys.executable, "-m", "diffill.cli", *argv], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out: list[str] = []
    err: list[tuple[float, str]] = []
    pumps = [threading.Thread(target=lambda: out.extend(p.stdout)),
             threading.Thread(target=lambda: err.extend((time.monotonic(), ln) for ln in p.stderr))]
    for t in pumps:
        t.start()
    try:
        code = p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise AssertionError(f"diffill {' '.join(argv)} still running after {limit} s") from None
    end = time.monotonic()
    for t in pumps:
        t.join()
    return code, "".join(out), [(end - t, ln.rstrip("\n")) for t, ln in err]


def _waited(err: list[tuple[float, str]], start: str) -> float:
    """Seconds from the stderr line containing ``start`` (the last one) to the last line
    (the error): the wait itself, without the interpreter's exit (slow on a busy machine)."""
    hits = [left for left, ln in err if start in ln]
    assert hits, [ln for _, ln in err]
    return hits[-1] - err[-1][0]


def test_pull_then_model_by_name_offline(hub):
    h, env, tmp = hub
    h.drop["model.safetensors"] = 1  # the connection drops once mid-file: resumed in the same run
    cache = tmp / "int8"  # the CPU weights, prepared after the download (forced int8: tiny model)
    r = _run({**env, "DIFFILL_WEIGHTS": "int8", "DIFFILL_INT8_CACHE": str(cache)},
             "pull", "open-dcoder-0.5b")
    assert r.returncode == 0, r.stderr
    assert "--model open-dcoder-0.5b" in r.stdout and "GiB" in r.stdout
    assert "int8 weights prepared and cached" in r.stdout and len(list(cache.iterdir())) == 1
    got = _gets(h, "model.safetensors")
    half = len(h.repos[REPO]["files"]["model.safetensors"]) // 2
    assert got == [None, f"bytes={half}-"]  # resumed from the bytes received, none sent twice
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
    size = len(h.repos[REPO]["files"]["model.safetensors"])
    before = h.sent["model.safetensors"]
    assert 0 < before < size
    r = _run(env, "pull", REPO)  # the next run fetches what is missing and succeeds ...
    assert r.returncode == 0, r.stderr
    assert "continuing model.safetensors at" in r.stderr
    # ... continuing from the bytes the first run left on disk: only the rest is sent
    assert _gets(h, "model.safetensors")[-1] == f"bytes={before}-"
    assert h.sent["model.safetensors"] - before == size - before
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
    cache = tmp / "int8"
    r = _run({**env, "DIFFILL_WEIGHTS": "int8", "DIFFILL_INT8_CACHE": str(cache)},
             "pull", REPO, "--dir", str(tmp / "ckpt"), "--no-prepare")
    assert r.returncode == 0, r.stderr
    assert f"--model {tmp / 'ckpt'}" in r.stdout
    assert "prepared" not in r.stdout and not cache.exists()  # --no-prepare
    assert (tmp / "ckpt" / "model.safetensors").is_file() and not (tmp / "ckpt.partial").exists()
    r = _run(env, "pull", REPO, "--dir", str(tmp / "ckpt"))
    assert r.returncode == 1 and "already exists" in r.stderr


def test_a_hub_that_never_answers_is_given_up_within_the_timeout(hub):
    h, env, tmp = hub
    h.stall.add("api")  # accepts the connection, never answers (a captive proxy)
    code, out, err = _timed({**env, "HF_HUB_ETAG_TIMEOUT": "2"}, "pull", "open-dcoder-0.5b",
                            limit=40)
    assert code == 1, err
    waited = _waited(err, f"asking {h.url} for {REPO}@main")
    assert 1.5 < waited < 2 + 2.5, err  # the timeout and a margin (a busy machine's)
    last = err[-1][1]
    assert last.startswith("diffill pull: ") and h.url in last and "did not answer" in last
    assert "2 s" in last and "--timeout" in last and "HF_HUB_ETAG_TIMEOUT" in last, last
    h.stall = {"head"}  # the metadata of each file: the same bound, here from --timeout
    code, out, err = _timed(env, "pull", REPO, "--timeout", "1", limit=40)
    assert code == 1, err
    assert 0.5 < _waited(err, "fetching config.json") < 1 + 2.5, err
    assert "did not answer" in err[-1][1] and "config.json" in err[-1][1], err
    assert not (tmp / "diffill" / "pulled.json").exists()


def test_a_download_that_stalls_mid_file_is_given_up_and_continued_next_run(hub):
    h, env, tmp = hub
    h.stall_body["model.safetensors"] = 3_000_000  # headers, 3 MB, then silence
    code, out, err = _timed({**env, "HF_HUB_DOWNLOAD_TIMEOUT": "2"}, "pull", REPO, limit=40)
    assert code == 1, err
    assert 1.5 < _waited(err, "fetching model.safetensors") < 2 + 2.5, err
    last = err[-1][1]
    assert h.url in last and "stopped sending model.safetensors" in last, last
    assert "HF_HUB_DOWNLOAD_TIMEOUT" in last and "--timeout" in last and "3.0 MB" in last, last
    assert _gets(h, "model.safetensors") == [None]  # a stall is not retried within the run
    del h.stall_body["model.safetensors"]
    size = len(h.repos[REPO]["files"]["model.safetensors"])
    r = _run(env, "pull", REPO)  # the next run continues from the 3 MB on disk
    assert r.returncode == 0, r.stderr
    assert _gets(h, "model.safetensors")[-1] == "bytes=3000000-"
    assert h.sent["model.safetensors"] - 3_000_000 == size - 3_000_000  # only the rest


def test_a_slow_download_that_keeps_sending_is_not_cut(hub):
    h, env, tmp = hub
    size = len(h.repos[REPO]["files"]["tokenizer.json"])
    h.trickle["tokenizer.json"] = (size // 8 + 1, 0.4)  # ~3 s in all, never 1 s without bytes
    code, out, err = _timed({**env, "HF_HUB_DOWNLOAD_TIMEOUT": "1"}, "pull", REPO, limit=60)
    assert code == 0, err
    assert _gets(h, "tokenizer.json") == [None]  # one request, not cut, not retried
    assert h.sent["tokenizer.json"] == size


def test_a_bare_name_means_the_most_recent_pull_and_name_at_rev_one_revision(hub, monkeypatch):
    from diffill.model.pulled import resolve_pulled

    h, env, tmp = hub
    files = h.repos[REPO]["files"]
    h.add_repo(REPO, {**files, "config.json": files["config.json"] + b" "}, revision="v1")
    r = _run(env, "pull", "open-dcoder-0.5b")
    assert r.returncode == 0 and "--model open-dcoder-0.5b\n" in r.stdout, r.stderr
    gets = len(_gets(h, "model.safetensors"))
    r = _run(env, "pull", "open-dcoder-0.5b", "--revision", "v1")
    assert r.returncode == 0, r.stderr
    assert "--model open-dcoder-0.5b@v1" in r.stdout  # the value that names this revision
    assert len(_gets(h, "model.safetensors")) == gets  # the same weights: not fetched again
    reg = {e["revision"]: e for e in json.loads((tmp / "diffill" / "pulled.json").read_text())["entries"]}
    assert reg["main"]["path"] != reg["v1"]["path"]
    monkeypatch.setenv("DIFFILL_HOME", str(tmp / "diffill"))
    assert str(resolve_pulled("open-dcoder-0.5b")) == reg["v1"]["path"]  # the most recent pull
    assert str(resolve_pulled("open-dcoder-0.5b@main")) == reg["main"]["path"]
    assert str(resolve_pulled(f"{REPO}@{reg['main']['commit']}")) == reg["main"]["path"]
    r = _run(env, "pull", "open-dcoder-0.5b")  # pulling main again makes it the most recent
    assert r.returncode == 0, r.stderr
    assert str(resolve_pulled("open-dcoder-0.5b")) == reg["main"]["path"]
    assert str(resolve_pulled("open-dcoder-0.5b@v1")) == reg["v1"]["path"]
