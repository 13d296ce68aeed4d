"""GPUs through Dynamic Resource Allocation on the real control plane.

The test adds eight KWOK nodes without `nvidia.com/gpu` (e2e/dra_harness.py) and publishes
their GPUs as ResourceSlices the way NVIDIA's DRA driver does (driver `gpu.nvidia.com`, one
device per GPU with `productName`, `architecture`, `index` and capacity `memory`): rack
`dra-ra` holds 4 nodes of 8 H200 (141 GB), rack `dra-rb` 4 nodes of 8 L40S (48 GB). The
DeviceClass `gpu.nvidia.com` selects that driver (e2e/manifests/dra.yaml), Kueue counts the
claims' devices as `nvidia.com/gpu` (deviceClassMappings), nexus places the gangs, the
ungater pins the nodes, kube-scheduler's DRA allocator allocates the claims there and KWOK
runs the pods (it does not prepare devices; the pods reach Running all the same). The
claims' statuses are the evidence: which device of which node each pod holds.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import dra_harness as H
import pytest
from dra_harness import (
    GPUS_PER_NODE,
    RR,
    claim_devices,
    claim_job,
    claim_template,
    claims,
    retried,
    running_pods,
)
from e2e_util import WaitTimeout, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900, func_only=True)]

DRIVER = H.DRIVER
MEM80 = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("80Gi")) >= 0'
UNREADABLE = f'device.attributes["{DRIVER}"].architecture == "Hopper"'
# rack → (product, memory, architecture); 4 nodes of 8 GPUs each
RACKS = {
    "dra-ra": ("NVIDIA H200", "143771Mi", "Hopper"),
    "dra-rb": ("NVIDIA L40S", "46068Mi", "Ada"),
}
FLEET = [H.DraNode(f"{rack}-{i}", rack, *RACKS[rack]) for rack in RACKS for i in range(4)]
NODES = {n.name: n.rack for n in FLEET}


@pytest.fixture(scope="module")
def dra_fleet(e2e_cluster: Any, kube_api) -> Any:
    """The DRA nodes, their ResourceSlices and the module's Kueue and nexus objects."""
    H.bring_up(e2e_cluster, kube_api, FLEET)
    yield
    H.tear_down(e2e_cluster, kube_api, FLEET)


@pytest.fixture
def dra_ns(dra_fleet: Any, nexus_controller: Any, e2e_namespace: str, custom_objects,
           batch_v1) -> Any:
    H.local_queue(custom_objects, e2e_namespace, NODES)
    yield e2e_namespace
    batch_v1.delete_collection_namespaced_job(e2e_namespace, propagation_policy="Background")


def allocated_devices(custom) -> list[tuple[str, str]]:
    return H.allocated_devices(custom, NODES)


def test_gang_through_claim_template_lands_in_one_rack_on_its_reserved_nodes(
    dra_ns: str, batch_v1, core_v1, custom_objects
) -> None:
    ns = dra_ns
    claim_template(custom_objects, ns, "four-gpus", 4)
    claim_job(batch_v1, ns, "gang", pods=2, template="four-gpus", rack_required=True)
    pods = wait_for("the 2 gang pods Running", lambda: (
        p if len(p := running_pods(core_v1, ns, "gang")) == 2 else None), timeout=180)
    nodes = {p.metadata.name: p.spec.node_name for p in pods}
    assert set(nodes.values()) <= set(NODES)
    assert len({NODES[n] for n in nodes.values()}) == 1, nodes  # one rack
    rrs = custom_objects.list_namespaced_custom_object(*RR[:2], ns, RR[2])["items"]
    reserved = {s["node"] for rr in rrs for ps in rr["spec"]["podSets"] for s in ps["slots"]}
    assert set(nodes.values()) == reserved
    held = {}
    for c in claims(custom_objects, ns):
        owner = [r["name"] for r in c["status"].get("reservedFor") or []]
        devices = claim_devices(c)
        assert len(devices) == 4 and len({d[0] for d in devices}) == 1, c["status"]
        held[owner[0]] = devices[0][0]
    assert held == nodes  # each pod's claim is allocated on the node nexus reserved for it


def test_devices_held_by_claims_are_never_promised_again(
    dra_ns: str, batch_v1, core_v1, custom_objects
) -> None:
    ns = dra_ns
    claim_template(custom_objects, ns, "eight-gpus", GPUS_PER_NODE)
    jobs = [f"burst-{i}" for i in range(len(NODES) + 2)]  # 80 GPUs asked, 64 exist
    for name in jobs:
        claim_job(batch_v1, ns, name, pods=1, template="eight-gpus")

    def settled() -> bool:
        up = sum(len(running_pods(core_v1, ns, j)) for j in jobs)
        return up == len(NODES) and len(retried(core_v1, ns)) >= 1

    try:
        wait_for("every DRA node running one burst pod, the rest answered Retry", settled,
                 timeout=300)
    except WaitTimeout as e:
        raise WaitTimeout(f"{e}; allocated {len(allocated_devices(custom_objects))}") from None
    devices = allocated_devices(custom_objects)
    doubled = [d for d, n in Counter(devices).items() if n > 1]
    assert not doubled, doubled
    assert len(devices) == len(NODES) * GPUS_PER_NODE
    assert all(n == GPUS_PER_NODE for n in Counter(d[0] for d in devices).values())
    waiting = [j for j in jobs if not running_pods(core_v1, ns, j)]
    assert len(waiting) == 2
    for j in waiting:  # never bound: their pods hold no node
        pods = core_v1.list_namespaced_pod(ns, label_selector=f"job-name={j}").items
        assert not [p.metadata.name for p in pods if p.spec.node_name]


def test_an_80gib_selector_never_lands_on_48gib_devices(
    dra_ns: str, batch_v1, core_v1, custom_objects
) -> None:
    ns = dra_ns
    claim_template(custom_objects, ns, "big-eight", GPUS_PER_NODE, MEM80)
    claim_job(batch_v1, ns, "big", pods=4, template="big-eight")
    pods = wait_for("the 4 pods asking 80 GiB devices Running", lambda: (
        p if len(p := running_pods(core_v1, ns, "big")) == 4 else None), timeout=180)
    assert {NODES[p.spec.node_name] for p in pods} == {"dra-ra"}
    # the 141 GB rack is full now: one more such pod waits (Retry), 48 GB GPUs stay free
    claim_template(custom_objects, ns, "big-one", 1, MEM80)
    claim_job(batch_v1, ns, "one-more", pods=1, template="big-one")
    wait_for("one-more answered Retry", lambda: any(
        "one-more" in w for w in retried(core_v1, ns)), timeout=120)
    assert not running_pods(core_v1, ns, "one-more")
    assert {n for n, _ in allocated_devices(custom_objects)} == {
        n for n, r in NODES.items() if r == "dra-ra"}


def test_a_selector_nexus_cannot_read_is_rejected_naming_the_field(
    dra_ns: str, batch_v1, core_v1, custom_objects
) -> None:
    ns = dra_ns
    claim_template(custom_objects, ns, "hopper", 2, UNREADABLE)
    claim_job(batch_v1, ns, "unreadable", pods=1, template="hopper")
    # Kueue deactivates a Rejected Workload at once; nexus's Event on it keeps the message
    message = wait_for("the check Rejected", lambda: next(
        (e.message for e in core_v1.list_namespaced_event(ns).items
         if e.reason == "PlacementRejected" and "unreadable" in e.involved_object.name), None),
        timeout=120)
    assert "selectors[0].cel.expression" in message, message
    assert "cannot read the selector" in message, message
    assert "ResourceClaimTemplate" in message and "/hopper" in message, message
    assert not allocated_devices(custom_objects)
