"""ComputeDomains (multi-node NVLink) and the DRA allocator's last word, on the real control
plane.

The fleet (e2e/dra_harness.py): two NVLink cliques of 4 KWOK nodes each (label
`nvidia.com/gpu.clique`, one rack each) and a rack of 2 nodes in no clique, every node with 8
GPUs published as NVIDIA's DRA driver publishes them; the clique nodes also publish the
ComputeDomain channel device NVIDIA's ComputeDomain kubelet plugin publishes (driver
`compute-domain.nvidia.com`, `channel-0`), which the DeviceClass
`compute-domain-default-channel.nvidia.com` selects. A ComputeDomain gang's pods name the
channel ResourceClaimTemplate its ComputeDomain has (the test creates it, as NVIDIA's
ComputeDomain controller would); kube-scheduler's DRA allocator allocates GPUs and channel
on the node nexus pinned, KWOK runs the pods. The claims' statuses are the evidence.

Then a pod pinned by nexus whose node's GPU slice is withdrawn, or republished with another
product than its claim's selector asks, before it is bound (the test holds its pods with a
scheduling gate of its own until the slice changed): the allocator cannot allocate its claim
there, and nexus sends the gang back through Retry saying so.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

import dra_harness as H
import pytest
from dra_harness import (
    CD_DRIVER,
    RR,
    channel_template,
    claim_devices,
    claim_job,
    claim_template,
    claims,
    events,
    running_pods,
)
from e2e_util import wait_for
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900, func_only=True)]

GB200 = ("NVIDIA GB200", "189471Mi", "Blackwell")
CLIQUES = {"nvl-a": "e2e-fabric.1", "nvl-b": "e2e-fabric.2"}
FLEET = [H.DraNode(f"{prefix}-{i}", f"{prefix}-rack", *GB200, clique=clique)
         for prefix, clique in CLIQUES.items() for i in range(4)]
FLEET += [H.DraNode(f"nvl-x-{i}", "nvl-x-rack", *GB200) for i in range(2)]
NODES = {n.name: n for n in FLEET}
HOLD = "e2e.kubenexus.io/hold"  # the test's own gate: nexus pins, the test lets go


@pytest.fixture(scope="module")
def nvl_fleet(e2e_cluster: Any, kube_api) -> Any:
    H.bring_up(e2e_cluster, kube_api, FLEET)
    yield
    H.tear_down(e2e_cluster, kube_api, FLEET)


@pytest.fixture
def nvl_ns(nvl_fleet: Any, nexus_controller: Any, e2e_namespace: str, custom_objects,
           batch_v1) -> Any:
    H.local_queue(custom_objects, e2e_namespace, NODES)
    yield e2e_namespace
    batch_v1.delete_collection_namespaced_job(e2e_namespace, propagation_policy="Background")


def clique_of(node: str) -> str | None:
    return NODES[node].clique


def pods_held(custom, ns: str) -> dict[str, list[tuple[str, str, str]]]:
    """Pod → (driver, node, device) of every device its claims' allocations hold."""
    held: dict[str, list[tuple[str, str, str]]] = {}
    for c in claims(custom, ns):
        owners = [r["name"] for r in (c.get("status") or {}).get("reservedFor") or []]
        results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {})
        for r in results.get("results") or []:
            for pod in owners:
                held.setdefault(pod, []).append((r["driver"], r["pool"], r["device"]))
    return held


def start_gang(batch, ns: str, name: str, pods: int, channel: str | None) -> None:
    claim_job(batch, ns, name, pods=pods, template="eight-gpus", channel=channel)


def wait_running(core, ns: str, job: str, pods: int) -> list[client.V1Pod]:
    t0 = time.monotonic()
    up = wait_for(f"the {pods} pods of {job} Running", lambda: (
        p if len(p := running_pods(core, ns, job)) == pods else None), timeout=180)
    print(f"[cliques] {job}: {pods} pods Running {time.monotonic() - t0:.1f} s after submit")
    return up


def test_compute_domain_gangs_take_one_nvlink_clique_each(
    nvl_ns: str, batch_v1, core_v1, custom_objects
) -> None:
    ns = nvl_ns
    claim_template(custom_objects, ns, "eight-gpus", H.GPUS_PER_NODE)
    for cd in ("cd-one", "cd-two", "cd-three"):
        channel_template(custom_objects, ns, f"{cd}-channel", f"uid-{cd}")
    # one plain pod in each clique: neither is pristine, both have 3 free nodes
    for prefix in CLIQUES:
        claim_job(batch_v1, ns, f"fill-{prefix}", pods=1, template="eight-gpus",
                  node_selector={"kubernetes.io/hostname": f"{prefix}-0"})
    for prefix in CLIQUES:
        wait_running(core_v1, ns, f"fill-{prefix}", 1)

    # the first ComputeDomain gang: 2 × 8 GPUs inside one clique, the other left whole
    start_gang(batch_v1, ns, "cd-one", 2, "cd-one-channel")
    one = {p.metadata.name: p.spec.node_name for p in wait_running(core_v1, ns, "cd-one", 2)}
    cliques = {clique_of(n) for n in one.values()}
    assert len(cliques) == 1 and None not in cliques, one
    taken = cliques.pop()
    held = pods_held(custom_objects, ns)
    for pod, node in one.items():  # GPUs and channel allocated on the node nexus pinned
        assert {(d, n) for d, n, _ in held[pod]} == {(H.DRIVER, node), (CD_DRIVER, node)}, held
        assert sum(1 for d, _, _ in held[pod] if d == H.DRIVER) == H.GPUS_PER_NODE
    other = [n for n, spec in NODES.items() if spec.clique not in (None, taken)]
    busy_other = {n for devices in held.values() for _, n, _ in devices if n in other}
    assert len(busy_other) == 1, busy_other  # only the plain pod in the other clique
    rrs = custom_objects.list_namespaced_custom_object(*RR[:2], ns, RR[2])["items"]
    domains = {rr["metadata"]["name"]: rr["metadata"].get("annotations", {}).get(
        "scheduling.kubenexus.io/compute-domain") for rr in rrs}
    assert f"{ns}/cd-one-channel" in domains.values(), domains

    # a second ComputeDomain of one pod: the first one's clique has a free node (filling it
    # would keep the other clique's 3 free nodes whole), but a clique holds one
    # ComputeDomain: it goes to the other clique
    start_gang(batch_v1, ns, "cd-two", 1, "cd-two-channel")
    two = {p.spec.node_name for p in wait_running(core_v1, ns, "cd-two", 1)}
    assert {clique_of(n) for n in two} == {clique_of(other[0])}, two

    # a third finds no clique free of other ComputeDomains: both cliques have free nodes,
    # the rack without a clique has no channel; it waits (Retry)
    start_gang(batch_v1, ns, "cd-three", 1, "cd-three-channel")
    retry = wait_for("cd-three answered Retry", lambda: next(
        (e for e in events(core_v1, ns, "PlacementRetry") if "cd-three" in
         e.involved_object.name), None), timeout=120)
    assert "NVLink cliques other ComputeDomains hold" in retry.message, retry.message
    assert not running_pods(core_v1, ns, "cd-three")
    print(f"[cliques] cd-three: {retry.message}")


@pytest.mark.parametrize("change", ["withdrawn", "product-changed"])
def test_a_slice_changed_before_binding_sends_the_gang_to_retry_with_the_reason(
    change: str, nvl_ns: str, batch_v1, core_v1, custom_objects
) -> None:
    """The node's GPU slice is withdrawn, or republished with another product than the
    claim's selector asks (a driver upgrade relabelling its devices), after nexus placed the
    pod there and before it is bound."""
    ns = nvl_ns
    product = f'device.attributes["{H.DRIVER}"].productName == "{GB200[0]}"'
    claim_template(custom_objects, ns, "two-gpus", 2, product)
    claim_job(batch_v1, ns, "held", pods=1, template="two-gpus", gates=[HOLD])

    def pinned() -> tuple[client.V1Pod, str] | None:
        for p in core_v1.list_namespaced_pod(ns, label_selector="job-name=held").items:
            gates = [g.name for g in p.spec.scheduling_gates or []]
            node = (p.spec.node_selector or {}).get("kubernetes.io/hostname")
            if node and gates == [HOLD]:
                return p, node
        return None

    pod, node = wait_for("the held pod pinned by nexus (only the test's gate left)", pinned,
                         timeout=120)
    name = H.slice_name(node)
    if change == "withdrawn":
        custom_objects.delete_cluster_custom_object(*H.RESOURCE, "resourceslices", name)
    else:
        relabelled = H.gpu_slice(replace(NODES[node], product="NVIDIA B200"), generation=2)
        current = custom_objects.get_cluster_custom_object(*H.RESOURCE, "resourceslices", name)
        relabelled["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        custom_objects.replace_cluster_custom_object(*H.RESOURCE, "resourceslices", name,
                                                     relabelled)
    try:
        t0 = time.monotonic()
        core_v1.patch_namespaced_pod(pod.metadata.name, ns,
                                     [{"op": "remove", "path": "/spec/schedulingGates"}])
        retry = wait_for("the gang answered Retry with the allocator's reason", lambda: next(
            (e for e in events(core_v1, ns, "PlacementRetry")
             if "DRA allocator cannot allocate" in (e.message or "")), None), timeout=180)
        print(f"[cliques] {change}: Retry {time.monotonic() - t0:.1f} s after the gate was "
              f"lifted: {retry.message}")
        assert f"pinned to node {node}" in retry.message, retry.message
        assert "cannot allocate all claims" in retry.message, retry.message
        # the Released Event follows the reservation's delete, which follows the Retry
        # write: under load the test can read the Events in between
        wait_for("the reservation released with the allocator's reason", lambda: [
            e for e in events(core_v1, ns, "PlacementReleased")
            if "DRA allocator" in (e.message or "")], timeout=60)
        assert not [d for c in claims(custom_objects, ns) for d in claim_devices(c)
                    if d[0] == node]
    finally:
        with contextlib.suppress(client.ApiException):
            custom_objects.delete_cluster_custom_object(*H.RESOURCE, "resourceslices", name)
        wait_for("the changed slice gone", lambda: name not in {
            s["metadata"]["name"] for s in custom_objects.list_cluster_custom_object(
                *H.RESOURCE, "resourceslices")["items"]}, timeout=30)
        custom_objects.create_cluster_custom_object(*H.RESOURCE, "resourceslices",
                                                    H.gpu_slice(NODES[node]))
