"""Issue 28 on the real control plane: no tenant's object stops placement or ungating.

Each test is one attack from the issue, made with ordinary objects a tenant may create, and
checks that another gang beside it is still placed, ungated and Running, and that the odd
object's owner is told (an Event) where it looks. Checked against the cluster's own
objects, never the controller's view.
"""

from __future__ import annotations

import contextlib
import signal
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from e2e_util import wait_for
from kubernetes import client
from test_controller import (
    GATE,
    H100,
    INDEX,
    PRODUCT,
    RESERVATION,
    RR_GROUP,
    RR_PLURAL,
    RR_VERSION,
    SLOT,
    check_entry,
    job,
    job_pods,
    reservation_of,
    running,
    wait_check,
    workload_of,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]


def test_a_superscript_completion_index_stops_no_ungating(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """Item 2. Before: a NonIndexed Job whose template annotates job-completion-index "²"
    made every ungating pass fail (`"²".isdigit()` and then `int("²")`), so a Gold Job
    beside it stayed gated. Now "²" is no rank: both Jobs are ungated and Running."""
    ns = nexus_namespace
    batch_v1.create_namespaced_job(
        ns,
        job("odd", "nexus-gold", pods=1, gpus=8, indexed=False, annotations={INDEX: "²"}),
    )
    # the odd Job's pod is gated first, so each ungating pass meets it before the gold one
    wait_check(custom_objects, ns, "odd", ("Ready",))
    batch_v1.create_namespaced_job(ns, job("gold", "nexus-gold", pods=1, gpus=8))
    wait_check(custom_objects, ns, "gold", ("Ready",))
    (gold,) = wait_for("gold Running", lambda: running(core_v1, ns, "gold", 1), timeout=120)
    assert gold.metadata.annotations[SLOT] == "main/0"
    (odd,) = wait_for("odd Running", lambda: running(core_v1, ns, "odd", 1), timeout=120)
    assert odd.metadata.annotations[INDEX] == "²"
    assert odd.metadata.annotations[SLOT] == "main/0"  # unranked: the first free slot
    for p in job_pods(core_v1, ns, "odd") + job_pods(core_v1, ns, "gold"):
        assert GATE not in [g.name for g in p.spec.scheduling_gates or []]


GPU_FRACTION = "scheduling.kubenexus.io/gpu-fraction"


@pytest.fixture
def other_namespace(core_v1):
    name = f"e2e-tenant-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_for(
        f"default ServiceAccount in {name}",
        lambda: core_v1.read_namespaced_service_account("default", name),
        timeout=60,
    )
    yield name
    with contextlib.suppress(client.ApiException):
        core_v1.delete_namespace(name, propagation_policy="Background")


def test_a_poisoned_pod_in_another_namespace_stops_no_placement(
    nexus_namespace, other_namespace, core_v1, batch_v1, custom_objects
):
    """Item 1. Before: one bound pod anywhere annotated gpu-fraction=lol aborted the
    snapshot of every pass; a 2 x 8-GPU Gold Job stayed Pending, nobody was told. Now the
    pod is counted conservatively (its whole-GPU request: none) and told with an Event on
    itself; the Gold Job beside it is placed and Running."""
    h100 = sorted(
        n.metadata.name
        for n in core_v1.list_node().items
        if (n.metadata.labels or {}).get(PRODUCT) == H100
    )[0]
    odd = client.V1Pod(
        metadata=client.V1ObjectMeta(name="odd", annotations={GPU_FRACTION: "lol"}),
        spec=client.V1PodSpec(
            node_name=h100,  # bound, as `kubectl run` and the scheduler would leave it
            containers=[client.V1Container(name="c", image="registry.invalid/pause:e2e")],
            tolerations=[client.V1Toleration(operator="Exists")],
        ),
    )
    core_v1.create_namespaced_pod(other_namespace, odd)
    wait_for(
        "odd Running",
        lambda: core_v1.read_namespaced_pod("odd", other_namespace).status.phase == "Running",
        timeout=60,
    )
    ns = nexus_namespace
    batch_v1.create_namespaced_job(ns, job("gold", "nexus-gold", pods=2, gpus=8, cpu="16"))
    wait_check(custom_objects, ns, "gold", ("Ready",))
    wait_for("gold Running", lambda: running(core_v1, ns, "gold", 2), timeout=120)

    def skipped_event():
        for e in core_v1.list_namespaced_event(other_namespace).items:
            if e.reason == "ObjectSkipped" and e.involved_object.name == "odd":
                return e
        return None

    told = wait_for("ObjectSkipped Event on the odd pod", skipped_event, timeout=60)
    assert told.type == "Warning"
    assert f"metadata.annotations[{GPU_FRACTION}]" in told.message
    assert "'lol' is not a GPU share" in told.message


def test_a_pod_claiming_a_workload_by_annotation_and_slot_rides_no_reservation(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """Item 5. Before: a tenant pod naming a placed Workload's reservation, with Kueue's
    `kueue.x-k8s.io/workload` annotation set by hand, passed the ownership check, and a
    pre-set slot annotation held that slot. Now membership comes from the owner chain
    Kueue uses: such a pod is gated and never pinned, with an Event saying why, and the
    Workload's own pod keeps its slot."""
    ns = nexus_namespace
    batch_v1.create_namespaced_job(ns, job("owner", "nexus-gold", pods=1, gpus=8))
    wl = wait_check(custom_objects, ns, "owner", ("Ready",))
    (owned,) = wait_for("owner Running", lambda: running(core_v1, ns, "owner", 1), timeout=120)
    rr_name = wl["status"]["admissionChecks"][0]["podSetUpdates"][0]["labels"][RESERVATION]
    rider = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name="rider",
            labels={RESERVATION: rr_name},
            annotations={"kueue.x-k8s.io/workload": wl["metadata"]["name"], SLOT: "main/0"},
        ),
        spec=client.V1PodSpec(
            containers=[client.V1Container(
                name="c", image="x",
                resources=client.V1ResourceRequirements(
                    requests={"nvidia.com/gpu": "8"}, limits={"nvidia.com/gpu": "8"}),
            )]
        ),
    )
    try:
        core_v1.create_namespaced_pod(ns, rider)
    except client.ApiException as denied:  # refused at the door is as good
        assert "not part of Workload" in str(denied.body)
        return
    refused = wait_for(
        "PlacementDenied Event on the rider",
        lambda: next((e for e in core_v1.list_namespaced_event(ns).items
                      if e.reason == "PlacementDenied" and e.involved_object.name == "rider"),
                     None),
        timeout=60,
    )
    assert "not ungated" in refused.message
    pod = core_v1.read_namespaced_pod("rider", ns)
    assert GATE in [g.name for g in pod.spec.scheduling_gates or []]
    assert not pod.spec.node_name
    assert "kubernetes.io/hostname" not in (pod.spec.node_selector or {})
    still = core_v1.read_namespaced_pod(owned.metadata.name, ns)
    assert still.status.phase == "Running" and still.metadata.annotations[SLOT] == "main/0"


# ---- item 5: a bound gang's reservation past its TTL, with a pod restarted ---------------

PLACEMENT_CONFIG = "e2e"  # e2e/manifests/nexus.yaml
HOSTNAME = "kubernetes.io/hostname"


@contextlib.contextmanager
def reservation_ttl(custom_objects, seconds: int) -> Iterator[None]:
    """The e2e PlacementConfig's reservationTtlSeconds set to `seconds`, restored after."""
    config = custom_objects.get_cluster_custom_object(
        RR_GROUP, RR_VERSION, "placementconfigs", PLACEMENT_CONFIG
    )
    before = config["spec"].get("reservationTtlSeconds")  # None: unset, removed again

    def patch(value: int | None) -> None:
        custom_objects.patch_cluster_custom_object(
            RR_GROUP, RR_VERSION, "placementconfigs", PLACEMENT_CONFIG,
            {"spec": {"reservationTtlSeconds": value}},
        )

    patch(seconds)
    try:
        yield
    finally:
        patch(before)


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _event_on(core_v1, ns: str, name: str, reasons: tuple[str, ...]):
    return next(
        (e for e in core_v1.list_namespaced_event(ns).items
         if e.involved_object.name == name and e.reason in reasons),
        None,
    )


def _restart_and_queue_a_taker(
    nexus_controller, core_v1, batch_v1, custom_objects, ns: str, victim: str, node: str
) -> None:
    """With the controller stopped (its first pass back meets both at once): `victim`
    deleted (its Job re-creates it) and a Job "taker" queued that fits only on `node`."""
    nexus_controller.stop(signal.SIGKILL)
    try:
        core_v1.delete_namespaced_pod(victim, ns, grace_period_seconds=0)
        taker = job("taker", "nexus-gold", pods=1, gpus=8)
        taker.spec.template.spec.node_selector = {HOSTNAME: node}
        batch_v1.create_namespaced_job(ns, taker)
        wait_for(
            "taker's quota reserved",
            lambda: (w := workload_of(custom_objects, ns, "taker"))
            and any(c["type"] == "QuotaReserved" and c["status"] == "True"
                    for c in w.get("status", {}).get("conditions", [])),
            timeout=60,
        )
    finally:
        # back before the Job re-creates the pod (it waits its pod-failure backoff, 10 s)
        nexus_controller.start()


@pytest.mark.parametrize("pods", [2, 1], ids=["one-of-two-pods", "the-only-pod"])
def test_a_bound_gang_past_its_ttl_keeps_its_slot_while_a_pod_restarts(
    pods, nexus_namespace, nexus_controller, core_v1, batch_v1, custom_objects
):
    """Item 5. Before: the reservation's TTL was never extended, so past it a bound gang's
    reservation stopped counting in the snapshot while the ungater still pinned a restarted
    pod to it: its GPUs could be promised to another gang. And a reservation's `Bound`
    phase was taken back as soon as a pod of it went away, so a gang whose every pod
    restarted after the TTL lost its reservation and was sent back through Retry.

    A gang placed with a 10 s TTL, bound, past its TTL; with the controller stopped (so that
    its first pass meets both at once) one of its pods is deleted and re-created by its Job,
    and a second gang is queued that fits only on that pod's node; the controller is back
    before the Job re-creates the pod. Now: the replacement is
    pinned to its own slot and Running there, the reservation is the same object, and the
    second gang is answered Retry; it is placed on that node once the first gang is gone."""
    ns = nexus_namespace
    with reservation_ttl(custom_objects, 10):
        batch_v1.create_namespaced_job(
            ns, job("held", "nexus-gold", pods=pods, gpus=8, backoff_limit=3)
        )
        wl = wait_check(custom_objects, ns, "held", ("Ready",))
    rr = reservation_of(custom_objects, ns, wl)
    assert rr["spec"]["ttlSeconds"] == 10, "placed before the short TTL was seen"
    bound = wait_for("held Running", lambda: running(core_v1, ns, "held", pods), timeout=120)
    admitted = next(c for c in workload_of(custom_objects, ns, "held")["status"]["conditions"]
                    if c["type"] == "Admitted")
    expires = _time(admitted["lastTransitionTime"]) + timedelta(seconds=10)

    def read_rr():
        return custom_objects.get_namespaced_custom_object(
            RR_GROUP, RR_VERSION, ns, RR_PLURAL, rr["metadata"]["name"]
        )

    wait_for("reservation Bound", lambda: read_rr().get("status", {}).get("phase") == "Bound",
             timeout=60)
    wait_for("the reservation's TTL passed",
             lambda: datetime.now(UTC) > expires, timeout=60)
    victim = max(bound, key=lambda p: int(p.metadata.annotations[INDEX]))
    node, slot = victim.spec.node_name, victim.metadata.annotations[SLOT]

    _restart_and_queue_a_taker(nexus_controller, core_v1, batch_v1, custom_objects, ns,
                               victim.metadata.name, node)

    def replacement():
        return next(
            (p for p in job_pods(core_v1, ns, "held")
             if p.metadata.uid != victim.metadata.uid
             and p.metadata.annotations.get(INDEX) == victim.metadata.annotations[INDEX]
             and not p.metadata.deletion_timestamp),
            None,
        )

    fresh = wait_for("the Job re-created the pod", replacement, timeout=60)
    taker_wl = workload_of(custom_objects, ns, "taker")["metadata"]["name"]

    def taker_answered():
        if check_entry(workload_of(custom_objects, ns, "taker")).get("state") == "Ready":
            return "Ready"
        e = _event_on(core_v1, ns, taker_wl, ("PlacementRetry",))
        return e and "Retry"

    answer = wait_for("the taker answered", taker_answered, timeout=90)
    assert answer == "Retry", f"the taker was given GPUs that {rr['metadata']['name']} holds"
    pinned = wait_for("the replacement Running", lambda: running(core_v1, ns, "held", pods),
                      timeout=120)
    again = next(p for p in pinned if p.metadata.uid == fresh.metadata.uid)
    assert again.metadata.annotations[SLOT] == slot and again.spec.node_name == node
    assert read_rr()["metadata"]["uid"] == rr["metadata"]["uid"], "the same reservation"
    assert _event_on(core_v1, ns, wl["metadata"]["name"], ("PlacementReleased",)) is None
    assert check_entry(workload_of(custom_objects, ns, "taker")).get("state") != "Ready"

    # the taker fits on that node: only the held gang kept it out
    batch_v1.delete_namespaced_job("held", ns, propagation_policy="Background")
    wait_check(custom_objects, ns, "taker", ("Ready",), timeout=180)
    (took,) = wait_for("taker Running", lambda: running(core_v1, ns, "taker", 1), timeout=120)
    assert took.spec.node_name == node
