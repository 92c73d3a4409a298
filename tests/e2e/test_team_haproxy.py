"""The scale-out of docs/team-serving.md, run for real: two ``diffill serve-http``
replicas on loopback behind Debian's HAProxy with the configuration printed in the
doc (read from it here; only the addresses, the certificate and the stats socket
path are changed), TLS at the proxy, and the ``openai`` remote backend of
``diffill serve`` (lsp_server/backend/remote.py) as the client:

1. a replica still loading is out of rotation (HAProxy's ``/health`` check) and no
   completion reaches it; once its ``/health`` says ok it is back within about a
   check interval;
2. requests spread over both replicas (and the language server answers through them);
3. one replica killed mid-run: in-flight requests are retried on the other (or
   answered 502/503, never hung or reset) and the rest are served by the survivor;
4. a ``429`` from a full replica reaches the client with its ``Retry-After``.

Why HAProxy and not nginx: open-source nginx has only passive health checks, so it
cannot keep requests away from a replica that is still loading (see the doc).
Needs ``haproxy`` and ``openssl`` (``.ci/run`` installs them); skipped without them
unless ``DIFFILL_REQUIRE_EDITORS=1`` (CI), which makes missing tools a failure.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _lsp_raw import SERVE, RawClient, end_position, server_env

pytestmark = [pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "team-serving.md"
TOKEN_ENV = "DIFFILL_TEST_LB_TOKEN"
TOKEN = "lb-token-for-tests-only"
PROMPTS = [
    ("def add_numbers(a, b):\n    total = a + b\n    return ", "\n"),
    ("def greet_user(name):\n    message = ", "\n    return message\n"),
    ("def is_even(number):\n    return number ", "\n"),
    # an answer that fits the 8-token hole with its end: ranked first for certain (the
    # script's answer tokens all score alike, so holes filled to the brim tie on float noise)
    ("def reverse_words(sentence):\n    words = ", "\n    return words\n"),
]


def need(tool: str) -> str:
    path = shutil.which(tool) or (f"/usr/sbin/{tool}" if Path(f"/usr/sbin/{tool}").exists() else None)
    if path is None:
        if os.environ.get("DIFFILL_REQUIRE_EDITORS") == "1":
            pytest.fail(f"{tool} is not installed (.ci/run installs it with apt)")
        pytest.skip(f"{tool} is not installed")
    return path


@pytest.fixture(scope="module")
def model_dir(scripted_model_dir: Path) -> Path:
    """The scripted checkpoint (tests/support/scripted_model.py): its answers are certain."""
    return Path(scripted_model_dir)


def doc_config() -> str:
    """The ```haproxy block of docs/team-serving.md (exactly one)."""
    blocks = re.findall(r"```haproxy\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1, "docs/team-serving.md must hold exactly one haproxy config"
    return blocks[0]


def local_config(cfg: str, replicas: list[int], port: int, pem: Path, sock: Path) -> str:
    """The doc's config with loopback addresses, the test's certificate and socket:
    each replacement must hit exactly one place, so the rest is the doc's text."""
    swaps = [("10.0.0.11:8000", f"127.0.0.1:{replicas[0]}"),
             ("10.0.0.12:8000", f"127.0.0.1:{replicas[1]}"),
             ("bind :443 ssl crt /etc/haproxy/tls/diffill.pem", f"bind 127.0.0.1:{port} ssl crt {pem}"),
             ("/run/haproxy/admin.sock", str(sock))]
    for old, new in swaps:
        assert cfg.count(old) == 1, f"the doc's config no longer has {old!r} exactly once"
        cfg = cfg.replace(old, new)
    return cfg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_cert(tmp: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1: (PEM with cert + key for HAProxy, cert)."""
    key, crt = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run([need("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(crt), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    pem = tmp / "diffill.pem"
    pem.write_bytes(crt.read_bytes() + key.read_bytes())
    return pem, crt


class Replica:
    def __init__(self, model: Path, tmp: Path, name: str, env: dict[str, str]) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.err = tmp / f"{name}.err"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "diffill.cli", "serve-http", "--model", str(model),
             "--port", str(self.port), "--steps", "4", "--workers", "2", "--max-queue", "4",
             "--request-timeout", "20", "--token-env", TOKEN_ENV],
            stdout=subprocess.DEVNULL, stderr=open(self.err, "wb"),  # noqa: SIM115
            env=server_env({TOKEN_ENV: TOKEN, "DIFFILL_DEBUG_STEP_DELAY_MS": "60", **env}))

    def health(self) -> dict:
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            return json.load(e)

    def wait_listening(self) -> None:
        wait_until(lambda: self._up(), 120, f"replica on {self.port} did not start")

    def _up(self) -> bool:
        assert self.proc.poll() is None, self.err.read_text()
        try:
            self.health()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        stop(self.proc, 30)


def stop(proc: subprocess.Popen, grace_s: float) -> None:
    """Terminate ``proc`` if it still runs; killed when it outlives ``grace_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, what
        time.sleep(0.05)
    return time.monotonic() - t0


class Proxy:
    def __init__(self, cfg: str, tmp: Path, sock: Path) -> None:
        path = tmp / "haproxy.cfg"
        path.write_text(cfg)
        exe = need("haproxy")
        check = subprocess.run([exe, "-c", "-f", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self.sock = sock
        self.err = tmp / "haproxy.err"
        self.proc = subprocess.Popen([exe, "-db", "-f", str(path)], stdout=subprocess.DEVNULL,
                                     stderr=open(self.err, "wb"))  # noqa: SIM115
        wait_until(lambda: sock.exists(), 20, "haproxy did not start")

    def stats(self) -> dict[str, dict[str, str]]:
        """``show stat`` of the ``diffill`` backend: server name -> its CSV row."""
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.sock))
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
        return {r["svname"]: r for r in rows if r["pxname"] == "diffill"}

    def status(self, server: str) -> str:
        return self.stats()[server]["status"]

    def stop(self) -> None:
        stop(self.proc, 10)


class Team:
    def __init__(self, url: str, ctx: ssl.SSLContext, a: Replica, b: Replica, proxy: Proxy,
                 cert: Path) -> None:
        self.url, self.ctx, self.a, self.b, self.proxy, self.cert = url, ctx, a, b, proxy, cert

    def post(self, body: dict, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
        """One raw POST through the proxy (no client-side retries); header names lowercased."""
        req = urllib.request.Request(self.url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {TOKEN}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.ctx) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def completed(self) -> tuple[int, int]:
        return (self.a.health().get("completed", 0),
                self.b.health().get("completed", 0) if self.b.proc.poll() is None else -1)


@pytest.fixture(scope="module")
def team(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    need("haproxy")
    tmp = tmp_path_factory.mktemp("team")
    pem, crt = make_cert(tmp)
    gate = tmp / "gate"
    a = Replica(model_dir, tmp, "a", {})
    b = Replica(model_dir, tmp, "b", {"DIFFILL_DEBUG_LOAD_GATE": str(gate)})  # held in loading
    proxy = None
    try:
        a.wait_listening()
        b.wait_listening()
        wait_until(lambda: a.health()["status"] == "ok", 120, "replica a did not load")
        port = free_port()
        sock = tmp / "admin.sock"
        proxy = Proxy(local_config(doc_config(), [a.port, b.port], port, pem, sock), tmp, sock)
        ctx = ssl.create_default_context(cafile=str(crt))
        team = Team(f"https://127.0.0.1:{port}", ctx, a, b, proxy, crt)
        team.gate = gate  # type: ignore[attr-defined]
        yield team
    finally:
        for r in (a, b):
            r.stop()
        if proxy is not None:
            proxy.stop()


def remote_backend(team: Team):
    from diffill.lsp_server.backend.remote import RemoteBackend, RemoteSettings

    return RemoteBackend(RemoteSettings(url=team.url + "/v1", api_key_env=TOKEN_ENV, timeout_s=10,
                                        retries=2, deadline_s=30))


def complete_via_remote(backend, i: int) -> str:
    """One completion through the language server's text path on the openai backend."""
    from diffill.lsp_server.completion.completer import Completer
    from diffill.lsp_server.completion.options import CompletionOptions

    prefix, suffix = PROMPTS[i % len(PROMPTS)]
    res = Completer(backend, CompletionOptions(max_tokens=8)).run(prefix + suffix, len(prefix))
    return res.suggestions[0].text if res.suggestions else ""


@pytest.fixture
def trust(team: Team, monkeypatch: pytest.MonkeyPatch) -> None:
    """The openai backend trusts the test certificate (ssl.create_default_context reads it)
    and finds the token."""
    monkeypatch.setenv("SSL_CERT_FILE", str(team.cert))
    monkeypatch.setenv(TOKEN_ENV, TOKEN)


def test_haproxy_scale_out(team: Team, trust: None, tmp_path: Path, capsys):
    report: list[str] = []
    # -- 1. a loading replica is out of rotation --------------------------------------------
    t_down = wait_until(lambda: team.proxy.status("gpu2") == "DOWN", 20,
                        "HAProxy did not take the loading replica out")
    assert team.proxy.status("gpu1") == "UP" and team.b.health()["status"] == "loading"
    remote = remote_backend(team)
    for i in range(6):
        complete_via_remote(remote, i)
    hb = team.b.health()
    assert hb.get("completed", 0) == 0 and hb.get("http_503", 0) == 0, hb  # none reached it
    assert team.a.health()["completed"] >= 6
    report.append(f"loading replica DOWN {t_down:.1f} s after the proxy started; 6/6 requests "
                  "served by the other")

    # -- 2. ready again: back in rotation, requests spread ----------------------------------
    team.gate.touch()  # type: ignore[attr-defined]
    wait_until(lambda: team.b.health()["status"] == "ok", 120, "replica b did not load")
    t_up = wait_until(lambda: team.proxy.status("gpu2") == "UP", 10,
                      "HAProxy did not take the ready replica back")
    before = team.completed()
    errors: list[BaseException] = []

    def client(n: int, seed: int) -> None:
        backend = remote_backend(team)
        try:
            for i in range(n):
                complete_via_remote(backend, seed + i)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(4, 10 * k)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    after = team.completed()
    spread = (after[0] - before[0], after[1] - before[1])
    assert spread[0] > 0 and spread[1] > 0 and sum(spread) >= 12, spread
    report.append(f"ready replica UP {t_up:.2f} s after its /health said ok; 12 requests from 3 "
                  f"clients spread {spread[0]} / {spread[1]}")

    # the language server with backend = "openai" answers through the proxy
    log = tmp_path / "lsp.log"
    lsp = RawClient([*SERVE, "--log-file", str(log)],
                    env=server_env({TOKEN_ENV: TOKEN, "SSL_CERT_FILE": str(team.cert)}),
                    stderr_path=tmp_path / "lsp.err")
    try:
        lsp.initialize({"diffill": {"backend": "openai", "remoteUrl": team.url + "/v1",
                                    "apiKeyEnv": TOKEN_ENV, "maxTokens": 8, "numCandidates": 1}})
        assert lsp.wait_loaded()["backend"] == "openai"
        got = []
        for i, (prefix, suffix) in enumerate(PROMPTS):
            uri = f"file:///team/{i}.py"
            lsp.open(uri, prefix + suffix)
            res = lsp.wait_for(lsp.inline_async(uri, *end_position(prefix)), 60)
            got.append([item["insertText"] for item in res["result"]["items"]])
        # the scripted checkpoint's answers
        assert got == [["total"], ['"hello " + name'], ["% 2 == 0"], ["sentence.split()"]], got
        st = lsp.request("diffill/status")["result"]
        assert lsp.shutdown() == 0
    finally:
        lsp.kill()
    assert st["model_requests"] >= len(PROMPTS) and st["errors"] == 0, st
    assert TOKEN not in log.read_text()

    # -- 3. one replica killed mid-run ------------------------------------------------------
    statuses: list[int] = []
    remote_done: list[str] = []
    stop_at = time.monotonic() + 4.0

    def raw_client(k: int) -> None:
        i = 0
        while time.monotonic() < stop_at:
            prefix, suffix = PROMPTS[(k + i) % len(PROMPTS)]
            status, _, _ = team.post({"prompt": prefix, "suffix": suffix, "max_tokens": 8})
            statuses.append(status)
            i += 1

    def remote_client() -> None:
        backend = remote_backend(team)
        i = 0
        try:
            while time.monotonic() < stop_at:
                remote_done.append(complete_via_remote(backend, i))
                i += 1
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=raw_client, args=(k,)) for k in range(2)]
    threads.append(threading.Thread(target=remote_client))
    for t in threads:
        t.start()
    time.sleep(1.2)
    in_flight_b = team.b.health()["queue"]
    at_kill = team.completed()
    team.b.proc.send_signal(signal.SIGKILL)
    team.b.proc.wait()
    t_kill = time.monotonic()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert statuses and set(statuses) <= {200, 502, 503}, statuses
    a_after = team.a.health()["completed"]
    st = team.proxy.stats()
    wait_until(lambda: team.proxy.status("gpu2") == "DOWN", 10, "the dead replica stayed UP")
    assert a_after > at_kill[0]  # the rest went to the survivor
    # the requests the killed replica held were retried elsewhere by the proxy, or by the
    # client after a clean 502/503
    recovered = int(st["BACKEND"]["wredis"]) + statuses.count(502) + statuses.count(503)
    assert in_flight_b == 0 or recovered > 0, st["BACKEND"]
    report.append(f"replica killed with {in_flight_b} request(s) in it, {time.monotonic() - t_kill:.1f}"
                  f" s before the run ended: {len(statuses)} raw requests -> "
                  f"{ {s: statuses.count(s) for s in set(statuses)} }, {len(remote_done)} via the "
                  f"openai backend, all answered; HAProxy retries {st['BACKEND']['wretr']}, "
                  f"redispatches {st['BACKEND']['wredis']}")

    # -- 4. a 429 reaches the client with its Retry-After -----------------------------------
    results: list[tuple[int, dict[str, str], bytes]] = []

    def burst() -> None:
        results.append(team.post({"prompt": PROMPTS[0][0], "max_tokens": 8}))

    threads = [threading.Thread(target=burst) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    rejected = [(h, body) for status, h, body in results if status == 429]
    assert rejected and len(results) == 10, [s for s, _, _ in results]
    for headers, body in rejected:
        assert int(headers["retry-after"]) >= 1
        assert json.loads(body)["error"]["code"] == "queue_full"
    assert all(s in (200, 429) for s, _, _ in results)
    report.append(f"burst of 10 on the survivor (--max-queue 4): {len(rejected)} got 429 with "
                  f"Retry-After {sorted({h['retry-after'] for h, _ in rejected})}, the rest 200")
    with capsys.disabled():
        print("\n[haproxy] " + "\n[haproxy] ".join(report))
