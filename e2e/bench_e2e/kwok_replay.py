"""KWOK v0.8.0's replays provoked on a running plane: is each pod played Running once?

Each pod is created bound to a KWOK node and then labelled three times at once, so KWOK
often queues more than one resourceVersion of the still Pending pod before it plays
pod-ready; v0.8.0 plays each of them, the later ones on an old copy (a second Running
write with a new IP). With the benchmark's stage (`plane/components.played_once`,
NEXUS_E2E_KWOK_PLAY_ONCE=1 when the plane started) the apiserver refuses those (409).

    NEXUS_E2E_KWOK_PLAY_ONCE=1 NEXUS_E2E_KWOK_ONE_POD_IP=1 NEXUS_E2E_STATE=/tmp/kwok-exp \\
        .venv/bin/python e2e/cluster.py up
    .venv/bin/python e2e/bench_e2e/kwok_replay.py --state /tmp/kwok-exp --pods 400

Prints (and writes with --out) pods Running, pods patched once and more than once, and
KWOK's refused and failed plays for them. Measured in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kubernetes import client, config

from bench_e2e import stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", required=True, help="the plane's state directory")
    ap.add_argument("--pods", type=int, default=400)
    ap.add_argument("--namespace", default="kwok-replay")
    ap.add_argument("--settle-seconds", type=float, default=20.0)
    ap.add_argument("--out", help="also write the result as JSON here")
    args = ap.parse_args(argv)
    state = Path(args.state)
    config.load_kube_config(str(state / "kubeconfig"))
    v1 = client.CoreV1Api()
    nodes = [n.metadata.name for n in v1.list_node().items]
    v1.create_namespace({"metadata": {"name": args.namespace}})
    log = state / "logs" / "kwok.log"
    offset = log.stat().st_size

    def one(i: int) -> None:
        name = f"p{i:05d}"
        v1.create_namespaced_pod(args.namespace, {"metadata": {"name": name}, "spec": {
            "nodeName": nodes[i % len(nodes)],
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "busybox"}]}})
        for k in range(3):  # new resourceVersions while KWOK may not have played it yet
            v1.patch_namespaced_pod(name, args.namespace,
                                    {"metadata": {"labels": {f"touched-{k}": "yes"}}})

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(args.pods)))
    time.sleep(args.settle_seconds)
    pods = v1.list_namespaced_pod(args.namespace).items
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    patches = stats.kwok_status_patches(text, args.namespace)
    plays = stats.kwok_plays_failed(text, args.namespace)
    result = {
        "pods": args.pods,
        "running": sum(1 for p in pods if p.status.phase == "Running"),
        "patched_once": sum(1 for c in patches.values() if c == 1),
        "patched_more": sum(1 for c in patches.values() if c > 1),
        **plays,
    }
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    v1.delete_namespace(args.namespace)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
