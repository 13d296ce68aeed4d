"""Offline: what one controller pass costs after a single Workload's event, against how
many Workloads the store holds. No cluster: the controller's real pass (`loop/cycle.
reconcile`, the nexus engine, warming included) runs on an in-memory API
(`tests/controller/fake_api.FakeApi`), over 20 nodes, with `--workloads` Workloads waiting
for quota in a ClusterQueue that uses the check (each with its Job, as Kueue makes them).

A pass runs on every batch of watch events, and Kueue writes a Workload's status several
times in its life; a pass that walks every Workload on each of those grows with the queue.
Each measured pass follows one Workload's new version (a label changed); the thread's CPU
time is what is reported.

    python e2e/bench_e2e/pass_bench.py --workloads 300 1000 5000 --out docs/data/pass-cost.json
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nexus_admit.controller.context import Context
from nexus_admit.controller.loop.cycle import reconcile
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.store import WATCHED_KINDS
from nexus_admit.placement.policies import make_policy
from tests.controller.fake_api import FakeApi
from tests.kube.kube_factories import (
    admission_check,
    cluster_queue,
    local_queue,
    node,
    pod_set,
    workload,
)


def cluster(waiting: int) -> FakeApi:
    api = FakeApi()
    for i in range(20):
        api.put(node(f"n{i}"))
    cq = cluster_queue("cq", "gold")
    cq["spec"] = {"admissionChecksStrategy": {"admissionChecks": [{"name": "nexus"}]}}
    api.put(cq)
    api.put(local_queue("default", "q", "cq"))
    api.put(admission_check("nexus"))
    for i in range(waiting):
        created = f"2026-11-25T{10 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
        wl = workload(f"w{i}", [pod_set(count=2, gpus=4)], conditions={}, cluster_queue=None,
                      created=created)
        wl["status"]["admissionChecks"] = []
        api.put(wl)
        api.put({"apiVersion": "batch/v1", "kind": "Job",
                 "metadata": {"name": f"w{i}", "namespace": "default", "uid": "u",
                              "resourceVersion": "1"},
                 "spec": {"completionMode": "Indexed"}})
    return api


async def measure(waiting: int, passes: int) -> dict[str, Any]:
    api = cluster(waiting)
    ctx = Context(options=RunOptions(webhook=False), api=api, engine=make_policy("nexus"))  # type: ignore[arg-type]
    for kind in WATCHED_KINDS:
        ctx.store.replace(kind, api.list(kind)[0], None)
    ctx.leadership.synced = True
    await reconcile(ctx)  # the first pass derives everything
    await reconcile(ctx)
    gc.collect()
    cpu: list[float] = []
    for k in range(passes):
        wl = copy.deepcopy(api.get("Workload", f"w{k % waiting}", "default"))
        wl["metadata"]["resourceVersion"] = str(10_000_000 + k)
        wl["metadata"].setdefault("labels", {})["touched"] = str(k)
        ctx.store.upsert("Workload", wl)
        started = time.thread_time()
        await reconcile(ctx)
        cpu.append(time.thread_time() - started)
    cpu.sort()
    return {"workloads_waiting": waiting, "passes": passes,
            "pass_cpu_ms": {"p50": round(cpu[len(cpu) // 2] * 1000, 2),
                            "p90": round(cpu[int(0.9 * len(cpu))] * 1000, 2),
                            "mean": round(statistics.fmean(cpu) * 1000, 2)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", type=int, nargs="+", default=[300, 1000, 5000])
    ap.add_argument("--passes", type=int, default=40)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results = []
    for n in args.workloads:
        row = asyncio.run(measure(n, args.passes))
        results.append(row)
        c = row["pass_cpu_ms"]
        print(f"{n:>6} Workloads waiting | a pass after one Workload's event: CPU p50 "
              f"{c['p50']} ms, p90 {c['p90']} ms, mean {c['mean']} ms", flush=True)
    report = {
        "what": "CPU time of one controller pass after one Workload's event, by how many "
                "Workloads wait for quota (in-memory API, 20 nodes)",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_1m": round(os.getloadavg()[0], 2)},
        "results": results,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
