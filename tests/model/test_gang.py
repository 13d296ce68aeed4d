"""Gang, PodSet and the Kubernetes scheduling semantics they carry: tolerations, node
selector requirements, and why a pod set can never run on a node (`static_fit`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nexus_admit.model import (
    GPU_WHOLE,
    Gang,
    NodeSelectorRequirement,
    PodSet,
    Taint,
    Toleration,
    WorkloadType,
)
from tests.factories import L40S, T4, gpu_node

NO_SCHEDULE = Taint("dedicated", "infer", "NoSchedule")
NO_EXECUTE = Taint("dedicated", "infer", "NoExecute")
PREFER = Taint("dedicated", "infer", "PreferNoSchedule")
VRAM = "GPU VRAM too small"

# ---------------------------------------------------------------- tolerations


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        # Exists on the key: any value
        (Toleration("dedicated", "Exists"), NO_SCHEDULE, True),
        (Toleration("dedicated", "Exists"), Taint("dedicated", "train"), True),
        (Toleration("other", "Exists"), NO_SCHEDULE, False),
        # Equal: key and value must both match
        (Toleration("dedicated", "Equal", "infer"), NO_SCHEDULE, True),
        (Toleration("dedicated", "Equal", "train"), NO_SCHEDULE, False),
        (Toleration("dedicated", value="infer"), NO_SCHEDULE, True),  # Equal is the default
        # effect: None matches every effect, otherwise it must be equal
        (Toleration("dedicated", "Equal", "infer", None), NO_EXECUTE, True),
        (Toleration("dedicated", "Equal", "infer", "NoSchedule"), NO_SCHEDULE, True),
        (Toleration("dedicated", "Equal", "infer", "NoSchedule"), NO_EXECUTE, False),
        (Toleration("dedicated", "Exists", effect="NoExecute"), NO_EXECUTE, True),
        (Toleration("dedicated", "Exists", effect="NoExecute"), NO_SCHEDULE, False),
        # empty key with Exists tolerates everything; empty key with Equal nothing
        (Toleration(None, "Exists"), NO_SCHEDULE, True),
        (Toleration(None, "Exists"), Taint("nvidia.com/gpu", "present", "NoExecute"), True),
        (Toleration(None, "Exists", effect="NoSchedule"), NO_EXECUTE, False),
        (Toleration(None, "Equal", "infer"), NO_SCHEDULE, False),
    ],
)
def test_toleration_semantics(toleration: Toleration, taint: Taint, tolerated: bool) -> None:
    assert toleration.tolerates(taint) is tolerated


def test_pod_set_must_tolerate_every_hard_taint() -> None:
    node = gpu_node("n", taints=(NO_SCHEDULE, Taint("nvidia.com/gpu", "present", "NoSchedule")))
    one = PodSet("p", 1, tolerations=(Toleration("dedicated", "Exists"),))
    both = PodSet("p", 1, tolerations=(
        Toleration("dedicated", "Exists"), Toleration("nvidia.com/gpu", "Exists"),
    ))
    assert not one.tolerates(node)
    assert both.tolerates(node)


def test_prefer_no_schedule_taints_do_not_exclude() -> None:
    node = gpu_node("n", taints=(PREFER,))
    assert PodSet("p", 1).tolerates(node)
    assert PodSet("p", 1).static_fit(node) is None


def test_no_execute_taint_excludes_like_no_schedule() -> None:
    node = gpu_node("n", taints=(NO_EXECUTE,))
    assert PodSet("p", 1).static_fit(node) == "untolerated taint"


# ---------------------------------------------------------------- node selector requirements

LABELS = {"pool": "a", "gpus": "8", "arch": "amd64"}


@pytest.mark.parametrize(
    ("req", "matches"),
    [
        (NodeSelectorRequirement("pool", "In", ("a", "b")), True),
        (NodeSelectorRequirement("pool", "In", ("b",)), False),
        (NodeSelectorRequirement("missing", "In", ("a",)), False),
        (NodeSelectorRequirement("pool", "NotIn", ("b",)), True),
        (NodeSelectorRequirement("pool", "NotIn", ("a", "b")), False),
        (NodeSelectorRequirement("missing", "NotIn", ("a",)), True),  # absent label: NotIn holds
        (NodeSelectorRequirement("pool", "Exists"), True),
        (NodeSelectorRequirement("missing", "Exists"), False),
        (NodeSelectorRequirement("pool", "DoesNotExist"), False),
        (NodeSelectorRequirement("missing", "DoesNotExist"), True),
        (NodeSelectorRequirement("gpus", "Gt", ("4",)), True),
        (NodeSelectorRequirement("gpus", "Gt", ("8",)), False),  # strictly greater
        (NodeSelectorRequirement("gpus", "Lt", ("16",)), True),
        (NodeSelectorRequirement("gpus", "Lt", ("8",)), False),
        (NodeSelectorRequirement("gpus", "Gt", ("10",)), False),  # numeric, not string order
        (NodeSelectorRequirement("arch", "Gt", ("1",)), False),  # non-integer label
        (NodeSelectorRequirement("gpus", "Gt", ("x",)), False),  # non-integer value
        (NodeSelectorRequirement("gpus", "Gt", ("1", "2")), False),  # exactly one value
        (NodeSelectorRequirement("missing", "Lt", ("1",)), False),
    ],
)
def test_node_selector_requirement(req: NodeSelectorRequirement, matches: bool) -> None:
    assert req.matches(LABELS) is matches


def test_unknown_node_selector_operator_raises() -> None:
    with pytest.raises(ValueError, match="unknown node selector operator 'Near'"):
        NodeSelectorRequirement("pool", "Near", ("a",)).matches(LABELS)


def test_affinity_terms_are_or_of_ands() -> None:
    node = gpu_node("n", labels={"pool": "a", "zone": "z1"})
    pool_a = NodeSelectorRequirement("pool", "In", ("a",))
    zone_z2 = NodeSelectorRequirement("zone", "In", ("z2",))
    zone_z1 = NodeSelectorRequirement("zone", "In", ("z1",))
    assert not PodSet("p", 1, affinity_terms=((pool_a, zone_z2),)).selects(node)  # AND fails
    assert PodSet("p", 1, affinity_terms=((pool_a, zone_z2), (zone_z1,))).selects(node)  # OR
    assert PodSet("p", 1, node_selector={"pool": "a"}).selects(node)
    assert not PodSet("p", 1, node_selector={"pool": "a", "zone": "z2"}).selects(node)
    # nodeSelector and affinity must both hold
    assert not PodSet(
        "p", 1, node_selector={"pool": "b"}, affinity_terms=((zone_z1,),)
    ).selects(node)


# ---------------------------------------------------------------- PodSet / Gang validation


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"count": 0}, "count must be at least 1"),
        ({"count": 1, "cpu_milli": -1}, "negative request"),
        ({"count": 1, "memory_mib": -5}, "negative request"),
        ({"count": 1, "gpus": -1}, "negative request"),
        ({"count": 1, "gpus": 1, "vram_mib": -1}, "negative request"),
        ({"count": 1, "gpus": 1, "gpu_milli": 0}, "gpu share must be in"),
        ({"count": 1, "gpus": 1, "gpu_milli": GPU_WHOLE + 1}, "gpu share must be in"),
        ({"count": 1, "gpus": 2, "gpu_milli": 500}, "needs exactly 1 GPU"),
        ({"count": 1, "gpus": 0, "gpu_milli": 500}, "needs exactly 1 GPU"),
    ],
)
def test_pod_set_validation(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PodSet("workers", **kwargs)


def test_pod_set_gpu_views() -> None:
    whole = PodSet("w", 2, gpus=4)
    share = PodSet("s", 3, gpus=1, gpu_milli=250)
    cpu = PodSet("c", 1, cpu_milli=1000)
    assert (whole.fractional, whole.whole_gpus, whole.gpu_milli_per_pod) == (False, 4, 4000)
    assert (share.fractional, share.whole_gpus, share.gpu_milli_per_pod) == (True, 0, 250)
    assert (cpu.fractional, cpu.whole_gpus, cpu.gpu_milli_per_pod) == (False, 0, 0)
    gang = Gang("ns/g", (whole, share, cpu))
    assert gang.pod_count == 6
    assert gang.gpu_milli == 2 * 4000 + 3 * 250


def test_gang_needs_pod_sets_with_unique_names() -> None:
    with pytest.raises(ValueError, match="has no pod sets"):
        Gang("ns/g", ())
    with pytest.raises(ValueError, match="duplicate pod set names"):
        Gang("ns/g", (PodSet("w", 1), PodSet("w", 2)))


def test_gang_defaults() -> None:
    gang = Gang("ns/g", (PodSet("w", 1),))
    assert gang.tier == "bronze"
    assert gang.workload_type is WorkloadType.BATCH
    assert gang.required_level is None and gang.preferred_level is None


def test_workload_types_pack_or_spread() -> None:
    assert WorkloadType.TRAINING.packs and WorkloadType.BATCH.packs
    assert not WorkloadType.INFERENCE.packs and not WorkloadType.SERVICE.packs


# ---------------------------------------------------------------- static_fit


def test_static_fit_accepts_a_suitable_node() -> None:
    ps = PodSet("w", 4, cpu_milli=8000, memory_mib=65536, gpus=8, vram_mib=70 * 1024)
    assert ps.static_fit(gpu_node("n")) is None


def test_static_fit_ignores_current_load() -> None:
    """static_fit answers "never", not "not now": a full node is still eligible."""
    busy = gpu_node("n", used=range(8))
    busy.free_cpu_milli = 0
    busy.free_pods = 0
    assert PodSet("w", 1, cpu_milli=1000, gpus=2).static_fit(busy) is None


@pytest.mark.parametrize(
    ("node", "pod_set", "reason"),
    [
        (gpu_node("n"), PodSet("w", 1), None),
        (gpu_node("n"), PodSet("w", 1, allowed_nodes=frozenset({"m"})), "outside assigned flavor"),
        (gpu_node("n"), PodSet("w", 1, allowed_nodes=frozenset({"n"})), None),
        (gpu_node("n", taints=(NO_SCHEDULE,)), PodSet("w", 1), "untolerated taint"),
        (
            gpu_node("n", taints=(NO_SCHEDULE,)),
            PodSet("w", 1, tolerations=(Toleration("dedicated", "Equal", "infer"),)),
            None,
        ),
        (gpu_node("n"), PodSet("w", 1, node_selector={"pool": "a"}), "selector/affinity"),
        (
            gpu_node("n"),
            PodSet("w", 1, affinity_terms=((NodeSelectorRequirement("pool", "Exists"),),)),
            "selector/affinity",
        ),
        (gpu_node("n", gpus=4), PodSet("w", 1, gpus=8), "too few GPUs"),
        (gpu_node("n", gpus=0), PodSet("w", 1, gpus=1), "too few GPUs"),
        (gpu_node("n", gpu=T4), PodSet("w", 1, gpus=1, vram_mib=16 * 1024), VRAM),
        (gpu_node("n", gpu=L40S), PodSet("w", 1, gpus=1, vram_mib=L40S[1]), None),  # exact
        (gpu_node("n", gpu=L40S), PodSet("w", 1, gpus=1, vram_mib=L40S[1] + 1), VRAM),
        (gpu_node("n", cpu_milli=64_000), PodSet("w", 1, cpu_milli=96_000), "node too small"),
        (gpu_node("n", memory_mib=1024), PodSet("w", 1, memory_mib=2048), "node too small"),
        # a CPU-only pod set fits a GPU-less node
        (gpu_node("n", gpus=0), PodSet("w", 1, cpu_milli=1000), None),
        # VRAM is not checked for pods that ask for no GPU
        (gpu_node("n", gpus=0), PodSet("w", 1, vram_mib=1), None),
    ],
)
def test_static_fit_reasons(node: object, pod_set: PodSet, reason: str | None) -> None:
    assert pod_set.static_fit(node) == reason  # type: ignore[arg-type]


def test_static_fit_unschedulable_comes_first() -> None:
    node = gpu_node("n", taints=(NO_SCHEDULE,), gpus=2)
    node.schedulable = False
    assert PodSet("w", 1, gpus=8).static_fit(node) == "unschedulable"


# ---------------------------------------------------------------- which pod sets a level binds

_DRIVER = PodSet("driver", 1, cpu_milli=1000)
_WORKERS = PodSet("workers", 4, gpus=8)


def test_a_gpu_less_pod_set_beside_gpu_pod_sets_is_free() -> None:
    gang = Gang("ns/js", (_DRIVER, _WORKERS), required_level="rack")
    assert not gang.follows_gang(_DRIVER) and gang.follows_gang(_WORKERS)
    assert gang.level_of(_DRIVER) is None and gang.level_of(_WORKERS) == "rack"
    assert gang.required_domains() == (("rack", ("workers",)),)


def test_a_gang_without_gpus_binds_every_pod_set() -> None:
    gang = Gang("ns/cpu", (_DRIVER, replace(_DRIVER, name="other")), required_level="rack")
    assert gang.required_domains() == (("rack", ("driver", "other")),)


def test_own_level_and_group_levels() -> None:
    own = replace(_DRIVER, required_level="zone")
    assert Gang("ns/g", (own, _WORKERS), required_level="rack").required_domains() == (
        ("zone", ("driver",)),
        ("rack", ("workers",)),
    )
    # a group: the GPU-less leader shares its workers' level, stated or the gang's
    leader, workers = replace(_DRIVER, group="g"), replace(_WORKERS, group="g")
    gang = Gang("ns/lws", (leader, workers), required_level="rack")
    assert gang.required_domains() == (("rack", ("driver", "workers")),)
    stated = replace(workers, required_level="host")
    assert Gang("ns/lws", (leader, stated), required_level="host").level_of(leader) == "host"
    # no level anywhere: nothing is bound
    assert Gang("ns/free", (_DRIVER, _WORKERS)).required_domains() == ()
