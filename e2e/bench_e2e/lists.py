#!/usr/bin/env python3
"""List times and start-up on the real control plane: the controller's own list of many
pods, whole and in pages, and a controller's start-up with them in the store.

    python e2e/bench_e2e/lists.py --pods 5000 --json docs/data/lists-e2e.json

1. The control plane comes up (or is reused: `e2e/cluster.py`); `--pods` pods, copies of
   the real pod in `nexus_admit/data/live/objects.json` (no GPUs, no labels of ours), are
   created in one namespace, bound by name to the fleet's KWOK nodes (KWOK runs them; no
   scheduler involved), unless that many are there already.
2. `KubeApi.list("Pod")` is timed `--repeats` times per page size (0: one unpaginated GET)
   with the store's stripping as `keep` (what the controller does) and without it.
3. nexus-admit starts against that plane; from the process start: the webhook serving
   (`/readyz`), and the fleet listed (its log's "store synced in"); its RSS 5 s later.

Prints a table and writes JSON. Figures are measured, never asserted; the namespace is left
for the next run (`--clean` deletes it).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import copy
import json
import re
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

E2E_DIR = Path(__file__).resolve().parent.parent
if str(E2E_DIR) not in sys.path:
    sys.path.insert(0, str(E2E_DIR))

import cluster as cluster_mod  # noqa: E402
from kubernetes import client, config  # noqa: E402
from nexus_controller import NexusController  # noqa: E402

from nexus_admit.bench.memory import templates  # noqa: E402
from nexus_admit.controller.api import KubeApi, load_api_client  # noqa: E402
from nexus_admit.kube.stored import stripped  # noqa: E402

NAMESPACE = "bench-lists"


def pod_body(i: int, node: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    pod = copy.deepcopy(templates()["Pod"])
    meta = pod["metadata"]
    pod["metadata"] = {
        "name": f"listed-{i:06}",
        "namespace": namespace,
        "labels": {"app": namespace},
        "annotations": {
            k: v
            for k, v in (meta.get("annotations") or {}).items()
            if not k.startswith("scheduling.kubenexus.io")
        },
    }
    spec = pod["spec"]
    spec["nodeName"] = node
    spec.pop("schedulingGates", None)
    spec.pop("nodeSelector", None)
    spec.pop("volumes", None)  # the apiserver adds its service account token volume again
    for c in spec["containers"]:
        c["resources"] = {"requests": {"cpu": "1m", "memory": "1Mi"}}
        c.pop("volumeMounts", None)
    pod.pop("status", None)
    return dict(pod)


def ensure_pods(
    core: client.CoreV1Api, count: int, nodes: list[str], namespace: str = NAMESPACE
) -> None:
    """`count` pods in `namespace`, bound round-robin to `nodes` (those already there kept)."""
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    except client.ApiException as e:
        if e.status != 409:
            raise
    listed = core.list_namespaced_pod(namespace, limit=1)
    have = len(listed.items) + (listed.metadata.remaining_item_count or 0)
    if have >= count:
        return

    def create(i: int) -> None:
        try:
            core.create_namespaced_pod(namespace, pod_body(i, nodes[i % len(nodes)], namespace))
        except client.ApiException as e:
            if e.status != 409:
                raise

    started = time.perf_counter()
    with cf.ThreadPoolExecutor(16) as pool:
        list(pool.map(create, range(count)))
    print(f"created {count} pods in {time.perf_counter() - started:.0f} s", flush=True)


def time_lists(kubeconfig: str, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for page_size in (0, 500):
        for keep in (False, True):
            api = KubeApi(load_api_client(kubeconfig), list_page_size=page_size)
            seconds = []
            for _ in range(repeats):
                began = time.perf_counter()
                items, _ = api.list("Pod", partial(stripped, "Pod") if keep else None)
                seconds.append(time.perf_counter() - began)
                count = len(items)
                del items
            rows.append(
                {"pageSize": page_size, "stripped": keep, "pods": count, "seconds": sorted(seconds)}
            )
    return rows


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_up(c: Any) -> dict[str, float]:
    nc = NexusController(c, gate_mode="webhook")
    nc.install()
    offset = nc.log_file.stat().st_size if nc.log_file.exists() else 0

    def this_run() -> str:  # the log file gathers every run: this one's lines only
        with open(nc.log_file, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    began = time.monotonic()
    nc.start(wait=False)
    try:
        while not nc.ready():
            time.sleep(0.05)
        ready = time.monotonic() - began
        while "store synced in" not in this_run():
            time.sleep(0.05)
        synced = time.monotonic() - began
        logged = re.findall(r"store synced in ([0-9.]+) s", this_run())
        time.sleep(5)  # kopf's own lists before its watches, then quiet
        return {
            "webhookServingSeconds": ready,
            "storeSyncedSeconds": synced,
            "fleetListLoggedSeconds": float(logged[-1]),
            "controllerRssMiB": _rss_mib(nc.proc.pid),
        }
    finally:
        nc.stop()
        nc.uninstall_webhook()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=Path("reports/lists-e2e.json"))
    ap.add_argument("--clean", action="store_true", help="delete the pods' namespace at the end")
    args = ap.parse_args()
    c = cluster_mod.Cluster()
    c.up()
    api_client = config.new_client_from_config(str(c.kubeconfig))
    core = client.CoreV1Api(api_client)
    nodes = [n.metadata.name for n in core.list_node(label_selector="type=kwok").items]
    ensure_pods(core, args.pods, nodes)
    result = {
        "pods": args.pods,
        "nodes": len(nodes),
        "lists": time_lists(str(c.kubeconfig), args.repeats),
        "startUp": start_up(c),
    }
    for row in result["lists"]:
        print(
            f"page {row['pageSize']:>4}  stripped {row['stripped']!s:5}  "
            f"{row['pods']} pods  median {row['seconds'][len(row['seconds']) // 2]:.2f} s"
        )
    print(f"start-up: {result['startUp']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    if args.clean:
        core.delete_namespace(NAMESPACE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
