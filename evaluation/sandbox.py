"""Run untrusted generated code: ``prompt + completion + suffix + test + check(entry_point)``.

Each program runs in a fresh subprocess, in layers (each one reported by
:meth:`Sandbox.isolation` and tested on its own in ``tests/unit/evaluation/test_sandbox.py``):

1. ``sys.executable -I -S``: isolated mode, no ``site`` (stdlib only), an empty environment
   except a minimal ``PATH`` / ``HOME`` / ``TMPDIR``, and a private temporary directory as
   working directory, ``HOME`` and ``TMPDIR`` (removed afterwards).
2. Resource limits set in ``preexec_fn`` (inherited by everything below): ``RLIMIT_AS`` (1 GiB),
   ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE`` = 0 and ``RLIMIT_NPROC``.
3. Namespaces when ``unshare`` (util-linux) can create them: a new **network namespace** (only a
   down loopback: no network at all) and a new **PID namespace** with ``--kill-child``, so that
   killing the process group on timeout also kills every process the program started, even
   ones that called ``setsid()``. As root the namespaces are created directly, otherwise inside
   a new user namespace (``--map-root-user``).
4. When running as root: the program runs under a **private uid/gid** (one per worker slot, from
   a range no account uses) via ``setpriv``. That makes ``RLIMIT_NPROC`` effective (root is
   exempt from it: a fork bomb as root is not stopped by the limit) and lets the kernel refuse
   writes anywhere the program does not own. If the interpreter lives where that uid cannot
   read (e.g. under ``/root``), the ambient capability ``CAP_DAC_READ_SEARCH`` (read only, never
   write) is passed so the right stdlib is found.
5. An in-process **guard** installed with ``sys.addaudithook`` before the program runs: writes
   (``open`` for writing, remove, rename, mkdir, chmod, ``shutil`` copies/moves/rmtree, ...)
   outside the temporary directory raise ``PermissionError``; process creation (fork, exec,
   spawn, ``subprocess``, ``os.system``), signalling other processes and ``ctypes`` are refused;
   and, only when no network namespace could be made, sockets other than ``AF_UNIX`` are refused
   (the fallback network guard). Audit hooks are a best-effort barrier (e.g. ``os.open`` with
   ``dir_fd`` is not resolved); layers 3-4 are the real ones where available.

A program *passes* when it exits with status 0 after printing a per-run random sentinel that the
runner writes only after the program returned normally (``sys.exit(0)`` / ``os._exit(0)`` inside
the program therefore do not count as a pass). A wall-clock timeout (or the CPU limit) is
reported as ``"timeout"``.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# uids/gids no account uses: base + (pid % 65536) * 256 + slot  (< 2**31)
_UID_BASE = 0x40000000
_PASSED, _FAILED, _TIMEOUT = "passed", "failed", "timeout"


@dataclass(frozen=True)
class SandboxConfig:
    timeout_s: float = 5.0  # wall clock per program
    cpu_s: int | None = None  # RLIMIT_CPU; default ceil(timeout_s) + 1
    memory_bytes: int = 1 << 30  # RLIMIT_AS
    max_processes: int = 16  # processes the program may have in all (RLIMIT_NPROC)
    max_file_bytes: int = 16 << 20  # RLIMIT_FSIZE
    max_open_files: int = 64  # RLIMIT_NOFILE
    namespaces: bool = True  # try network + PID namespaces
    drop_privileges: bool = True  # as root: run under a private uid
    guard_writes: bool = True  # audit-hook write guard
    guard_processes: bool = True  # audit-hook process/ctypes guard
    socket_guard: bool | None = None  # None: only when no network namespace
    workers: int = 2


@dataclass(frozen=True)
class ExecResult:
    status: str  # "passed" | "failed" | "timeout"
    returncode: int | None
    detail: str  # why it failed (stderr tail or reason); "" when passed
    wall_s: float

    @property
    def passed(self) -> bool:
        return self.status == _PASSED


@dataclass(frozen=True)
class _Layers:
    prefix: tuple[str, ...]  # wrapper command before the interpreter
    netns: bool
    pidns: bool
    uid: bool  # runs under a private uid
    caps: tuple[str, ...]  # setpriv capability options
    notes: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- child program

_RUNNER = r'''
import os, sys
_nonce = sys.stdin.readline().strip()
with open("solution.py", encoding="utf-8") as _f:
    _src = _f.read()
_out = os.dup(1)
_TMP = os.path.realpath(os.getcwd())
_GUARD_WRITES = {guard_writes}
_GUARD_PROCS = {guard_procs}
_GUARD_NET = {guard_net}


def _install():
    realpath, fspath, sep = os.path.realpath, os.fspath, os.sep
    tmp, me = _TMP, os.getpid()
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    allowed = ("/dev/null",)
    af_unix = getattr(sys.modules.get("socket"), "AF_UNIX", 1)
    one_path = {{
        "os.remove": 0, "os.rmdir": 0, "os.mkdir": 0, "os.chmod": 0, "os.chown": 0,
        "os.lchmod": 0, "os.lchown": 0, "os.chflags": 0, "os.lchflags": 0, "os.truncate": 0,
        "os.utime": 0, "os.setxattr": 0, "os.removexattr": 0, "os.mkfifo": 0, "os.mknod": 0,
        "os.symlink": 1, "shutil.copyfile": 1, "shutil.copymode": 1, "shutil.copystat": 1,
        "shutil.copytree": 1, "shutil.rmtree": 0, "shutil.chown": 0, "shutil.unpack_archive": 1,
        "shutil.make_archive": 0,
    }}
    two_paths = {{"os.rename": (0, 1), "os.link": (0, 1), "shutil.move": (0, 1)}}
    procs = {{
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
        "subprocess.Popen", "os.startfile", "pty.spawn",
    }}

    def inside(p):
        if p is None or isinstance(p, int):
            return True  # an already opened descriptor / absent optional argument
        try:
            p = os.fsdecode(fspath(p))
        except TypeError:
            return False
        r = realpath(p)
        return r == tmp or r.startswith(tmp + sep) or r in allowed

    def deny(what):
        raise PermissionError("diffill sandbox: " + what)

    def hook(event, args):
        if _GUARD_WRITES:
            if event == "open":
                path, mode, flags = args
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & wflags
                )
                if writing and not inside(path):
                    deny("write outside the sandbox directory: %r" % (path,))
                return
            i = one_path.get(event)
            if i is not None:
                if len(args) > i and not inside(args[i]):
                    deny("%s outside the sandbox directory: %r" % (event, args[i]))
                return
            ij = two_paths.get(event)
            if ij is not None:
                for k in ij:
                    if not inside(args[k]):
                        deny("%s outside the sandbox directory: %r" % (event, args[k]))
                return
        if _GUARD_PROCS:
            if event in procs:
                deny(event + " is not allowed")
            if event in ("os.kill", "os.killpg") and args[0] not in (0, me):
                deny(event + " is not allowed")
            if event.startswith("ctypes."):
                deny(event + " is not allowed")
        if _GUARD_NET and event.startswith("socket."):
            if event == "socket.__new__" and len(args) > 1 and args[1] == af_unix:
                return
            if event in ("socket.__new__", "socket.connect", "socket.bind", "socket.sendto",
                         "socket.sendmsg", "socket.getaddrinfo", "socket.gethostbyname",
                         "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.getnameinfo"):
                deny("network is disabled (" + event + ")")

    sys.addaudithook(hook)


if _GUARD_WRITES or _GUARD_PROCS or _GUARD_NET:
    if _GUARD_NET:
        import socket  # noqa: F401  (imported before the hook so the guard can name AF_UNIX)
    _install()
del _install

try:
    exec(compile(_src, "solution.py", "exec"), {{"__name__": "__main__", "__builtins__": __builtins__}})
except BaseException as _e:
    import traceback
    traceback.print_exception(type(_e), _e, _e.__traceback__.tb_next)  # without the runner's frame
    try:
        sys.stderr.flush()
    finally:
        os._exit(1)
for _s in (sys.stdout, sys.stderr):
    try:
        _s.flush()
    except BaseException:
        pass
os.write(_out, ("\n" + _nonce + "\n").encode())
os._exit(0)
'''


# ----------------------------------------------------------------------------- probing

_probe_lock = threading.Lock()
_probe_cache: dict[tuple[Any, ...], _Layers] = {}


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _try(cmd: Sequence[str], timeout: float = 20.0) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, cwd="/", env=_base_env("/"),
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None


def _base_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}


def _probe(python: str, namespaces: bool, drop: bool) -> _Layers:
    key = (python, namespaces, drop)
    with _probe_lock:
        if key in _probe_cache:
            return _probe_cache[key]
        layers = _probe_uncached(python, namespaces, drop)
        _probe_cache[key] = layers
        return layers


def _probe_uncached(python: str, namespaces: bool, drop: bool) -> _Layers:
    notes: list[str] = []
    expect = f"{sys.base_prefix}|{sys.version}"
    check = ["-I", "-S", "-c", "import sys; print(sys.base_prefix + '|' + sys.version)"]
    root = _is_root()

    ns_prefix: tuple[str, ...] = ()
    unshare = shutil.which("unshare")
    if namespaces and unshare:
        opts = ("--net", "--pid", "--fork", "--kill-child")
        if not root:
            opts = ("--map-root-user", *opts)
        cand = (unshare, *opts, "--")
        r = _try([*cand, python, *check])
        if r is not None and r.returncode == 0 and r.stdout.strip() == expect:
            ns_prefix = cand
        else:
            notes.append("unshare failed: " + ((r.stderr.strip()[-200:] if r else "") or "no result"))
    elif namespaces:
        notes.append("no unshare binary")

    uid_prefix: tuple[str, ...] = ()
    caps: tuple[str, ...] = ()
    setpriv = shutil.which("setpriv")
    if drop and root and setpriv:
        u = _slot_uid(0)
        base = (setpriv, f"--reuid={u}", f"--regid={u}", "--clear-groups")
        for c in ((), ("--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search")):
            r = _try([*ns_prefix, *base, *c, "--", python, *check])
            if r is not None and r.returncode == 0 and r.stdout.strip() == expect:
                uid_prefix, caps = base, c
                break
        else:
            notes.append("setpriv could not run the interpreter under a private uid")
    elif drop and root:
        notes.append("no setpriv binary")
    return _Layers(
        prefix=ns_prefix,
        netns=bool(ns_prefix),
        pidns=bool(ns_prefix),
        uid=bool(uid_prefix),
        caps=caps,
        notes=tuple(notes),
    )


def _slot_uid(slot: int) -> int:
    return _UID_BASE + ((os.getpid() % 65536) << 8) + (slot % 256)


def _count_processes(uid: int) -> int:
    return len(_pids_of(uid))


# ----------------------------------------------------------------------------- sandbox


@dataclass
class Sandbox:
    config: SandboxConfig = field(default_factory=SandboxConfig)
    python: str = field(default_factory=lambda: sys.executable)

    def __post_init__(self) -> None:
        self._layers: _Layers | None = None
        self._slots: queue.Queue[int] = queue.Queue()
        for s in range(max(1, self.config.workers)):
            self._slots.put(s)

    # -- what is active ---------------------------------------------------------------
    @property
    def layers(self) -> _Layers:
        if self._layers is None:
            self._layers = _probe(self.python, self.config.namespaces, self.config.drop_privileges)
        return self._layers

    @property
    def socket_guard(self) -> bool:
        g = self.config.socket_guard
        return (not self.layers.netns) if g is None else g

    def isolation(self) -> dict[str, Any]:
        """Which layers are active, for the report."""
        lay, c = self.layers, self.config
        root = _is_root()
        if lay.netns:
            network = "network namespace" + (" + socket guard" if self.socket_guard else "")
        else:
            network = "socket guard (audit hook)" if self.socket_guard else "NONE"
        if lay.uid:
            nproc = f"RLIMIT_NPROC={c.max_processes} (private uid)"
        elif root:
            nproc = "RLIMIT_NPROC ineffective (root is exempt)"
        else:
            nproc = f"RLIMIT_NPROC=<own processes>+{c.max_processes}"
        return {
            "interpreter": f"{self.python} -I -S",
            "network": network,
            "pid_namespace": lay.pidns,
            "user": ("private uid" + (" (+CAP_DAC_READ_SEARCH)" if lay.caps else ""))
            if lay.uid
            else ("unchanged (root)" if root else "unchanged"),
            "processes": nproc + (" + audit-hook process guard" if c.guard_processes else ""),
            "writes": ", ".join(
                x
                for x in (
                    "audit-hook write guard" if c.guard_writes else "",
                    "private uid (kernel permissions)" if lay.uid else "",
                    f"RLIMIT_FSIZE={c.max_file_bytes}",
                )
                if x
            ),
            "limits": {
                "wall_s": c.timeout_s,
                "cpu_s": self._cpu_s(),
                "address_space_bytes": c.memory_bytes,
                "open_files": c.max_open_files,
            },
            "notes": list(lay.notes),
        }

    def _cpu_s(self) -> int:
        c = self.config
        return c.cpu_s if c.cpu_s is not None else int(math.ceil(c.timeout_s)) + 1

    # -- running ------------------------------------------------------------------------
    def run(self, program: str) -> ExecResult:
        slot = self._slots.get()
        try:
            return self._run(program, slot)
        finally:
            self._slots.put(slot)

    def run_many(
        self, programs: Sequence[str], progress: Callable[[], None] | None = None
    ) -> list[ExecResult]:
        """Runs ``programs`` on ``config.workers`` parallel workers; results in input order."""
        self.layers  # probe once, before the workers start  # noqa: B018
        out: list[ExecResult | None] = [None] * len(programs)
        with ThreadPoolExecutor(max_workers=max(1, self.config.workers)) as ex:
            futs = {ex.submit(self.run, p): i for i, p in enumerate(programs)}
            for f in as_completed(futs):
                out[futs[f]] = f.result()
                if progress is not None:
                    progress()
        return [r for r in out if r is not None]

    def _run(self, program: str, slot: int) -> ExecResult:
        c, lay = self.config, self.layers
        tmp = tempfile.mkdtemp(prefix="diffill-sbx-")
        uid = _slot_uid(slot) if lay.uid else None
        try:
            Path(tmp, "solution.py").write_text(program, encoding="utf-8")
            Path(tmp, "runner.py").write_text(
                _RUNNER.format(
                    guard_writes=c.guard_writes, guard_procs=c.guard_processes, guard_net=self.socket_guard
                ),
                encoding="utf-8",
            )
            out_p, err_p = Path(tmp, ".stdout"), Path(tmp, ".stderr")
            cmd: list[str] = list(lay.prefix)
            if uid is not None:
                for p in (tmp, *(Path(tmp).iterdir())):
                    os.chown(p, uid, uid)
                cmd += [
                    shutil.which("setpriv") or "setpriv",
                    f"--reuid={uid}",
                    f"--regid={uid}",
                    "--clear-groups",
                    *lay.caps,
                    "--",
                ]
            cmd += [self.python, "-I", "-S", "runner.py"]
            nproc = c.max_processes
            if uid is None and not _is_root():
                nproc += _count_processes(os.getuid())
            limits = _limits(
                cpu=self._cpu_s(), mem=c.memory_bytes, nproc=nproc, fsize=c.max_file_bytes, nofile=c.max_open_files
            )
            nonce = secrets.token_hex(16)
            t0 = time.perf_counter()
            with open(out_p, "wb") as fo, open(err_p, "wb") as fe:
                proc = subprocess.Popen(
                    cmd,
                    cwd=tmp,
                    env=_base_env(tmp),
                    stdin=subprocess.PIPE,
                    stdout=fo,
                    stderr=fe,
                    start_new_session=True,
                    preexec_fn=limits,
                    close_fds=True,
                )
                timed_out = False
                try:
                    with contextlib.suppress(OSError):
                        assert proc.stdin is not None
                        proc.stdin.write((nonce + "\n").encode())
                        proc.stdin.close()
                    rc: int | None = proc.wait(timeout=c.timeout_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    rc = _stop(proc, uid)
                finally:
                    if proc.poll() is None:
                        _kill_group(proc)
                        proc.wait()
            wall = time.perf_counter() - t0
            if uid is not None:
                # orphans that left the process group (setsid) die too, and the PID namespace's
                # asynchronous teardown is waited for: the slot's uid starts the next run empty
                _kill_uid(uid)
            stdout_tail = _tail(out_p, 4096)
            stderr_tail = _tail(err_p, 2000)
            if timed_out:
                return ExecResult(_TIMEOUT, None, f"timed out after {c.timeout_s:g} s", wall)
            if rc is not None and rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
                return ExecResult(_TIMEOUT, rc, f"CPU limit ({self._cpu_s()} s) exceeded", wall)
            if rc == 0 and stdout_tail.rstrip().endswith(nonce):
                return ExecResult(_PASSED, rc, "", wall)
            detail = stderr_tail.strip() or (
                f"exit status {rc} without finishing" if rc == 0 else f"exit status {rc}"
            )
            if rc is not None and rc < 0:
                detail = f"killed by signal {-rc}" + (f": {detail}" if stderr_tail.strip() else "")
            return ExecResult(_FAILED, rc, detail[-1000:], wall)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _stop(proc: subprocess.Popen[bytes], uid: int | None) -> int:
    """Kills a running program. Under a private uid the program's own processes are killed
    first, so that their parent (the ``unshare`` wrapper) reaps them and exits; killing the
    wrapper first would leave them for init to reap, which can take a while."""
    if uid is not None:
        _signal_uid(uid)
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
    _kill_group(proc)
    return proc.wait()


def _signal_uid(uid: int) -> None:
    for pid in _pids_of(uid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _kill_uid(uid: int, deadline_s: float = 2.0) -> None:
    """Kills every process of a private sandbox uid (no other process has it) and waits,
    bounded, until they are gone (zombies included), so the slot's RLIMIT_NPROC budget is
    whole again for the next program."""
    end = time.monotonic() + deadline_s
    while True:
        if not _pids_of(uid) or time.monotonic() > end:
            return
        _signal_uid(uid)
        time.sleep(0.02)


def _pids_of(uid: int) -> list[int]:
    out = []
    with contextlib.suppress(OSError):
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{d}").st_uid == uid:
                        out.append(int(d))
    return out


def _tail(path: Path, n: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _limits(*, cpu: int, mem: int, nproc: int, fsize: int, nofile: int) -> Callable[[], None]:
    setr = resource.setrlimit
    rl = resource

    def apply() -> None:  # runs in the child between fork and exec: no imports, no locks
        setr(rl.RLIMIT_CPU, (cpu, cpu + 1))
        setr(rl.RLIMIT_AS, (mem, mem))
        setr(rl.RLIMIT_FSIZE, (fsize, fsize))
        setr(rl.RLIMIT_NOFILE, (nofile, nofile))
        setr(rl.RLIMIT_CORE, (0, 0))
        setr(rl.RLIMIT_NPROC, (nproc, nproc))

    return apply
