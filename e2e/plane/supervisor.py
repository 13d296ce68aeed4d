"""The plane's processes: start one (its log, PID and argv kept in cluster.json), judge
its health, wait for it (failing at once when a watched one exits), restart one for the
fault tests, stop them all in order."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from plane.components import CORE_COMPONENTS, WORKLOAD_CONTROLLERS
from plane.processes import (
    ClusterError,
    ComponentExited,
    _cmdline,
    _http_ok,
    _insecure_ctx,
    _terminate,
    log,
    pid_alive,
)
from plane.state_files import StateFiles


class Supervisor(StateFiles):
    """Starts, watches and stops the plane's components (background processes)."""

    _procs: dict[str, subprocess.Popen]
    timings: dict[str, float]

    def _api_ctx(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _health(self, name: str, ports: dict[str, int]) -> bool:
        if name == "etcd":
            return _http_ok(f"http://127.0.0.1:{ports['etcd']}/health", expect='"true"')
        if name == "kube-apiserver":
            try:
                ctx = self._api_ctx()
            except (OSError, ssl.SSLError):  # PKI gone: a half-cleaned state directory
                return False
            return _http_ok(f"https://127.0.0.1:{ports['apiserver']}/readyz", ctx)
        if name == "kube-controller-manager":
            return _http_ok(f"https://127.0.0.1:{ports['kcm']}/healthz", _insecure_ctx())
        if name == "kube-scheduler":
            return _http_ok(f"https://127.0.0.1:{ports['scheduler']}/healthz", _insecure_ctx())
        if name == "kwok":
            return _http_ok(f"http://127.0.0.1:{ports['kwok']}/healthz")
        if name == "kueue":
            return _http_ok(f"http://127.0.0.1:{ports['kueue_health']}/readyz")
        for c in WORKLOAD_CONTROLLERS:
            if c.name == name:
                return _http_ok(f"http://127.0.0.1:{ports[name + '_health']}{c.readyz}")
        raise KeyError(name)

    def status(self) -> dict[str, Any]:
        info = self.info()
        comps = {}
        for name in self._component_names(info):
            c = info.get("components", {}).get(name)
            if not c:
                comps[name] = {"running": False}
                continue
            alive = pid_alive(c["pid"], c["exe"])
            comps[name] = {
                "pid": c["pid"],
                "running": alive,
                "healthy": alive and self._health(name, info["ports"]),
                "log": c["log"],
            }
        return {
            "state": str(self.state),
            "ready": bool(info.get("ready")),
            "kubeconfig": str(self.kubeconfig) if info else None,
            "server": info.get("server"),
            "bin": info.get("bin"),
            "components": comps,
        }

    @staticmethod
    def _component_names(info: dict[str, Any]) -> list[str]:
        """The core components and the workload controllers this plane runs."""
        return CORE_COMPONENTS + list(info.get("controllers", []))

    def is_up(self) -> bool:
        info = self.info()
        if not info.get("ready"):
            return False
        for name in self._component_names(info):
            c = info["components"].get(name)
            if not c or not pid_alive(c["pid"], c["exe"]):
                return False
        return self._health("kube-apiserver", info["ports"]) and self._health(
            "kueue", info["ports"]
        )

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        logf = self.logs_dir / f"{name}.log"
        with open(logf, "ab") as out:
            out.write(f"\n==== {time.strftime('%F %T')} {' '.join(argv)}\n".encode())
            out.flush()
            p = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.state,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        self._procs[name] = p
        info = self.info()
        info.setdefault("components", {})[name] = {
            "pid": p.pid,
            "exe": argv[0],
            "log": str(logf),
            "argv": argv,  # so restart() starts it again exactly as up() did
            "env": env or {},
        }
        self._save_info(info)

    def restart(
        self, name: str, outage: float = 2.0, sig: int = signal.SIGKILL, timeout: float = 90
    ) -> float:
        """Stop one running component (SIGKILL by default: no graceful shutdown), leave it
        down for `outage` seconds, start it again with the same argv and environment (etcd
        on the same data directory) and wait until it is healthy. For fault tests; returns
        the seconds the component was unavailable."""
        with self._lock():
            info = self.info()
            comp = info["components"][name]
            argv = comp.get("argv") or _cmdline(comp["pid"])  # clusters up before "argv"
            t0 = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.kill(comp["pid"], sig)
            proc = self._procs.pop(name, None)
            deadline = time.monotonic() + 30
            while pid_alive(comp["pid"], comp["exe"]):
                if proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(0.1)
                else:
                    time.sleep(0.1)
                if time.monotonic() > deadline:
                    raise ClusterError(f"{name} (pid {comp['pid']}) did not stop on signal {sig}")
            time.sleep(outage)  # a real outage, not just a reconnect
            self._spawn(name, argv, comp.get("env") or None)
            self._wait(
                f"{name} restarted", lambda: self._health(name, info["ports"]), timeout, [name]
            )
            log(f"{name} restarted (pid {self.info()['components'][name]['pid']})")
            return time.monotonic() - t0

    def _wait(
        self, what: str, ok: Callable[[], bool], timeout: float, watch: Sequence[str] = ()
    ) -> None:
        t0 = time.monotonic()
        deadline = t0 + timeout
        info = self.info()
        while True:
            if ok():
                self.timings[what] = round(time.monotonic() - t0, 2)
                return
            for name in watch:
                c = info["components"][name]
                p = self._procs.get(name)
                # A child we started is judged by its exit status alone; the /proc check
                # (pid and argv[0]) is for components another process started. It once
                # failed for live children of ours during a CI bring-up.
                rc = p.poll() if p else None
                gone = rc is not None if p else not pid_alive(c["pid"], c["exe"])
                if gone:
                    raise ComponentExited(
                        f"{name} exited (returncode {rc}) while waiting for {what}:\n"
                        f"{self.log_tail(name)}"
                    )
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {n}\n{self.log_tail(n, 20)}" for n in watch)
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}\n{tails}")
            time.sleep(0.2)

    def down(self, keep_logs: bool = False) -> None:
        with self._lock():
            self._down_locked(keep_logs)

    def _down_locked(self, keep_logs: bool) -> None:
        info = self.info()
        comps = info.get("components", {})
        # clients first (in parallel), then the apiserver, then etcd: an apiserver whose
        # etcd is gone does not finish its graceful shutdown before the SIGKILL deadline
        for stage in (
            [n for n in comps if n not in ("kube-apiserver", "etcd")],
            ["kube-apiserver"],
            ["etcd"],
        ):
            _terminate([(comps[n]["pid"], comps[n]["exe"]) for n in stage if n in comps])
        for p in self._procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        self._procs.clear()
        if not self.state.exists():
            return
        if keep_logs and self.logs_dir.exists():
            for child in self.state.iterdir():
                if child != self.logs_dir:
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
        else:
            shutil.rmtree(self.state, ignore_errors=True)
        log(f"down: stopped {len(comps)} components, cleaned {self.state}")
