"""`make demo`: nexus-admit placing three sample workloads on the local control plane.

    python3 e2e/demo.py          # what `make demo` runs; NEXUS_E2E_STATE picks the cluster

Brings the control plane up (cached binaries), installs nexus-admit's objects
(`NexusController.install`: CRDs, PlacementConfig `e2e`, AdmissionCheck `nexus-placement`,
ClusterQueues nexus-gold/silver/bronze), runs the controller in the background, applies
`config/samples/demo/` to a fresh namespace, waits until every sample is admitted with its
pods Running on their reserved nodes (earlier runs' namespaces are removed first), prints
the decisions (`kubectl describe workload`:
the check's message and the Events; `kubectl get rr`; the pods and their nodes), then stops
the controller and removes its webhook. The cluster stays up. Exit 1 when a sample is not
placed within the timeout, 2 when the cluster or the controller cannot start.

`e2e/tests/test_demo.py` runs the same samples through `submit` and `wait_placed`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

E2E_DIR = Path(__file__).resolve().parent
if str(E2E_DIR) not in sys.path:
    sys.path.insert(0, str(E2E_DIR))

import cluster as cluster_mod  # noqa: E402
from nexus_controller import CHECK_NAME, RESERVATION_LABEL, NexusController  # noqa: E402

from nexus_admit.kube import labels as L  # noqa: E402

REPO = E2E_DIR.parent
SAMPLES = REPO / "config" / "samples" / "demo"
SLOT_ANNOTATION = L.ANN_SLOT
PLACE_TIMEOUT = 180.0


def kubectl_json(cluster: Any, *args: str) -> dict[str, Any]:
    r = cluster.kubectl(*args, "-o", "json")
    return json.loads(r.stdout)


DEMO_PREFIX = "nexus-demo-"


def remove_namespace(cluster: Any, namespace: str) -> None:
    """Delete a demo namespace for good. KWOK runs no kubelet, so a deleted pod never
    reaches a terminal phase and Kueue keeps its finalizer on a plain-pod group's pods (the
    namespace would stay Terminating): their phase is set as a kubelet would set it."""
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "name", check=False).stdout
    for pod in pods.split():
        cluster.kubectl(
            "patch",
            pod,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status":{"phase":"Succeeded"}}',
            check=False,
        )


def remove_earlier_demos(cluster: Any) -> list[str]:
    """The namespaces of earlier `make demo` runs, whose reservations still hold GPUs."""
    names = cluster.kubectl("get", "namespaces", "-o", "name").stdout.split()
    earlier = [n.split("/", 1)[1] for n in names if n.startswith(f"namespace/{DEMO_PREFIX}")]
    for ns in earlier:
        remove_namespace(cluster, ns)
    return earlier


def submit(cluster: Any, namespace: str) -> None:
    """A fresh namespace with the samples in it (LocalQueues first: Kueue drops a Job
    whose queue does not exist yet only to a retry loop, never fails it)."""
    cluster.kubectl("create", "namespace", namespace)
    deadline = time.monotonic() + 60
    # pods cannot be created before the controller-manager made the default ServiceAccount
    while cluster.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode:
        if time.monotonic() > deadline:
            raise cluster_mod.ClusterError(f"no default ServiceAccount in {namespace}")
        time.sleep(0.3)
    for f in sorted(SAMPLES.glob("*.yaml")):
        cluster.kubectl("apply", "-n", namespace, "-f", str(f))


def _check(wl: dict[str, Any]) -> dict[str, Any]:
    entries = (wl.get("status") or {}).get("admissionChecks") or []
    return next((c for c in entries if c.get("name") == CHECK_NAME), {})


def _admitted(wl: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Admitted" and c.get("status") == "True"
        for c in (wl.get("status") or {}).get("conditions") or []
    )


def placement_problems(cluster: Any, namespace: str, expected: int = 3) -> list[str]:
    """What is not placed yet (empty when every sample's Workload is admitted and each of
    its pods Running on the node of the slot it holds)."""
    wls = kubectl_json(cluster, "get", "workloads.kueue.x-k8s.io", "-n", namespace)["items"]
    rrs = {
        r["metadata"]["name"]: r
        for r in kubectl_json(cluster, "get", "resourcereservations", "-n", namespace)["items"]
    }
    pods = kubectl_json(cluster, "get", "pods", "-n", namespace)["items"]
    out = [] if len(wls) >= expected else [f"{len(wls)}/{expected} Workloads created"]
    for wl in wls:
        name = wl["metadata"]["name"]
        check = _check(wl)
        if check.get("state") != "Ready" or not _admitted(wl):
            out.append(f"{name}: check {check.get('state')}, admitted {_admitted(wl)}")
            continue
        rr_name = (check.get("podSetUpdates") or [{}])[0].get("labels", {}).get(RESERVATION_LABEL)
        rr = rrs.get(rr_name or "")
        if rr is None:
            out.append(f"{name}: reservation {rr_name} not found")
            continue
        slots = {
            f"{ps['name']}/{s['index']}": s["node"]
            for ps in rr["spec"]["podSets"]
            for s in ps["slots"]
        }
        mine = [
            p for p in pods if p["metadata"].get("labels", {}).get(RESERVATION_LABEL) == rr_name
        ]
        on_slot = [
            p
            for p in mine
            if p["status"].get("phase") == "Running"
            and p["spec"].get("nodeName")
            == slots.get(p["metadata"].get("annotations", {}).get(SLOT_ANNOTATION, ""))
        ]
        if len(on_slot) != len(slots):
            out.append(f"{name}: {len(on_slot)}/{len(slots)} pods Running on their slots")
    return out


def wait_placed(cluster: Any, namespace: str, timeout: float = PLACE_TIMEOUT) -> list[str]:
    """Wait until every sample is placed; the problems left at the timeout (else [])."""
    deadline = time.monotonic() + timeout
    while True:
        problems = placement_problems(cluster, namespace)
        if not problems or time.monotonic() > deadline:
            return problems
        time.sleep(1)


def report(cluster: Any, namespace: str) -> str:
    """The decisions as an admin reads them."""
    parts = []
    wls = kubectl_json(cluster, "get", "workloads.kueue.x-k8s.io", "-n", namespace)["items"]
    for wl in sorted(wls, key=lambda w: w["metadata"]["name"]):
        name = wl["metadata"]["name"]
        described = cluster.kubectl("describe", "workload", "-n", namespace, name).stdout
        parts.append(f"$ kubectl describe workload -n {namespace} {name}\n{_decision(described)}")
    for args in (
        ("get", "rr", "-n", namespace),
        ("get", "pods", "-n", namespace, "-o", "wide"),
    ):
        out = cluster.kubectl(*args).stdout
        parts.append(f"$ kubectl {' '.join(args)}\n{out}")
    return "\n".join(parts)


def _decision(described: str) -> str:
    """The parts of `kubectl describe workload` that show our decision: the name and queue,
    the admission check entry, and the Events."""
    keep: list[str] = []
    block_indent = 0  # inside a kept block: the least indentation of its lines
    for line in described.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if block_indent and line.strip() and indent >= block_indent:
            keep.append(line)
            continue
        block_indent = 0
        if line.startswith(("Name:", "Namespace:", "  Queue Name:")):
            keep.append(line)
        elif line.startswith("  Admission Checks:"):
            keep.append(line)
            block_indent = 4
        elif line.startswith("Events:"):
            keep.append(line)
            block_indent = 2
    return "\n".join(keep) + "\n"


def main() -> int:
    t0 = time.monotonic()
    c = cluster_mod.Cluster()
    try:
        c.up()
    except cluster_mod.ClusterError as e:
        print(f"demo: could not bring up the control plane: {e}", file=sys.stderr)
        return 2
    nc = NexusController(c, name="nexus-admit-demo")
    try:
        nc.install()
        nc.start()
    except (cluster_mod.ClusterError, subprocess.CalledProcessError) as e:
        nc.stop()
        nc.uninstall_webhook()
        print(f"demo: nexus-admit did not start: {e}", file=sys.stderr)
        return 2
    namespace = f"{DEMO_PREFIX}{uuid.uuid4().hex[:5]}"
    try:
        earlier = remove_earlier_demos(c)
        if earlier:
            print(f"demo: removing the namespaces of earlier runs: {', '.join(earlier)}")
        print(f"demo: controller running (log {nc.log_file}); samples → namespace {namespace}")
        submit(c, namespace)
        problems = wait_placed(c, namespace)
        print(report(c, namespace))
    finally:
        nc.stop()
        nc.uninstall_webhook()  # it fails closed: it must not outlive the controller
    took = time.monotonic() - t0
    if problems:
        print(
            f"demo: NOT placed after {PLACE_TIMEOUT:.0f}s:", *problems, sep="\n  ", file=sys.stderr
        )
        print(f"controller log: {nc.log_file}", file=sys.stderr)
        return 1
    print(
        f"demo: all 3 samples placed and Running on their reserved nodes ({took:.0f}s). "
        f"The controller is stopped; the cluster stays up:\n"
        f"  export KUBECONFIG={c.kubeconfig}\n"
        f"  kubectl get rr -A\n"
        f"  make cluster-down      # stop it (NEXUS_E2E_STATE={c.state})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
