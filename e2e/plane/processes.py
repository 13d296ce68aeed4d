"""Processes of the plane: free ports, liveness by PID and argv[0], graceful stop, HTTP
health probes. Shared by e2e/cluster.py and the fixtures that start nexus-admit."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def log(msg: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class ClusterError(RuntimeError):
    pass


class ComponentExited(ClusterError):
    pass


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now and never handed out before by this process: the kernel may give
    the same ephemeral port to two calls in a row (seen: a controller's webhook and health
    ports were equal, and its webhook could not bind)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def pid_alive(pid: int, exe: str | None = None) -> bool:
    """True if `pid` runs (not a zombie) and, when given, its argv[0] is `exe`."""
    st = _proc_state(pid)
    if st is None:
        return False
    if st in ("Z", "X"):
        _reap(pid)
        return False
    if exe is not None:
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()
        except (FileNotFoundError, ProcessLookupError):
            return False
        return argv0 == exe
    return True


def _cmdline(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def _terminate(procs: list[tuple[int, str]], grace: float = 10.0) -> None:
    """SIGTERM every (pid, argv0) that still runs that binary; SIGKILL what outlives `grace`."""
    live = [(pid, exe) for pid, exe in procs if pid_alive(pid, exe)]
    for pid, _ in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        for pid, _ in live:
            _reap(pid)
        live = [(pid, exe) for pid, exe in live if pid_alive(pid)]
    for pid, exe in live:
        if pid_alive(pid, exe):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        for pid, _ in live:
            _reap(pid)
        live = [(pid, exe) for pid, exe in live if pid_alive(pid)]
        if not live:
            return
        time.sleep(0.1)


def _http_ok(url: str, ctx: ssl.SSLContext | None = None, expect: str | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
            body = r.read().decode(errors="replace")
            return r.status == 200 and (expect is None or expect in body)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def _insecure_ctx() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx
