"""Free capacity = allocatable − bound, non-terminated pods − live reservations of others."""

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kube_factories import container, node, nrt, pod, reservation

from nexus_admit.kube.errors import TranslationError
from nexus_admit.kube.requests import effective_requests, pod_requests
from nexus_admit.kube.translate import build_snapshot
from nexus_admit.model import GPU_WHOLE, ClusterSnapshot

NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


def _snap(
    nodes: Sequence[dict[str, Any]],
    pods: Sequence[dict[str, Any]] = (),
    rrs: Sequence[dict[str, Any]] = (),
    **kw: Any,
) -> ClusterSnapshot:
    return build_snapshot(nodes, pods, rrs, now=NOW, **kw)


# ---------------------------------------------------------------- effective requests


def test_effective_requests_sum_containers_max_init_plus_overhead() -> None:
    p = pod("p", "n1")
    p["spec"]["containers"] = [container("1", "1Gi"), container("500m", "3Gi")]
    p["spec"]["initContainers"] = [container("4", "1Gi"), container("250m", "8Gi")]
    p["spec"]["overhead"] = {"cpu": "100m", "memory": "64Mi"}
    r = pod_requests(p, p["spec"])
    assert r.cpu_milli == 4000 + 100  # init 4 cores > 1.5 cores of containers
    assert r.memory_mib == 8 * 1024 + 64  # init 8Gi > 4Gi


def test_sidecar_init_containers_add_to_containers() -> None:
    p = pod("p", "n1")
    p["spec"]["containers"] = [container("1", "1Gi")]
    p["spec"]["initContainers"] = [
        container("500m", "1Gi", restartPolicy="Always"),  # sidecar, runs alongside
        container("1", "1Gi"),  # classic init, runs with the sidecar
    ]
    raw = effective_requests(p, p["spec"])
    assert raw["cpu"] == 3 / 2  # max(1 + 0.5, 0.5 + 1)
    assert pod_requests(p, p["spec"]).cpu_milli == 1500


def test_limits_stand_in_for_missing_requests() -> None:
    p = pod("p", "n1")
    p["spec"]["containers"] = [container("2", "4Gi", gpus=2, limits_only=True)]
    r = pod_requests(p, p["spec"])
    assert (r.cpu_milli, r.memory_mib, r.gpus) == (2000, 4096, 2)


def test_fractional_gpu_request_is_an_error_pointing_to_the_annotation() -> None:
    p = pod("p", "n1")
    p["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "500m"}
    with pytest.raises(TranslationError, match="gpu-fraction"):
        pod_requests(p, p["spec"])


def test_malformed_request_names_container_field() -> None:
    p = pod("p", "n1", namespace="ns")
    p["spec"]["containers"][0]["resources"]["requests"]["memory"] = "4 gigs"
    with pytest.raises(TranslationError) as e:
        _snap([node("n1")], [p])
    assert e.value.obj_ref == "Pod ns/p"
    assert e.value.field == "spec.containers[0].resources.requests[memory]"


# ---------------------------------------------------------------- pods


def test_bound_running_pods_take_capacity_terminated_and_unbound_do_not() -> None:
    pods = [
        pod("a", "n1", cpu="10", memory="100Gi", gpus=2),
        pod("b", "n1", cpu="4", memory="10Gi", gpus=1, phase="Pending"),  # bound, starting
        pod("done", "n1", cpu="30", gpus=4, phase="Succeeded"),
        pod("failed", "n1", cpu="30", gpus=4, phase="Failed"),
        pod("unbound", None, cpu="30", gpus=4, phase="Pending"),
        pod("elsewhere", "gone-node", cpu="30", gpus=4),
    ]
    n = _snap([node("n1", cpu="64", memory="512Gi")], pods).nodes["n1"]
    assert n.free_cpu_milli == 64_000 - 14_000
    assert n.free_memory_mib == 512 * 1024 - 110 * 1024
    assert n.free_pods == 108
    assert n.free_whole_gpus == 5
    assert n.gpu_free == [0, 0, 0] + [GPU_WHOLE] * 5


def test_overcommit_clamps_at_zero() -> None:
    pods = [pod(f"p{i}", "n1", cpu="40", gpus=8) for i in range(2)]
    n = _snap([node("n1", cpu="64")], pods).nodes["n1"]
    assert n.free_cpu_milli == 0
    assert n.gpu_free == [0] * 8


def test_gpu_fraction_pods_share_the_fullest_device() -> None:
    ann = {"scheduling.kubenexus.io/gpu-fraction": "0.25"}
    pods = [pod(f"f{i}", "n1", gpus=1, annotations=ann) for i in range(3)]
    pods.append(
        pod("half", "n1", gpus=1, annotations={"scheduling.kubenexus.io/gpu-fraction": "500m"})
    )
    n = _snap([node("n1", gpus=2)], pods).nodes["n1"]
    # 0.25 ×3 stack on device 0 (fullest that fits), 0.5 then goes to device 1
    assert sorted(n.gpu_free) == [250, 500]


def test_time_slicing_replicas_make_units_shares() -> None:
    obj = node("l1", gpus=2, labels={"nvidia.com/gpu.replicas": "4"})
    obj["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    n = _snap([obj], [pod("p", "l1", gpus=1)]).nodes["l1"]
    assert n.gpu_count == 2
    assert sorted(n.gpu_free) == [750, 1000]


def test_malformed_gpu_fraction_annotation() -> None:
    p = pod(
        "p",
        "n1",
        namespace="ns",
        gpus=1,
        annotations={"scheduling.kubenexus.io/gpu-fraction": "1.5"},
    )
    with pytest.raises(TranslationError) as e:
        _snap([node("n1")], [p])
    assert e.value.field == "metadata.annotations[scheduling.kubenexus.io/gpu-fraction]"
    assert "at most 1" in e.value.message


def test_pod_numa_zone_from_annotation_or_its_gpus() -> None:
    nodes = [node("n1", cpu="64")]
    nrts = [nrt("n1", [("32", 4), ("32", 4)])]
    pods = [
        pod("a", "n1", cpu="10", annotations={"scheduling.kubenexus.io/numa-zone": "1"}),
        pod("b", "n1", cpu="6", gpus=4),  # takes GPUs 0-3 → zone 0
        pod("c", "n1", cpu="1"),  # no zone known: node only
    ]
    n = _snap(nodes, pods, node_resource_topologies=nrts).nodes["n1"]
    assert n.free_cpu_milli == 64_000 - 17_000
    assert [z.free_cpu_milli for z in n.numa_zones] == [26_000, 22_000]
    assert n.gpu_free == [0, 0, 0, 0] + [GPU_WHOLE] * 4


def test_nrt_available_caps_zone_free_cpu() -> None:
    nrts = [nrt("n1", [("32", 4), ("32", 4)], available=["20", "32"])]
    pods = [pod("a", "n1", cpu="4", annotations={"scheduling.kubenexus.io/numa-zone": "0"})]
    n = _snap([node("n1", cpu="64")], pods, node_resource_topologies=nrts).nodes["n1"]
    # NRT already counts exclusive CPUs: take the lower of the two views, never both
    assert [z.free_cpu_milli for z in n.numa_zones] == [20_000, 32_000]


# ---------------------------------------------------------------- reservations


def _slots(*specs: tuple[str, list[int]]) -> list[dict[str, Any]]:
    return [{"index": i, "node": nd, "gpus": g} for i, (nd, g) in enumerate(specs)]


def test_live_reservation_of_another_workload_takes_its_slots() -> None:
    rr = reservation("rr1", "other", _slots(("n1", [4, 5]), ("n1", [6, 7])), cpu="8", memory="32Gi")
    n = _snap([node("n1", cpu="64", memory="512Gi")], [], [rr]).nodes["n1"]
    assert n.gpu_free == [GPU_WHOLE] * 4 + [0] * 4
    assert n.free_cpu_milli == 64_000 - 16_000
    assert n.free_memory_mib == 512 * 1024 - 64 * 1024
    assert n.free_pods == 108


def test_released_expired_and_own_reservations_do_not_count() -> None:
    slots = _slots(("n1", [0, 1, 2, 3]))
    rrs = [
        reservation("released", "w1", slots, phase="Released"),
        reservation("expired", "w2", slots, expires_at="2025-05-01T11:59:59Z"),
        reservation("mine", "me", slots),
    ]
    n = _snap([node("n1")], [], rrs, exclude_workloads=["default/me"]).nodes["n1"]
    assert n.free_whole_gpus == 8
    assert n.free_pods == 110


def test_reservation_without_expiry_is_live() -> None:
    rr = reservation("r", "w", _slots(("n1", [0])), expires_at=None)
    assert _snap([node("n1")], [], [rr]).nodes["n1"].free_whole_gpus == 7


def test_bound_slot_is_not_counted_twice() -> None:
    rr = reservation(
        "rr1", "w", _slots(("n1", [0, 1, 2, 3]), ("n1", [4, 5, 6, 7])), cpu="8", namespace="team"
    )
    bound = pod(
        "w-0",
        "n1",
        namespace="team",
        cpu="8",
        gpus=4,
        labels={"scheduling.kubenexus.io/reservation": "rr1"},
        annotations={"scheduling.kubenexus.io/slot": "main/1"},
    )
    n = _snap([node("n1", cpu="64")], [bound], [rr]).nodes["n1"]
    assert n.free_cpu_milli == 64_000 - 16_000  # one pod + one open slot, not three
    assert n.free_pods == 108
    # the bound pod holds exactly its slot's devices (4-7), the open slot holds 0-3
    assert n.gpu_free == [0] * 8


def test_bound_pod_uses_its_slot_devices_before_other_pods_choose() -> None:
    rr = reservation("rr1", "w", _slots(("n1", [0, 1])))
    bound = pod(
        "w-0",
        "n1",
        gpus=2,
        labels={"scheduling.kubenexus.io/reservation": "rr1"},
        annotations={"scheduling.kubenexus.io/slot": "main/0"},
    )
    other = pod("x", "n1", gpus=2)
    n = _snap([node("n1", gpus=4)], [other, bound], [rr]).nodes["n1"]
    assert n.gpu_free == [0, 0, 0, 0]


def test_reservation_requests_fall_back_to_workload_template() -> None:
    rr = reservation("rr1", "w", _slots(("n1", [0])), requests=False)
    n = _snap(
        [node("n1", cpu="64")], [], [rr], template_requests={("default/w", "main"): (6000, 2048, 1)}
    ).nodes["n1"]
    assert n.free_cpu_milli == 58_000
    assert n.free_memory_mib == 512 * 1024 - 2048


def test_fractional_reservation_slot_takes_share_of_named_device() -> None:
    rr = reservation("rr1", "w", _slots(("n1", [1]), ("n1", [1])), gpu_share="0.25")
    n = _snap([node("n1", gpus=2)], [], [rr]).nodes["n1"]
    assert n.gpu_free == [GPU_WHOLE, 500]


def test_reservation_slot_with_gpu_count_picks_free_devices() -> None:
    rr = reservation("rr1", "w", [{"index": 0, "node": "n1", "gpus": 3}])
    pods = [pod("p", "n1", gpus=1)]
    n = _snap([node("n1", gpus=4)], pods, [rr]).nodes["n1"]
    assert n.free_whole_gpus == 0


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (
            lambda r: r["spec"]["podSets"][0]["slots"][0].update({"gpus": "all"}),
            "spec.podSets[0].slots[0].gpus",
        ),
        (
            lambda r: r["spec"]["podSets"][0]["slots"][0].update({"gpus": [-1]}),
            "spec.podSets[0].slots[0].gpus",
        ),
        (
            lambda r: r["spec"]["podSets"][0]["slots"][0].update({"numaZone": "x"}),
            "spec.podSets[0].slots[0].numaZone",
        ),
        (lambda r: r["spec"].update({"expiresAt": "tomorrow"}), "spec.expiresAt"),
        (
            lambda r: r["spec"]["podSets"][0].update({"requests": {"cpu": "many"}}),
            "spec.podSets[0].requests",
        ),
        (lambda r: r["spec"]["podSets"][0].update({"gpuShare": "2"}), "spec.podSets[0].gpuShare"),
    ],
)
def test_malformed_reservation(mutate: Any, field: str) -> None:
    rr = reservation("rr1", "w", _slots(("n1", [0])), namespace="team")
    mutate(rr)
    with pytest.raises(TranslationError) as e:
        _snap([node("n1")], [], [rr])
    assert e.value.obj_ref == "ResourceReservation team/rr1"
    assert e.value.field == field


def test_reservation_on_unknown_node_is_ignored() -> None:
    rr = reservation("rr1", "w", _slots(("gone", [0])))
    assert _snap([node("n1")], [], [rr]).nodes["n1"].free_whole_gpus == 8


def test_duplicate_node_names_rejected() -> None:
    with pytest.raises(TranslationError, match="duplicate"):
        _snap([node("n1"), node("n1")])


@given(
    st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 8), st.sampled_from(["Running", "Succeeded"])),
        max_size=12,
    )
)
def test_free_capacity_property(pods_spec: list[tuple[int, int, str]]) -> None:
    pods = [
        pod(f"p{i}", "n1", cpu=str(cpu), memory="1Gi", gpus=g, phase=phase)
        for i, (cpu, g, phase) in enumerate(pods_spec)
    ]
    live = [(c, g) for c, g, ph in pods_spec if ph == "Running"]
    n = _snap([node("n1", cpu="64", memory="512Gi")], pods).nodes["n1"]
    assert n.free_cpu_milli == max(0, 64_000 - 1000 * sum(c for c, _ in live))
    assert n.free_pods == 110 - len(live)
    assert n.gpu_count - n.free_whole_gpus == min(8, sum(g for _, g in live))
    assert all(0 <= f <= GPU_WHOLE for f in n.gpu_free)


def test_a_cached_node_translation_is_a_fresh_copy_per_snapshot() -> None:
    """Snapshots are built every pass from mostly unchanged Nodes: the translation is
    reused per resourceVersion, but what one snapshot subtracts never reaches the next."""
    from nexus_admit.kube.cluster import build_snapshot
    from tests.kube.kube_factories import node, pod

    n = node("n0", gpus=8)
    n["metadata"].update(uid="uid-n0", resourceVersion="7")
    busy = pod("p", "n0", gpus=4)
    assert build_snapshot([n], [busy]).nodes["n0"].free_whole_gpus == 4
    assert build_snapshot([n]).nodes["n0"].free_whole_gpus == 8
    relabelled = {**n, "metadata": {**n["metadata"], "resourceVersion": "8",
                                    "labels": {**n["metadata"].get("labels", {}), "x": "y"}}}
    assert build_snapshot([relabelled]).nodes["n0"].labels["x"] == "y"


def test_a_pods_requests_are_translated_once_per_version() -> None:
    """Every pass reads every bound pod: its requests are kept per uid and resourceVersion,
    and a new version (an in-place resize) is read again."""
    from nexus_admit.kube.cluster import build_snapshot
    from tests.kube.kube_factories import node, pod

    n = node("n0", gpus=8)
    p = pod("p", "n0", gpus=2)
    p["metadata"].update(uid="uid-cached-pod", resourceVersion="1")
    assert build_snapshot([n], [p]).nodes["n0"].free_whole_gpus == 6
    # the same version is not read again: a changed body under it would not be seen
    same = {**p, "spec": {**p["spec"], "containers": [container(gpus=4)]}}
    assert build_snapshot([n], [same]).nodes["n0"].free_whole_gpus == 6
    resized = {**same, "metadata": {**p["metadata"], "resourceVersion": "2"}}
    assert build_snapshot([n], [resized]).nodes["n0"].free_whole_gpus == 4
