"""Kueue v1beta2 Workloads → Gangs: every field, and the messages for bad input."""

from typing import Any

import pytest
from kube_factories import (
    admission_check,
    cluster_queue,
    flavor,
    local_queue,
    node,
    pod_set,
    workload,
)

from nexus_admit.kube.cluster import node_from_object
from nexus_admit.kube.errors import TranslationError
from nexus_admit.kube.kueue import KueueIndex, is_pending_on_check, our_check_names
from nexus_admit.kube.workload import (
    classify_workload,
    reads_job_completion_mode,
    workload_to_gang,
)
from nexus_admit.model import (
    Gang,
    NodeSelectorRequirement,
    NumaPolicy,
    PlacementConfig,
    Toleration,
    WorkloadType,
)

CONFIG = PlacementConfig()
LEVELS = CONFIG.resolve_levels({})


def _kueue(**kw: Any) -> KueueIndex:
    kw.setdefault("cluster_queues", [cluster_queue("cq", "gold")])
    return KueueIndex.of(**kw)


def _gang(
    wl: dict[str, Any],
    kueue: KueueIndex | None = None,
    nodes: Any = None,
    levels: Any = LEVELS,
    config: PlacementConfig = CONFIG,
):
    return workload_to_gang(wl, config=config, kueue=kueue or _kueue(), nodes=nodes, levels=levels)


def test_basic_fields() -> None:
    wl = workload(
        "train",
        [
            pod_set("launcher", 1, cpu="2", memory="4Gi", gpus=0),
            pod_set(
                "workers",
                4,
                cpu="96",
                memory="900Gi",
                gpus=8,
                annotations={"scheduling.kubenexus.io/gpu-memory": "70Gi"},
            ),
        ],
        namespace="team",
        owner_kind="MPIJob",
    )
    g = _gang(wl)
    assert g.name == "team/train"
    assert g.tier == "gold"
    assert g.workload_type is WorkloadType.TRAINING
    assert g.numa_policy is NumaPolicy.PREFERRED
    launcher, workers = g.pod_sets
    assert (
        launcher.name,
        launcher.count,
        launcher.cpu_milli,
        launcher.memory_mib,
        launcher.gpus,
    ) == ("launcher", 1, 2000, 4096, 0)
    assert (
        workers.count,
        workers.cpu_milli,
        workers.memory_mib,
        workers.gpus,
        workers.gpu_milli,
        workers.vram_mib,
    ) == (4, 96_000, 900 * 1024, 8, 1000, 70 * 1024)
    assert workers.indexed and launcher.indexed  # MPIJob pods carry a rank
    assert workers.allowed_nodes is None


def test_admitted_count_overrides_spec_count_and_zero_count_sets_are_skipped() -> None:
    wl = workload("w", [pod_set("a", 8), pod_set("b", 0)])
    wl["status"]["admission"]["podSetAssignments"][0]["count"] = 6
    g = _gang(wl)
    assert [(p.name, p.count) for p in g.pod_sets] == [("a", 6)]


def test_gpu_fraction() -> None:
    wl = workload(
        "w", [pod_set(gpus=1, annotations={"scheduling.kubenexus.io/gpu-fraction": "0.25"})]
    )
    (ps,) = _gang(wl).pod_sets
    assert (ps.gpus, ps.gpu_milli, ps.fractional) == (1, 250, True)
    wl = workload("w", [pod_set(gpus=1, annotations={"scheduling.kubenexus.io/gpu-fraction": "1"})])
    assert _gang(wl).pod_sets[0].gpu_milli == 1000


def test_gpu_fraction_needs_exactly_one_gpu() -> None:
    wl = workload(
        "w", [pod_set(gpus=2, annotations={"scheduling.kubenexus.io/gpu-fraction": "0.5"})]
    )
    with pytest.raises(TranslationError, match=r"exactly nvidia\.com/gpu: 1"):
        _gang(wl)


# ---------------------------------------------------------------- tier


def test_tier_via_local_queue_when_not_admitted() -> None:
    wl = workload("w", [pod_set()], namespace="ns", queue="lq", cluster_queue=None)
    kueue = KueueIndex.of(
        cluster_queues=[cluster_queue("silver-cq", "silver")],
        local_queues=[local_queue("ns", "lq", "silver-cq")],
    )
    assert _gang(wl, kueue).tier == "silver"


def test_default_tier_without_label_or_queue() -> None:
    wl = workload("w", [pod_set()], cluster_queue=None)
    assert _gang(wl, KueueIndex()).tier == "bronze"
    wl = workload("w", [pod_set()])
    assert _gang(wl, KueueIndex.of(cluster_queues=[cluster_queue("cq")])).tier == "bronze"


def test_pod_annotation_cannot_set_tier() -> None:
    wl = workload("w", [pod_set(annotations={"scheduling.kubenexus.io/tier": "gold"})])
    kueue = KueueIndex.of(cluster_queues=[cluster_queue("cq", "bronze")])
    assert _gang(wl, kueue).tier == "bronze"


def test_unknown_tier_label_blames_the_cluster_queue() -> None:
    kueue = KueueIndex.of(cluster_queues=[cluster_queue("cq", "platinum")])
    with pytest.raises(TranslationError) as e:
        _gang(workload("w", [pod_set()]), kueue)
    assert e.value.obj_ref == "ClusterQueue cq"
    assert e.value.field == "metadata.labels[scheduling.kubenexus.io/tier]"
    assert "'gold'" in e.value.message


# ---------------------------------------------------------------- workload type


@pytest.mark.parametrize(
    ("kind", "gpus", "expected"),
    [
        ("JobSet", 8, WorkloadType.TRAINING),
        ("PyTorchJob", 8, WorkloadType.TRAINING),
        ("TFJob", 1, WorkloadType.TRAINING),
        ("MPIJob", 8, WorkloadType.TRAINING),
        ("RayJob", 1, WorkloadType.TRAINING),
        ("TrainJob", 1, WorkloadType.TRAINING),
        ("Job", 1, WorkloadType.BATCH),
        ("SparkApplication", 0, WorkloadType.BATCH),
        ("LeaderWorkerSet", 8, WorkloadType.INFERENCE),
        ("RayService", 1, WorkloadType.INFERENCE),
        ("Deployment", 1, WorkloadType.INFERENCE),
        ("Deployment", 0, WorkloadType.SERVICE),
        ("StatefulSet", 0, WorkloadType.SERVICE),
        ("RayCluster", 0, WorkloadType.SERVICE),
    ],
)
def test_classify_by_owner(kind: str, gpus: int, expected: WorkloadType) -> None:
    assert classify_workload(workload("w", [pod_set(gpus=gpus)], owner_kind=kind)) is expected


@pytest.mark.parametrize(
    ("labels", "gpus", "expected"),
    [
        ({"serving.kserve.io/inferenceservice": "llama"}, 1, WorkloadType.INFERENCE),
        ({"app.kubernetes.io/component": "predictor"}, 1, WorkloadType.INFERENCE),
        ({"training.kubeflow.org/job-name": "x"}, 8, WorkloadType.TRAINING),
        ({"spark-role": "executor"}, 0, WorkloadType.BATCH),
        ({"pod-template-hash": "abc"}, 1, WorkloadType.INFERENCE),
        ({"pod-template-hash": "abc"}, 0, WorkloadType.SERVICE),
        ({}, 1, WorkloadType.BATCH),
    ],
)
def test_classify_plain_pods_by_labels(
    labels: dict[str, str], gpus: int, expected: WorkloadType
) -> None:
    wl = workload("w", [pod_set(gpus=gpus, labels=labels)], owner_kind="Pod")
    assert classify_workload(wl) is expected


def test_indexed_job_with_gpus_is_training() -> None:
    wl = workload("w", [pod_set(count=4, gpus=8)], owner_kind="Job", namespace="ns")
    job = {
        "kind": "Job",
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {"completionMode": "Indexed"},
    }
    kueue = _kueue(owners=[job])
    g = _gang(wl, kueue)
    assert g.workload_type is WorkloadType.TRAINING
    assert g.pod_sets[0].indexed
    assert not _gang(wl).pod_sets[0].indexed  # Job unknown: not indexed


def test_a_one_pod_workload_translates_alike_with_or_without_its_job() -> None:
    # the controller does not read a one-pod Workload's Job (controller/owning_jobs.py)
    wl = workload("w", [pod_set(count=1, gpus=8)], owner_kind="Job", namespace="ns")
    job = {
        "kind": "Job",
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {"completionMode": "Indexed"},
    }
    assert not reads_job_completion_mode(wl)
    assert _gang(wl, _kueue(owners=[job])) == _gang(wl)
    assert reads_job_completion_mode(workload("w", [pod_set(count=2)], owner_kind="Job"))
    assert reads_job_completion_mode(workload("w", [pod_set(), pod_set("b")], owner_kind="Job"))
    malformed = workload("w", [pod_set()], owner_kind="Job")
    malformed["spec"]["podSets"] = {"not": "a list"}
    assert reads_job_completion_mode(malformed)  # read as before; the translation says why


def test_workload_type_annotation_overrides() -> None:
    wl = workload(
        "w",
        [pod_set(annotations={"scheduling.kubenexus.io/workload-type": "Inference"})],
        owner_kind="JobSet",
    )
    assert _gang(wl).workload_type is WorkloadType.INFERENCE


def test_unknown_workload_type() -> None:
    wl = workload(
        "w", [pod_set(annotations={"scheduling.kubenexus.io/workload-type": "hpc"})], namespace="ns"
    )
    with pytest.raises(TranslationError) as e:
        _gang(wl)
    assert e.value.obj_ref == "Workload ns/w"
    assert e.value.field == (
        "spec.podSets[0].template.metadata.annotations[scheduling.kubenexus.io/workload-type]"
    )
    assert "training" in e.value.message and "'hpc'" in e.value.message


def test_pod_index_label_marks_indexed() -> None:
    wl = workload(
        "w", [pod_set(topology_request={"podIndexLabel": "kubernetes.io/job-completion-index"})]
    )
    assert _gang(wl).pod_sets[0].indexed


# ---------------------------------------------------------------- topology, NUMA


def test_topology_annotations() -> None:
    ann = {
        "scheduling.kubenexus.io/required-topology": "topology.kubernetes.io/zone",
        "scheduling.kubenexus.io/preferred-topology": "kubernetes.io/hostname",
    }
    g = _gang(workload("w", [pod_set(annotations=ann), pod_set("b", annotations=ann)]))
    assert g.required_level == "topology.kubernetes.io/zone"
    assert g.preferred_level == "kubernetes.io/hostname"


def test_kueue_topology_request_is_a_fallback() -> None:
    wl = workload("w", [pod_set(topology_request={"required": "topology.kubernetes.io/zone"})])
    assert _gang(wl).required_level == "topology.kubernetes.io/zone"
    wl = workload(
        "w",
        [
            pod_set(
                annotations={
                    "kueue.x-k8s.io/podset-preferred-topology": "topology.kubernetes.io/zone"
                }
            )
        ],
    )
    assert _gang(wl).preferred_level == "topology.kubernetes.io/zone"


def test_unknown_topology_level() -> None:
    wl = workload("w", [pod_set(annotations={"scheduling.kubenexus.io/required-topology": "rack"})])
    with pytest.raises(TranslationError) as e:
        _gang(wl)
    assert "rack" in e.value.message
    assert "topology.kubernetes.io/zone" in e.value.message
    assert e.value.field.endswith("[scheduling.kubenexus.io/required-topology]")


_REQ = "scheduling.kubenexus.io/required-topology"
_PREF = "scheduling.kubenexus.io/preferred-topology"
_TYPE = "scheduling.kubenexus.io/workload-type"
_RACK = "cloud.provider.com/topology-rack"
_ZONE = "topology.kubernetes.io/zone"
_HOST = "kubernetes.io/hostname"
_GROUP = "kueue.x-k8s.io/podset-group-name"
RACK_CONFIG = PlacementConfig.model_validate(
    {"topology": {"levels": [_ZONE, _RACK, _HOST]}}
)


RACK_LEVELS = RACK_CONFIG.resolve_levels({})


def _racked(wl: dict[str, Any], levels: Any = RACK_LEVELS) -> Gang:
    """Translated under zone › rack › host levels."""
    return _gang(wl, levels=levels, config=RACK_CONFIG)


def test_disagreeing_pod_sets_translate_each_keeps_its_own() -> None:
    wl = workload(
        "w",
        [
            pod_set("a", 2, gpus=8, annotations={_REQ: _HOST, _PREF: _RACK}),
            pod_set("b", 2, gpus=8, annotations={_REQ: _ZONE, _PREF: _ZONE}),
        ],
    )
    gang = _racked(wl)
    a, b = gang.pod_sets
    assert (a.required_level, a.preferred_level) == (_HOST, _RACK)
    assert (b.required_level, b.preferred_level) == (_ZONE, _ZONE)
    # the gang-wide levels: the narrowest the GPU pod sets ask for
    assert (gang.required_level, gang.preferred_level) == (_HOST, _RACK)
    # each pod set's own level binds it; they are different domains
    assert gang.required_domains() == ((_HOST, ("a",)), (_ZONE, ("b",)))


def test_narrowest_level_without_resolved_levels_uses_the_configs_order() -> None:
    wl = workload(
        "w",
        [
            pod_set("a", gpus=8, annotations={_REQ: _ZONE}),
            pod_set("b", gpus=8, annotations={_REQ: _RACK}),
        ],
    )
    assert _racked(wl, levels=None).required_level == _RACK


def test_gpu_less_driver_does_not_drag_the_gang() -> None:
    """A JobSet-like driver (CPU only, no level of its own) beside workers asking for a
    rack: the gang's level is the workers', the driver is not bound to it."""
    wl = workload(
        "js",
        [
            pod_set("driver", 1, cpu="2", gpus=0, annotations={_TYPE: "service"}),
            pod_set("workers", 4, gpus=8, annotations={_REQ: _RACK}),
        ],
        owner_kind="JobSet",
    )
    gang = _racked(wl)
    driver, workers = gang.pod_sets
    assert gang.required_level == _RACK
    assert gang.level_of(workers) == _RACK and gang.level_of(driver) is None
    assert gang.required_domains() == ((_RACK, ("workers",)),)
    # the driver's own type stays its own; the GPU pod sets' decides for the gang
    assert driver.workload_type is WorkloadType.SERVICE
    assert gang.workload_type is WorkloadType.TRAINING


def test_gpu_less_pod_set_with_its_own_level_is_bound_to_it() -> None:
    wl = workload(
        "js",
        [
            pod_set("driver", 1, cpu="2", gpus=0, annotations={_REQ: _RACK}),
            pod_set("workers", 4, gpus=8, annotations={_REQ: _RACK}),
        ],
    )
    gang = _racked(wl)
    assert gang.required_domains() == ((_RACK, ("driver", "workers")),)


def test_level_stated_only_by_the_gpu_less_pod_set_binds_only_it() -> None:
    wl = workload(
        "w",
        [
            pod_set("head", 1, cpu="2", gpus=0, annotations={_REQ: _ZONE}),
            pod_set("workers", 2, gpus=8),
        ],
    )
    gang = _racked(wl)
    assert gang.required_level is None
    assert gang.required_domains() == ((_ZONE, ("head",)),)


def test_gpu_pod_sets_type_with_most_gpus_leads() -> None:
    wl = workload(
        "w",
        [
            pod_set("small", 1, gpus=1, annotations={_TYPE: "inference"}),
            pod_set("big", 2, gpus=8, annotations={_TYPE: "training"}),
        ],
    )
    gang = _racked(wl)
    assert gang.workload_type is WorkloadType.TRAINING
    assert [p.workload_type for p in gang.pod_sets] == [
        WorkloadType.INFERENCE,
        WorkloadType.TRAINING,
    ]


def test_podset_group_binds_a_gpu_less_leader_with_its_workers() -> None:
    """LWS-like leader without GPUs grouped with its workers (Kueue's podset-group-name,
    from the annotation or from topologyRequest.podSetGroupName): one rack for both."""
    for leader_group in (
        {"annotations": {_GROUP: "g"}},
        {"topology_request": {"required": _RACK, "podSetGroupName": "g"}},
    ):
        wl = workload(
            "lws",
            [
                pod_set("leader", 1, cpu="2", gpus=0, **leader_group),  # type: ignore[arg-type]
                pod_set("worker", 3, gpus=8, annotations={_REQ: _RACK, _GROUP: "g"}),
            ],
            owner_kind="LeaderWorkerSet",
        )
        gang = _racked(wl)
        leader, worker = gang.pod_sets
        assert leader.group == worker.group == "g"
        assert gang.level_of(leader) == _RACK
        assert gang.required_domains() == ((_RACK, ("leader", "worker")),)


def test_group_members_asking_for_different_levels_are_refused() -> None:
    wl = workload(
        "w",
        [
            pod_set("leader", 1, annotations={_REQ: _HOST, _GROUP: "g"}),
            pod_set("worker", 3, annotations={_REQ: _ZONE, _GROUP: "g"}),
        ],
    )
    with pytest.raises(TranslationError, match="group 'g' ask for different required levels"):
        _racked(wl)


def test_numa_policy_strictest_wins_and_default_from_config() -> None:
    wl = workload(
        "w",
        [
            pod_set("a", annotations={"scheduling.kubenexus.io/numa-policy": "none"}),
            pod_set("b", annotations={"scheduling.kubenexus.io/numa-policy": "single-numa-node"}),
        ],
    )
    assert _gang(wl).numa_policy is NumaPolicy.SINGLE_NUMA_NODE
    cfg = PlacementConfig(numa_policy="none")
    assert _gang(workload("w", [pod_set()]), config=cfg).numa_policy is NumaPolicy.NONE
    bad = workload("w", [pod_set(annotations={"scheduling.kubenexus.io/numa-policy": "strict"})])
    with pytest.raises(TranslationError, match="single-numa-node"):
        _gang(bad)


# ---------------------------------------------------------------- VRAM


@pytest.mark.parametrize("bad", ["40GB", "lots", "0", "-4Gi"])
def test_malformed_gpu_memory(bad: str) -> None:
    wl = workload(
        "w", [pod_set(annotations={"scheduling.kubenexus.io/gpu-memory": bad})], namespace="ns"
    )
    with pytest.raises(TranslationError) as e:
        _gang(wl)
    assert e.value.field == (
        "spec.podSets[0].template.metadata.annotations[scheduling.kubenexus.io/gpu-memory]"
    )
    assert str(e.value).startswith("Workload ns/w, field spec.podSets[0]")
    assert repr(bad) in e.value.message


def test_gpu_memory_ignored_without_gpus() -> None:
    wl = workload(
        "w", [pod_set(gpus=0, annotations={"scheduling.kubenexus.io/gpu-memory": "40Gi"})]
    )
    assert _gang(wl).pod_sets[0].vram_mib == 0


# ---------------------------------------------------------------- selectors and flavors


def test_tolerations_selector_affinity_from_template() -> None:
    spec_extra = {
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"operator": "Exists"},
        ],
        "nodeSelector": {"pool": "a"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "gpu", "operator": "In", "values": ["h100", "h200"]}
                            ]
                        },
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["n9"]}
                            ]
                        },
                    ]
                }
            }
        },
    }
    (ps,) = _gang(workload("w", [pod_set(spec_extra=spec_extra)])).pod_sets
    assert ps.tolerations == (
        Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"),
        Toleration(None, "Exists", "", None),
    )
    assert dict(ps.node_selector) == {"pool": "a"}
    assert ps.affinity_terms == (
        (NodeSelectorRequirement("gpu", "In", ("h100", "h200")),),
        (NodeSelectorRequirement("kubernetes.io/hostname", "In", ("n9",)),),
    )


def test_bad_affinity_operator() -> None:
    spec_extra = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Near"}]}]
                }
            }
        }
    }
    with pytest.raises(TranslationError, match="not a node selector operator"):
        _gang(workload("w", [pod_set(spec_extra=spec_extra)]))


def test_flavors_give_allowed_nodes_and_tolerations() -> None:
    nodes = [
        node_from_object(node(n, product=p))[0]
        for n, p in [("h1", "H100"), ("h2", "H100"), ("a1", "A100")]
    ]
    tol = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    kueue = _kueue(
        resource_flavors=[flavor("h100", {"nvidia.com/gpu.product": "H100"}, [tol]), flavor("cpu")]
    )
    wl = workload(
        "w", [pod_set()], flavors={"nvidia.com/gpu": "h100", "cpu": "cpu", "memory": "cpu"}
    )
    (ps,) = _gang(wl, kueue, nodes=nodes).pod_sets
    assert ps.allowed_nodes == frozenset({"h1", "h2"})
    assert ps.tolerations == (Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"),)
    # without nodes the flavor's labels become a selector
    (ps,) = _gang(wl, kueue).pod_sets
    assert ps.allowed_nodes is None
    assert dict(ps.node_selector) == {"nvidia.com/gpu.product": "H100"}
    # flavor without nodeLabels: no constraint
    wl = workload("w", [pod_set()], flavors={"cpu": "cpu"})
    assert _gang(wl, kueue, nodes=nodes).pod_sets[0].allowed_nodes is None


def test_missing_flavor() -> None:
    wl = workload("w", [pod_set()], flavors={"nvidia.com/gpu": "ghost"})
    with pytest.raises(TranslationError) as e:
        _gang(wl)
    assert e.value.field == "status.admission.podSetAssignments[0].flavors[nvidia.com/gpu]"
    assert "ghost" in e.value.message


# ---------------------------------------------------------------- structural errors


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda w: w["spec"].update({"podSets": []}), "spec.podSets"),
        (
            lambda w: (w["spec"]["podSets"][0].update({"count": -1}), w.pop("status")),
            "spec.podSets[0].count",
        ),
        (
            lambda w: w["status"]["admission"]["podSetAssignments"][0].update({"count": "x"}),
            "status.admission.podSetAssignments[0].count",
        ),
        (
            lambda w: w["spec"]["podSets"][0]["template"]["spec"].update({"containers": "c"}),
            "spec.podSets[0].template.spec.containers",
        ),
        (
            lambda w: w["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"][
                "requests"
            ].update({"cpu": "fast"}),
            "spec.podSets[0].template.spec.containers[0].resources.requests[cpu]",
        ),
        (
            lambda w: w["spec"]["podSets"][0]["template"]["spec"].update(
                {"tolerations": [{"operator": "Equal", "value": "x"}]}
            ),
            "spec.podSets[0].template.spec.tolerations[0]",
        ),
    ],
)
def test_structural_errors(mutate: Any, field: str) -> None:
    wl = workload("w", [pod_set()], namespace="ns")
    mutate(wl)
    with pytest.raises(TranslationError) as e:
        _gang(wl)
    assert e.value.obj_ref == "Workload ns/w"
    assert e.value.field == field


def test_all_zero_counts() -> None:
    with pytest.raises(TranslationError, match="count 0"):
        _gang(workload("w", [pod_set(count=0)]))


# ---------------------------------------------------------------- pending


def test_pending_on_our_check() -> None:
    checks = our_check_names(
        [admission_check("nexus"), admission_check("prov", "kueue.x-k8s.io/provisioning-request")]
    )
    assert checks == {"nexus"}
    assert is_pending_on_check(workload("w", [pod_set()]), checks)


@pytest.mark.parametrize(
    "change",
    [
        {"check_state": "Ready"},
        {"check_state": "Retry"},
        {"check": "prov"},
        {"conditions": {}},
        {"conditions": {"QuotaReserved": "False"}},
        {"conditions": {"QuotaReserved": "True", "Evicted": "True"}},
        {"conditions": {"QuotaReserved": "True", "Finished": "True"}},
        {"conditions": {"QuotaReserved": "True", "Admitted": "True"}},
        {"active": False},
    ],
)
def test_not_pending(change: dict[str, Any]) -> None:
    assert not is_pending_on_check(workload("w", [pod_set()], **change), {"nexus"})


def test_pending_other_conditions_false_are_fine() -> None:
    wl = workload(
        "w",
        [pod_set()],
        conditions={"QuotaReserved": "True", "Evicted": "False", "Admitted": "False"},
        active=None,
    )
    assert is_pending_on_check(wl, {"nexus"})


def test_without_admission_check_objects_any_pending_check_counts() -> None:
    assert is_pending_on_check(workload("w", [pod_set()], check="whatever"), None)
    assert KueueIndex().our_checks() is None


def test_tas_pod_sets() -> None:
    from nexus_admit.kube.kueue import tas_pod_sets

    tas = flavor("tas", {"pool": "a"})
    tas["spec"]["topologyName"] = "fabric"
    kueue = _kueue(resource_flavors=[tas, flavor("plain")])
    wl = workload("w", [pod_set("a"), pod_set("b")])
    wl["status"]["admission"]["podSetAssignments"][0]["flavors"] = {"cpu": "tas"}
    wl["status"]["admission"]["podSetAssignments"][1]["flavors"] = {"cpu": "plain"}
    assert tas_pod_sets(wl, kueue) == ["a"]


def test_waited_time_runs_from_the_workloads_creation() -> None:
    from datetime import UTC, datetime

    wl = workload("w", [pod_set("main", 2, gpus=8)], created="2025-05-01T10:00:00Z")
    now = datetime(2025, 5, 1, 10, 30, tzinfo=UTC)
    gang = workload_to_gang(wl, config=CONFIG, kueue=_kueue(), levels=LEVELS, now=now)
    assert gang.waited_seconds == 1800.0
    assert _gang(wl).waited_seconds == 0.0  # without `now`: a fresh workload
    wl["metadata"]["creationTimestamp"] = "yesterday"
    assert workload_to_gang(wl, config=CONFIG, kueue=_kueue(), levels=LEVELS,
                            now=now).waited_seconds == 0.0
    wl["metadata"]["creationTimestamp"] = "2025-05-01T11:00:00Z"  # clock skew: never negative
    assert workload_to_gang(wl, config=CONFIG, kueue=_kueue(), levels=LEVELS,
                            now=now).waited_seconds == 0.0


def _runtime_class(name: str, pod_fixed: dict[str, str] | None) -> dict[str, Any]:
    rc: dict[str, Any] = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                          "metadata": {"name": name}, "handler": name}
    if pod_fixed is not None:
        rc["overhead"] = {"podFixed": pod_fixed}
    return rc


@pytest.mark.parametrize(
    ("spec_extra", "cpu_milli", "memory_mib"),
    [
        ({"runtimeClassName": "kata"}, 4_250, 16 * 1024 + 160),
        ({"runtimeClassName": "kata", "overhead": {"cpu": "1"}}, 5_000, 16 * 1024),
        ({"runtimeClassName": "plain"}, 4_000, 16 * 1024),
        ({"runtimeClassName": "unknown"}, 4_000, 16 * 1024),
        ({}, 4_000, 16 * 1024),
    ],
    ids=["overhead-added", "spec-states-its-own", "class-without-overhead", "class-unknown",
         "no-class"],
)
def test_a_runtime_classs_pod_overhead_joins_the_requests_as_the_apiserver_adds_it(
    spec_extra: dict[str, Any], cpu_milli: int, memory_mib: int
) -> None:
    """The RuntimeClass admission plugin sets the pod's `overhead`, which kube-scheduler
    counts; Kueue's template (the Job's spec) does not have it."""
    wl = workload("w", [pod_set("main", 2, cpu="4", memory="16Gi", spec_extra=spec_extra)])
    kueue = _kueue(runtime_classes=[_runtime_class("kata", {"cpu": "250m", "memory": "160Mi"}),
                                    _runtime_class("plain", None)])
    (ps,) = _gang(wl, kueue).pod_sets
    assert (ps.cpu_milli, ps.memory_mib) == (cpu_milli, memory_mib)


def test_a_malformed_runtime_class_overhead_names_the_runtime_class() -> None:
    wl = workload("w", [pod_set("main", 1, spec_extra={"runtimeClassName": "kata"})])
    broken = _runtime_class("kata", None) | {"overhead": {"podFixed": ["cpu"]}}
    with pytest.raises(TranslationError, match="RuntimeClass kata"):
        _gang(wl, _kueue(runtime_classes=[broken]))


def test_a_limit_range_of_the_workloads_namespace_defaults_its_pods_requests() -> None:
    """The LimitRanger admission plugin fills in the requests a container leaves out; Kueue
    applies it to its own copy for quota only, so the stored template lacks them."""
    wl = workload("w", [pod_set("main", 2, cpu="4", memory="16Gi")], namespace="team")
    container = wl["spec"]["podSets"][0]["template"]["spec"]["containers"][0]
    del container["resources"]["requests"]["cpu"]

    def limit_range(namespace: str, cpu: str) -> dict[str, Any]:
        return {"kind": "LimitRange", "metadata": {"name": "lr", "namespace": namespace},
                "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": cpu}}]}}

    kueue = _kueue(limit_ranges=[limit_range("team", "3"), limit_range("other", "50")])
    (ps,) = _gang(wl, kueue).pod_sets
    assert (ps.cpu_milli, ps.memory_mib) == (3_000, 16 * 1024)
    (ps,) = _gang(wl).pod_sets
    assert ps.cpu_milli == 0
