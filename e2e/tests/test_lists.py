"""Lists at scale, on the real apiserver: the controller's own paginated list returns
every object across pages; what the store keeps of the real objects (stripped of
managedFields and the fields no reader uses) translates to exactly the same snapshot and
gangs; and a replica whose fleet list has not completed already answers the pod webhook
correctly (its AdmissionChecks are listed first), then places once it has listed.

Gate mode `webhook`: the pod webhook (not a gate policy) gates queued pods, so the
answers it gives before the fleet's list are what the test sees on the pods.
"""

from __future__ import annotations

from typing import Any

import pytest
from e2e_util import wait_for
from kubernetes import client
from test_controller import CHECK, GATE, job, running, wait_check
from test_outage import _gates, _pod

from nexus_admit.controller.api import RESOURCES, KubeApi, load_api_client
from nexus_admit.controller.store import WATCHED_KINDS
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.errors import object_key
from nexus_admit.kube.stored import stripped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

TINY_PAGE = 5


@pytest.fixture(scope="module")
def gate_mode() -> str:
    return "webhook"


def _api(e2e_cluster: Any, page_size: int) -> KubeApi:
    return KubeApi(load_api_client(str(e2e_cluster.kubeconfig)), list_page_size=page_size)


def _keys(items: list[dict[str, Any]]) -> list[str]:
    return sorted(object_key(i) for i in items)


def test_a_list_in_tiny_pages_returns_every_object(
    e2e_cluster, nexus_namespace, batch_v1, custom_objects
) -> None:
    ns = nexus_namespace
    batch_v1.create_namespaced_job(ns, job("paged", "nexus-gold", 6, 1, indexed=False))
    wait_check(custom_objects, ns, "paged", ("Ready",))
    paged = _api(e2e_cluster, TINY_PAGE)
    for kind in ("Node", "Pod", "Workload", "LocalQueue"):
        items, version = paged.list(kind)
        assert version is not None
        # the whole list at exactly the revision the pages were read at (other tests'
        # namespaces come and go meanwhile)
        every = paged.request(
            "GET",
            RESOURCES[kind].path(),
            query={"resourceVersion": str(version), "resourceVersionMatch": "Exact"},
        )["items"]
        assert _keys(items) == _keys(every), kind
        assert len(set(_keys(items))) == len(items), f"{kind}: an object listed twice"
    assert len(paged.list("Node")[0]) > 3 * TINY_PAGE  # several pages, not one


def test_stripped_real_objects_translate_to_the_same_snapshot_and_gangs(
    e2e_cluster, nexus_namespace, batch_v1, custom_objects
) -> None:
    """The apiserver's own objects (managedFields, images, probes...): the snapshot and
    every Workload's gang are the same from what the store keeps."""
    ns = nexus_namespace
    batch_v1.create_namespaced_job(ns, job("stripped", "nexus-gold", 2, 8))
    wait_check(custom_objects, ns, "stripped", ("Ready",))
    api = _api(e2e_cluster, 500)
    raw = {k: api.list(k)[0] for k in WATCHED_KINDS}
    assert any(p["metadata"].get("managedFields") for p in raw["Pod"])
    kept = {k: [stripped(k, o) for o in objs] for k, objs in raw.items()}
    assert not any(p["metadata"].get("managedFields") for p in kept["Pod"])
    full, thin = ClusterDump(by_kind=raw), ClusterDump(by_kind=kept)
    snapshot = full.snapshot()
    assert thin.snapshot() == snapshot
    config = full.placement_config()
    workloads = full.kind("Workload")
    assert workloads
    for wl, thin_wl in zip(workloads, thin.kind("Workload"), strict=True):
        assert thin.gang(thin_wl, config, thin.snapshot()) == full.gang(wl, config, snapshot)


def _relists(controller: Any) -> float:
    for line in controller.metrics().splitlines():
        if line.startswith("nexus_admit_relists_total "):
            return float(line.split()[-1])
    return -1.0


def test_a_replica_answers_the_webhook_before_its_fleet_list_then_places(
    nexus_controller, nexus_namespace, core_v1, batch_v1, custom_objects
) -> None:
    ns = nexus_namespace
    nexus_controller.stop()
    try:
        # start-up stops for good after the webhook's kinds are listed (test-only point)
        nexus_controller.start(env={"NEXUS_FAULT": "hold-fleet-list"})
        assert _relists(nexus_controller) == 1  # the early kinds only: no fleet list yet
        assert "hold-fleet-list reached" in nexus_controller.log_tail(200)
        # a pod of a queue whose ClusterQueue uses our check is gated; one of no queue not
        assert GATE in _gates(core_v1.create_namespaced_pod(ns, _pod("queued", "nexus-gold")))
        plain = _pod("plain", "nexus-gold")
        plain.metadata.labels = {}
        assert GATE not in _gates(core_v1.create_namespaced_pod(ns, plain))
        # a pod naming a reservation that does not exist is refused, saying why
        forged = _pod("forged", "nexus-gold")
        forged.metadata.labels["scheduling.kubenexus.io/reservation"] = "no-such-reservation"
        with pytest.raises(client.ApiException) as refused:
            core_v1.create_namespaced_pod(ns, forged)
        assert "no-such-reservation" in str(refused.value.body)
        # a Workload that arrives meanwhile is not decided on the half-listed store
        batch_v1.create_namespaced_job(ns, job("after", "nexus-gold", 2, 8))
        wait_for(
            "the Job's Workload waiting on our check",
            lambda: _pending(custom_objects, ns, "after"),
            timeout=60,
        )
    finally:
        nexus_controller.stop()
        nexus_controller.start()
    wait_check(custom_objects, ns, "after", ("Ready",))
    wait_for("the placed Job's pods running", lambda: running(core_v1, ns, "after", 2), 90)


def _pending(custom: client.CustomObjectsApi, ns: str, job_name: str) -> bool:
    from test_controller import check_entry, workload_of

    wl = workload_of(custom, ns, job_name)
    return wl is not None and check_entry(wl).get("name") == CHECK and (
        check_entry(wl).get("state") == "Pending"
    )
