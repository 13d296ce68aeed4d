"""The two ways to lay out flavors and quotas for nexus-admit (docs/admin-guide.md, "Queues,
flavors and quotas"), each on the real plane.

- One flavor per hardware class, with the class's nodeLabels: Kueue picks the class by the
  ClusterQueue's flavor order and quota, nexus places within it. A Workload admitted under
  the A100 flavor lands on A100 nodes though its tier prefers the free H100s.
- One broad flavor without nodeLabels: nexus picks the hardware by tier; the quota counts
  every GPU alike, so a Workload waits on it while other hardware stands idle.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from builders import CHECK, GPU, cluster_queue, create_local_queue, flavor_quota, job
from e2e_util import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    all_running,
    condition,
    pods_with_labels,
    wait_for,
    workload_owned_by,
)
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

PRODUCT = "nvidia.com/gpu.product"
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"


@contextlib.contextmanager
def _gold_queue(custom, ns: str, flavors: dict[str, dict[str, str]],
                quotas: list[tuple[str, int]]) -> Iterator[str]:
    """Flavors `{name: nodeLabels}`, a gold ClusterQueue with our check and `quotas`
    (flavor, GPUs) in that order, and a LocalQueue of the same name in `ns`."""
    cq = f"layout-{uuid.uuid4().hex[:5]}"
    made: list[tuple[str, str]] = []

    def create(plural: str, body: dict[str, Any]) -> None:
        custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", **body})
        made.append((plural, body["metadata"]["name"]))

    try:
        for name, labels in flavors.items():
            create("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": name},
                                       "spec": {"nodeLabels": labels} if labels else {}})
        create("clusterqueues", cluster_queue(
            cq, [CHECK], [flavor_quota(f, g) for f, g in quotas], tier="gold"))
        create_local_queue(custom, ns, cq, cq)
        wait_for(f"ClusterQueue {cq} active", lambda: condition(custom.get_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", cq), "Active") == "True", timeout=60)
        yield cq
    finally:
        for plural, name in reversed(made):
            with contextlib.suppress(client.ApiException):
                custom.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)


def _admitted(custom, ns: str, uid: str, what: str) -> dict[str, Any]:
    """The Workload once our check answered; Ready is the only right answer here."""
    def answered():
        wl = workload_owned_by(custom, ns, uid)
        entry = next((c for c in ((wl or {}).get("status") or {}).get("admissionChecks") or []
                      if c.get("name") == CHECK), {})
        return (wl, entry) if entry.get("state") in ("Ready", "Rejected", "Retry") else None

    wl, entry = wait_for(f"nexus to answer {what}", answered, timeout=90)
    assert entry["state"] == "Ready", entry.get("message")
    return wl


def _running_on(core_v1, ns: str, name: str, pods: int) -> set[str]:
    found = wait_for(f"the pods of {name} running", lambda: (
        p if all_running(p := pods_with_labels(core_v1, ns, f"job-name={name}"), pods) else None),
        timeout=90)
    return {p.spec.node_name for p in found}


def _flavor_of(wl: dict[str, Any]) -> str:
    (psa,) = wl["status"]["admission"]["podSetAssignments"]
    return str(psa["flavors"][GPU])


def test_per_class_flavors_kueue_picks_the_class_nexus_places_within_it(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """The H100 flavor's quota (8 GPUs) taken by the first Job, Kueue admits the second
    under the next flavor, A100: nexus places it on A100 nodes, though gold prefers H100
    and H100 nodes stand free."""
    ns = nexus_namespace
    sfx = uuid.uuid4().hex[:5]
    h100, a100 = f"class-h100-{sfx}", f"class-a100-{sfx}"
    flavors = {h100: {PRODUCT: H100}, a100: {PRODUCT: A100}}
    with _gold_queue(custom_objects, ns, flavors, [(h100, 8), (a100, 16)]) as queue:
        first = batch_v1.create_namespaced_job(ns, job("first", queue, 1, 8)).metadata.uid
        wl = _admitted(custom_objects, ns, first, "the first Job")
        assert _flavor_of(wl) == h100
        assert all(n.startswith("h100-") for n in _running_on(core_v1, ns, "first", 1))

        second = batch_v1.create_namespaced_job(ns, job("second", queue, 2, 8)).metadata.uid
        wl = _admitted(custom_objects, ns, second, "the second Job")
        assert _flavor_of(wl) == a100
        nodes = _running_on(core_v1, ns, "second", 2)
        assert all(n.startswith("a100-") for n in nodes), nodes


def test_one_broad_flavor_nexus_picks_the_hardware_the_quota_counts_every_gpu(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """Under one flavor without nodeLabels, gold's Job goes to H100 nodes, nexus's choice;
    its 8 GPUs fill the queue's 8-GPU quota, so a 4-GPU Job waits on quota while the
    A100 and L40S nodes stand idle."""
    ns = nexus_namespace
    broad = f"broad-{uuid.uuid4().hex[:5]}"
    with _gold_queue(custom_objects, ns, {broad: {}}, [(broad, 8)]) as queue:
        first = batch_v1.create_namespaced_job(ns, job("first", queue, 1, 8)).metadata.uid
        wl = _admitted(custom_objects, ns, first, "the first Job")
        assert _flavor_of(wl) == broad
        assert all(n.startswith("h100-") for n in _running_on(core_v1, ns, "first", 1))

        second = batch_v1.create_namespaced_job(ns, job("second", queue, 1, 4)).metadata.uid

        def quota_refused():
            w = workload_owned_by(custom_objects, ns, second) or {}
            cond = next((c for c in (w.get("status") or {}).get("conditions") or []
                         if c.get("type") == "QuotaReserved"), {})
            return cond if cond.get("status") == "False" and "quota" in cond.get(
                "message", "") else None

        cond = wait_for("Kueue to hold the second Job back for quota", quota_refused,
                        timeout=60)
        assert GPU in cond["message"], cond
        assert not pods_with_labels(core_v1, ns, "job-name=second")
