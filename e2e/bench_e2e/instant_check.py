#!/usr/bin/env python3
"""The benchmark's floor for any AdmissionCheck: a check controller that answers Ready at
once, with no placement, no pod set update and no reservation.

Why: issue 30's targets compare Kueue + nexus with Kueue alone, and a ClusterQueue with a
check already makes Kueue do more (it adds the check to the Workload, writes Admitted
apart from the quota reservation, and its writes race each other: docs/benchmarks.md).
The `check` phase of `run.py` sends the same Workloads to queues with this check, so the
report can split the gap into what any check costs on this plane and what nexus adds.

It runs as its own process (its CPU is counted apart), watches the Workloads of one
namespace and applies the Ready state of its own check entry, server-side, under its own
field manager, once per quota reservation; it marks its AdmissionCheck Active first, as
Kueue requires of a check's controller. Never a stand-in for nexus: it decides nothing.

    python e2e/bench_e2e/instant_check.py --kubeconfig K --namespace NS
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

E2E_DIR = Path(__file__).resolve().parent.parent
if str(E2E_DIR) not in sys.path:
    sys.path.insert(0, str(E2E_DIR))

from kubernetes import client  # noqa: E402

from bench_e2e.queues import INSTANT_CHECK as CHECK  # noqa: E402
from bench_e2e.queues import instant_admission_check  # noqa: E402
from bench_e2e.recorder import KUEUE_GROUP, KUEUE_VERSION, WorkloadWatcher  # noqa: E402
from nexus_admit.kube.kueue import is_pending_on_check  # noqa: E402

FIELD_MANAGER = "bench-instant-check"
MESSAGE = "instant check (benchmark floor): Ready at once, nothing placed"
_APPLY = "application/apply-patch+yaml"


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def attempt(workload: Mapping[str, Any]) -> tuple[str, str] | None:
    """(uid, when quota was reserved) when the Workload waits on this check, else None:
    one answer per quota reservation, however many events show it still Pending."""
    if not is_pending_on_check(workload, {CHECK}):
        return None
    reserved = next(
        (c.get("lastTransitionTime") or "" for c in (workload.get("status") or {})
         .get("conditions") or [] if c.get("type") == "QuotaReserved"),
        "",
    )
    return str(workload["metadata"].get("uid") or ""), str(reserved)


def ready_entry(now: str) -> dict[str, Any]:
    """Our entry of `status.admissionChecks`, Ready."""
    return {"name": CHECK, "state": "Ready", "message": MESSAGE, "lastTransitionTime": now}


class InstantCheck(WorkloadWatcher):
    """Answers every Workload of the namespace that waits on the check, from the watch;
    the writes go out on a few threads so that one slow write holds up nothing else."""

    def __init__(self, kubeconfig: str, namespace: str, writers: int = 4):
        super().__init__(kubeconfig, namespace, {})
        self.pool = cf.ThreadPoolExecutor(writers)
        self.answered: set[tuple[str, str]] = set()
        self.lock = threading.Lock()
        self.writes = self.failed = 0

    def seen(self, wl: dict[str, Any], now: float) -> None:
        key = attempt(wl)
        if key is None:
            return
        with self.lock:
            if key in self.answered:
                return
            self.answered.add(key)
        self.pool.submit(self.answer, wl, key)

    def answer(self, wl: Mapping[str, Any], key: tuple[str, str]) -> None:
        m = wl["metadata"]
        body = {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "Workload",
            "metadata": {"name": m["name"], "namespace": m["namespace"]},
            "status": {"admissionChecks": [ready_entry(_stamp())]},
        }
        try:
            self.custom.patch_namespaced_custom_object_status(
                KUEUE_GROUP, KUEUE_VERSION, m["namespace"], "workloads", m["name"], body,
                field_manager=FIELD_MANAGER, force=True, _content_type=_APPLY,
            )
        except Exception as e:  # an API error or a lost connection
            with self.lock:  # its next event, or the watch's next list, answers it again
                self.failed += 1
                self.answered.discard(key)
            why = f"{e.status} {e.reason}" if isinstance(e, client.ApiException) else repr(e)
            print(f"instant-check: {m['namespace']}/{m['name']}: {why}",
                  file=sys.stderr, flush=True)
            return
        with self.lock:
            self.writes += 1

    def mark_active(self) -> None:
        check = instant_admission_check()
        body = {
            "apiVersion": check["apiVersion"],
            "kind": check["kind"],
            "metadata": check["metadata"],
            "status": {"conditions": [{
                "type": "Active", "status": "True", "reason": "Active",
                "message": "the benchmark's instant check is running",
                "lastTransitionTime": _stamp(),
            }]},
        }
        self.custom.patch_cluster_custom_object_status(
            KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", CHECK, body,
            field_manager=FIELD_MANAGER, force=True, _content_type=_APPLY,
        )


def start(kubeconfig: str, namespace: str, log_path: Path) -> subprocess.Popen[bytes]:
    """This module as its own process, answering in `namespace`; its output to `log_path`.
    Returns once it watches (it marked its AdmissionCheck Active before)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--kubeconfig", kubeconfig, "--namespace", namespace],
            stdout=out, stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while b"instant-check: watching" not in log_path.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the instant check did not start:\n{tail}")
        time.sleep(0.1)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--namespace", required=True)
    args = ap.parse_args(argv)
    checker = InstantCheck(args.kubeconfig, args.namespace)
    checker.mark_active()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    checker.start()
    checker.listed.wait(30)
    print("instant-check: watching", args.namespace, flush=True)
    while not stopping.wait(0.5):  # the handler runs between waits
        pass
    checker.stop()
    checker.pool.shutdown(wait=True)
    print(f"instant-check: {checker.writes} answered, {checker.failed} writes failed",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
