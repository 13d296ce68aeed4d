"""DRA device taints (GA in Kubernetes 1.37) on the real control plane: a GPU whose
ResourceSlice device carries a NoSchedule taint is not placed on unless the claim tolerates it.

Two KWOK nodes of 8 GPUs published as ResourceSlices (e2e/dra_harness.py): on `dra-taint-0`
six of the eight devices carry the taint `e2e.kubenexus.io/unhealthy=xid-79:NoSchedule`,
`dra-taint-1` is clean. kube-scheduler's allocator never gives a tainted device to a claim
that does not tolerate it, so a pod nexus pinned to `dra-taint-0` for more GPUs than its two
clean ones would stay Pending there; nexus must count only the devices the claim may take.
Evidence: the node each pod runs on and the devices its claim holds.

Runs on a plane that keeps device taints (1.36 on; before, the DRADeviceTaints gate is off
and the apiserver drops them, and the module skips).
"""

from __future__ import annotations

import contextlib
from typing import Any

import dra_harness as H
import pytest
from dra_harness import (
    GPUS_PER_NODE,
    claim_devices,
    claim_job,
    claim_template,
    claims,
    retried,
    running_pods,
)
from e2e_util import wait_for
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900, func_only=True)]

H100 = ("NVIDIA H100 80GB HBM3", "81559Mi", "Hopper")
TAINTED = H.DraNode("dra-taint-0", "dra-taint-rack", *H100, tainted=tuple(range(6)))
CLEAN = H.DraNode("dra-taint-1", "dra-taint-rack", *H100)
FLEET = [TAINTED, CLEAN]
NODES = {n.name for n in FLEET}
TOLERATE = {"key": H.UNHEALTHY["key"], "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def taint_fleet(e2e_cluster: Any, kube_api) -> Any:
    H.bring_up(e2e_cluster, kube_api, FLEET)
    sl = client.CustomObjectsApi(kube_api).get_cluster_custom_object(
        *H.RESOURCE, "resourceslices", H.slice_name(TAINTED.name))
    kept = [d for d in sl["spec"]["devices"] if d.get("taints")]
    if len(kept) != len(TAINTED.tainted):
        H.tear_down(e2e_cluster, kube_api, FLEET)
        pytest.skip("this apiserver drops ResourceSlice device taints (DRADeviceTaints off)")
    yield
    H.tear_down(e2e_cluster, kube_api, FLEET)


@pytest.fixture
def taint_ns(taint_fleet: Any, nexus_controller: Any, e2e_namespace: str, custom_objects,
             batch_v1) -> Any:
    H.local_queue(custom_objects, e2e_namespace, NODES)
    yield e2e_namespace
    batch_v1.delete_collection_namespaced_job(e2e_namespace, propagation_policy="Background")


def _held(custom, ns: str, pod: str) -> list[tuple[str, str]]:
    """(node, device) of the GPUs the pod's claim holds."""
    return [d for c in claims(custom, ns)
            for d in claim_devices(c)
            if any(r["name"] == pod for r in c["status"].get("reservedFor") or [])]


def _retries(core, ns: str, job: str) -> list[str]:
    return [e.message for e in H.events(core, ns, "PlacementRetry")
            if job in e.involved_object.name]


def test_a_tainted_gpu_is_given_only_to_a_claim_that_tolerates_it(
    taint_ns: str, batch_v1, core_v1, custom_objects
) -> None:
    ns = taint_ns
    tainted = {f"gpu-{i}" for i in TAINTED.tainted}

    # a whole node's worth: only the clean node has eight GPUs this claim may take
    claim_template(custom_objects, ns, "eight", GPUS_PER_NODE)
    claim_job(batch_v1, ns, "whole", pods=1, template="eight")
    (pod,) = wait_for("the 8-GPU pod Running", lambda: (
        p if len(p := running_pods(core_v1, ns, "whole")) == 1 else None), timeout=180)
    assert pod.spec.node_name == CLEAN.name

    # four more: the tainted node's two clean GPUs are too few, so nexus answers Retry
    # instead of pinning the pod where the allocator cannot serve it
    claim_template(custom_objects, ns, "four", 4)
    claim_job(batch_v1, ns, "untolerated", pods=1, template="four")
    wait_for("the untolerating Workload answered Retry", lambda: any(
        "untolerated" in w for w in retried(core_v1, ns)), timeout=120)
    said = _retries(core_v1, ns, "untolerated")
    # for want of capacity, not because a pod pinned there could not be scheduled
    assert all("free capacity for 0" in m and "cannot be scheduled" not in m for m in said), said

    # the same four GPUs asked by a claim that tolerates the taint: placed on the tainted node
    claim_template(custom_objects, ns, "four-tolerant", 4, tolerations=[TOLERATE])
    claim_job(batch_v1, ns, "tolerant", pods=1, template="four-tolerant")
    (pod,) = wait_for("the tolerating pod Running", lambda: (
        p if len(p := running_pods(core_v1, ns, "tolerant")) == 1 else None), timeout=180)
    assert pod.spec.node_name == TAINTED.name
    held = _held(custom_objects, ns, pod.metadata.name)
    assert len(held) == 4 and {n for n, _ in held} == {TAINTED.name}, held

    # the untolerating pod was never bound, and no device of its claim is a tainted one
    pods = core_v1.list_namespaced_pod(ns, label_selector="job-name=untolerated").items
    assert not [p.metadata.name for p in pods if p.spec.node_name]
    untolerated = [d for p in pods for d in _held(custom_objects, ns, p.metadata.name)]
    assert not [d for d in untolerated if d[1] in tainted]
    said = _retries(core_v1, ns, "untolerated")
    assert all("cannot be scheduled" not in m for m in said), said


def _taint_rule(custom, name: str, pool: str) -> None:
    """A DeviceTaintRule (resource.k8s.io/v1, GA in 1.37) tainting every GPU of `pool`, as
    an admin or a health controller taints a node's devices without touching its slices."""
    custom.create_cluster_custom_object(*H.RESOURCE, "devicetaintrules", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {"deviceSelector": {"driver": H.DRIVER, "pool": pool},
                 "taint": dict(H.UNHEALTHY)},
    })


def test_a_device_taint_rule_keeps_an_untolerating_claim_off_the_devices_it_selects(
    taint_ns: str, batch_v1, core_v1, custom_objects
) -> None:
    ns = taint_ns
    rule = "clean-node-drained"
    try:
        _taint_rule(custom_objects, rule, CLEAN.name)
    except client.ApiException as e:
        if e.status == 404:
            pytest.skip("this apiserver does not serve resource.k8s.io/v1 DeviceTaintRules")
        raise
    try:
        # every GPU of the clean node is now tainted by the rule, six of the other by its
        # slice: no node has four GPUs this claim may take now, so it waits (its check
        # Pending, an Event saying so) instead of being pinned where the allocator cannot
        # serve it
        claim_template(custom_objects, ns, "four", 4)
        claim_job(batch_v1, ns, "ruled-out", pods=1, template="four")
        wait_for("the untolerating Workload waiting for nodes", lambda: [
            e for e in H.events(core_v1, ns, "PlacementWaiting")
            if "ruled-out" in e.involved_object.name], timeout=120)
        assert not [p.metadata.name for p in core_v1.list_namespaced_pod(
            ns, label_selector="job-name=ruled-out").items if p.spec.node_name]

        # a claim that tolerates the taint is placed meanwhile
        claim_template(custom_objects, ns, "four-ok", 4, tolerations=[TOLERATE])
        claim_job(batch_v1, ns, "tolerant-of-rule", pods=1, template="four-ok")
        (pod,) = wait_for("the tolerating pod Running", lambda: (
            p if len(p := running_pods(core_v1, ns, "tolerant-of-rule")) == 1 else None),
            timeout=180)
        assert pod.spec.node_name in NODES
    finally:
        with contextlib.suppress(client.ApiException):
            custom_objects.delete_cluster_custom_object(*H.RESOURCE, "devicetaintrules", rule)

    # the rule withdrawn, the waiting Workload is placed on untainted devices and runs
    (pod,) = wait_for("the formerly ruled-out pod Running", lambda: (
        p if len(p := running_pods(core_v1, ns, "ruled-out")) == 1 else None), timeout=120)
    held = _held(custom_objects, ns, pod.metadata.name)
    assert len(held) == 4 and not [d for n, d in held
                                   if n == TAINTED.name and d in {f"gpu-{i}" for i in
                                                                  TAINTED.tainted}], held
