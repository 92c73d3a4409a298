"""The execution sandbox: normal programs, hostile snippets, each isolation layer on its own,
and HumanEval programs (canonical solutions pass, the empty floor on known tasks)."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest
from diffill.evaluation.sandbox import Sandbox, SandboxConfig, _pids_of, _slot_uid
from diffill.evaluation.tasks import humaneval_single_line_tasks, subset

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(SandboxConfig(timeout_s=5.0))


@pytest.fixture(scope="module")
def he_tasks():
    return {t.task_id: t for t in humaneval_single_line_tasks()}


def test_isolation_report(sandbox):
    iso = sandbox.isolation()
    for k in ("interpreter", "network", "pid_namespace", "user", "processes", "writes", "limits"):
        assert k in iso
    assert iso["network"] != "NONE"
    assert iso["interpreter"].endswith("-I -S")


def test_passing_and_failing_solutions(sandbox):
    ok = sandbox.run("def add(a, b):\n    return a + b\n\ndef check(c):\n    assert c(2, 3) == 5\ncheck(add)\n")
    assert ok.passed and ok.status == "passed"
    bad = sandbox.run("def add(a, b):\n    return a - b\n\ndef check(c):\n    assert c(2, 3) == 5\ncheck(add)\n")
    assert bad.status == "failed" and "AssertionError" in bad.detail
    syntax = sandbox.run("def f(:\n")
    assert syntax.status == "failed" and "SyntaxError" in syntax.detail


def test_exiting_early_is_not_a_pass(sandbox):
    assert sandbox.run("import sys\nsys.exit(0)\nassert False\n").status == "failed"
    r = sandbox.run("import os\nos._exit(0)\n")
    assert r.status == "failed" and r.returncode == 0
    # printing something that looks like success is not a pass either
    assert not sandbox.run("print('passed')\nraise SystemExit(0)\n").passed


def test_environment_is_empty_and_home_is_private(sandbox):
    prog = (
        "import os, sys\n"
        "assert set(os.environ) <= {'PATH', 'HOME', 'TMPDIR', 'LANG', 'LC_CTYPE'}, dict(os.environ)\n"
        "assert os.path.realpath(os.environ['HOME']) == os.path.realpath(os.getcwd())\n"
        "assert sys.flags.isolated and sys.flags.no_site\n"
        "open(os.path.join(os.environ['HOME'], 'scratch.txt'), 'w').write('ok')\n"
        "import tempfile\n"
        "with tempfile.NamedTemporaryFile() as f:\n"
        "    assert os.path.dirname(f.name) == os.getcwd()\n"
    )
    r = sandbox.run(prog)
    assert r.passed, r.detail


def test_infinite_loop_is_killed_and_reported_as_timeout():
    sb = Sandbox(SandboxConfig(timeout_s=1.5))
    r = sb.run("while True:\n    pass\n")
    assert r.status == "timeout" and r.returncode is None
    r = sb.run("import time\ntime.sleep(60)\n")
    assert r.status == "timeout"


def _bomb(n: int = 200) -> str:
    # forks children that sleep; counts how many forks succeeded before the kernel refused
    return (
        "import os, sys, time\n"
        "made = 0\n"
        f"for _ in range({n}):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    made += 1\n"
        "sys.stderr.write('FORKED %d\\n' % made)\n"
        "sys.stderr.flush()\n"
        "raise SystemExit(1)\n"
    )


def test_fork_bomb_blocked_by_the_process_guard(sandbox):
    r = sandbox.run(_bomb())
    assert r.status == "failed" and "FORKED 0" in r.detail


@pytest.mark.parametrize("namespaces", [True, False], ids=["pidns", "no-namespaces"])
def test_fork_bomb_stopped_by_rlimit_nproc(namespaces):
    sb = Sandbox(SandboxConfig(timeout_s=5.0, guard_processes=False, namespaces=namespaces, max_processes=8))
    if ROOT and not sb.layers.uid:
        pytest.skip("running as root without a private uid: RLIMIT_NPROC does not apply to root")
    r = sb.run(_bomb())
    assert r.status == "failed", r.detail
    made = int(r.detail.split("FORKED ")[1].split()[0])
    assert made < 8
    if sb.layers.uid:
        assert _pids_of(_slot_uid(0)) == []  # nothing of the bomb survives the run


def test_endless_fork_bomb_times_out_and_leaves_nothing():
    sb = Sandbox(SandboxConfig(timeout_s=2.0, guard_processes=False, max_processes=8))
    prog = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = sb.run(prog)
    assert r.status == "timeout"
    if sb.layers.uid:
        assert _pids_of(_slot_uid(0)) == []


WRITE_CONFIGS = {
    "all-layers": SandboxConfig(),
    "audit-hook-only": SandboxConfig(namespaces=False, drop_privileges=False),
    "private-uid-only": SandboxConfig(guard_writes=False, namespaces=False),
}


@pytest.mark.parametrize("name", list(WRITE_CONFIGS))
def test_writes_outside_the_sandbox_are_blocked(name, tmp_path):
    sb = Sandbox(WRITE_CONFIGS[name])
    if name == "private-uid-only" and not sb.layers.uid:
        pytest.skip("no private uid on this machine (not root or no setpriv)")
    # The audit hook also covers world-writable places; kernel permissions for a private uid
    # only cover what that uid does not own or may not write, so that layer is tested on a
    # plain (0755 / 0644) directory and file.
    world_writable = name != "private-uid-only"
    os.chmod(tmp_path, 0o777 if world_writable else 0o755)
    outside = tmp_path / "outside.txt"
    home_file = Path(os.path.expanduser("~")) / f".diffill-sandbox-test-{uuid.uuid4().hex}"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.chmod(victim, 0o666 if world_writable else 0o644)
    try:
        for prog in (
            f"open({str(outside)!r}, 'w').write('x')\n",
            f"open({str(home_file)!r}, 'a').write('x')\n",
            f"import os\nos.close(os.open({str(outside)!r}, os.O_WRONLY | os.O_CREAT))\n",
            f"import os\nos.remove({str(victim)!r})\n",
            f"import shutil\nshutil.copyfile('runner.py', {str(outside)!r})\n",
            f"open({str(victim)!r}, 'w').write('overwritten')\n",
        ):
            r = sb.run(prog)
            assert r.status == "failed", prog
            assert "PermissionError" in r.detail or "Permission denied" in r.detail, r.detail
        assert not outside.exists()
        assert not home_file.exists()
        assert victim.read_text() == "keep me"
    finally:
        home_file.unlink(missing_ok=True)


@pytest.fixture
def listener():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    s.setblocking(False)
    yield s
    s.close()


NET_CONFIGS = {
    "default": SandboxConfig(),
    "socket-guard-only": SandboxConfig(namespaces=False),
    "netns-only": SandboxConfig(socket_guard=False),
}


@pytest.mark.parametrize("name", list(NET_CONFIGS))
def test_no_network(name, listener):
    sb = Sandbox(NET_CONFIGS[name])
    if name == "netns-only" and not sb.layers.netns:
        pytest.skip("no network namespace on this machine")
    port = listener.getsockname()[1]
    prog = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
        "s.settimeout(2)\n"
        f"s.connect(('127.0.0.1', {port}))\n"
        "s.sendall(b'hello')\n"
    )
    r = sb.run(prog)
    assert r.status == "failed", r.detail
    assert "Error" in r.detail
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected


def test_huge_allocation_fails_cleanly(sandbox):
    r = sandbox.run("x = bytearray(8 << 30)\n")
    assert r.status == "failed" and "MemoryError" in r.detail
    # and the sandbox keeps working afterwards
    assert sandbox.run("x = bytearray(10 << 20)\n").passed


def test_huge_output_is_capped(sandbox):
    r = sandbox.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    assert r.status in ("failed", "timeout")
    assert not r.passed


def test_run_many_keeps_order():
    sb = Sandbox(SandboxConfig(workers=2))
    progs = [f"assert {i} % 3 != 0\n" for i in range(7)]
    res = sb.run_many(progs)
    assert [r.passed for r in res] == [i % 3 != 0 for i in range(7)]


def test_canonical_solutions_pass(he_tasks):
    tasks = subset(list(he_tasks.values()), 10)
    res = Sandbox(SandboxConfig(workers=2)).run_many([t.program(t.canonical_solution) for t in tasks])
    assert [r.status for r in res] == ["passed"] * len(tasks), [r.detail for r in res if not r.passed]


def test_empty_floor_on_known_tasks(he_tasks):
    # blank line instead of the hidden line: these pass (the line is redundant for the tests) ...
    floor = ["SingleLineInfilling/HumanEval/33/L0", "SingleLineInfilling/HumanEval/66/L0",
             "SingleLineInfilling/HumanEval/127/L3"]
    # ... and these do not
    real = ["SingleLineInfilling/HumanEval/0/L0", "SingleLineInfilling/HumanEval/2/L0",
            "SingleLineInfilling/HumanEval/53/L0"]
    tasks = [he_tasks[i] for i in floor + real]
    res = Sandbox(SandboxConfig(workers=2)).run_many([t.program(t.completion_for("")) for t in tasks])
    assert [r.passed for r in res] == [True] * 3 + [False] * 3
