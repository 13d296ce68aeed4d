"""Cluster dumps: kubectl List output, multi-document YAML, nested Lists."""

from pathlib import Path

import pytest
import yaml
from kube_factories import node, pod, pod_set, workload

from nexus_admit.kube.dump import ClusterDump, DumpError, flatten, load_dump, load_objects
from nexus_admit.kube.errors import TranslationError
from nexus_admit.model import PlacementConfig

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "samples" / "cluster-dump.yaml"


def test_kubectl_list() -> None:
    text = yaml.safe_dump(
        {"apiVersion": "v1", "kind": "List", "items": [node("n1"), pod("p", "n1")]}
    )
    objs = load_objects(text)
    assert [o["kind"] for o in objs] == ["Node", "Pod"]


def test_multi_document_with_nested_lists_and_typed_lists() -> None:
    docs = [
        node("n1"),
        None,
        {"kind": "List", "items": [pod("p", "n1"), {"kind": "List", "items": [node("n2")]}]},
        {
            "apiVersion": "v1",
            "kind": "NodeList",
            "items": [{"metadata": {"name": "n3"}, "status": {"allocatable": {"cpu": "1"}}}],
        },
    ]
    text = yaml.safe_dump_all(docs)
    dump = ClusterDump.of(load_objects(text))
    assert [n["metadata"]["name"] for n in dump.kind("Node")] == ["n1", "n2", "n3"]
    assert len(dump.kind("Pod")) == 1


def test_bad_documents() -> None:
    with pytest.raises(DumpError, match="not valid YAML"):
        load_objects("a: [")
    with pytest.raises(DumpError, match="has no kind"):
        load_objects("metadata: {name: x}\n")
    with pytest.raises(DumpError, match="not a Kubernetes object"):
        list(flatten([[1, 2]]))
    with pytest.raises(DumpError, match="cannot read"):
        load_objects(Path("/nonexistent/dump.yaml"))


def test_pending_workloads_in_creation_order() -> None:
    ac = {
        "kind": "AdmissionCheck",
        "metadata": {"name": "nexus"},
        "spec": {"controllerName": "kubenexus.io/placement"},
    }
    wls = [
        workload("late", [pod_set()], created="2025-05-01T10:00:02Z"),
        workload("early", [pod_set()], created="2025-05-01T10:00:01Z"),
        workload("ready", [pod_set()], check_state="Ready", created="2025-05-01T09:00:00Z"),
    ]
    dump = ClusterDump.of([ac, *wls])
    assert [w["metadata"]["name"] for w in dump.pending_workloads()] == ["early", "late"]
    assert dump.find_workload("default/ready") == wls[2]
    assert dump.find_workload("ready") == wls[2]
    assert dump.find_workload("nope/ready") is None


def test_placement_config_selection() -> None:
    def pc(name: str, tier: str) -> dict:
        return {
            "apiVersion": "scheduling.kubenexus.io/v1alpha1",
            "kind": "PlacementConfig",
            "metadata": {"name": name},
            "spec": {"defaultTier": tier},
        }

    assert ClusterDump.of([]).placement_config() == PlacementConfig()
    assert ClusterDump.of([pc("only", "gold")]).placement_config().default_tier == "gold"
    both = [pc("default", "silver"), pc("other", "gold")]
    assert ClusterDump.of(both).placement_config().default_tier == "silver"
    ac = {
        "kind": "AdmissionCheck",
        "metadata": {"name": "nexus"},
        "spec": {
            "controllerName": "kubenexus.io/placement",
            "parameters": {
                "apiGroup": "scheduling.kubenexus.io",
                "kind": "PlacementConfig",
                "name": "other",
            },
        },
    }
    assert ClusterDump.of([*both, ac]).placement_config().default_tier == "gold"
    ac["spec"]["parameters"]["name"] = "ghost"
    with pytest.raises(TranslationError, match="ghost"):
        ClusterDump.of([*both, ac]).placement_config()
    bad = pc("default", "diamond")
    with pytest.raises(TranslationError) as e:
        ClusterDump.of([bad]).placement_config()
    assert e.value.obj_ref == "PlacementConfig default"
    assert "diamond" in e.value.message


def test_sample_dump() -> None:
    dump = load_dump(SAMPLE)
    config = dump.placement_config()
    assert config.topology.topology_name == "gpu-fabric"
    pending = dump.pending_workloads()
    assert [w["metadata"]["name"] for w in pending] == [
        "llm-pretrain",
        "resnet-sweep",
        "llama-405b-serve",
    ]
    snap = dump.snapshot(exclude_workloads=["team-llm/llm-pretrain"])
    assert len(snap) == 8
    assert snap.kueue_topologies["gpu-fabric"][-1] == "kubernetes.io/hostname"
    # a100-2: one slot bound to a pod, one open slot, 4 GPUs each → full
    assert snap.nodes["a100-2"].free_whole_gpus == 0
    assert snap.nodes["a100-2"].free_pods == 108
    # the finished pod on a100-1 holds nothing
    assert snap.nodes["a100-1"].free_whole_gpus == 8
    # h100-a2 runs a 4-GPU pod in NUMA zone 0 (NRT says 79 CPUs available there)
    h = snap.nodes["h100-a2"]
    assert h.gpu_free == [0, 0, 0, 0, 1000, 1000, 1000, 1000]
    assert [z.free_cpu_milli for z in h.numa_zones] == [79_000, 111_000]
    # a notebook takes half an L40S
    assert sorted(snap.nodes["l40s-1"].gpu_free) == [500, 1000, 1000, 1000]
    gangs = [dump.gang(w, config, snap) for w in pending]
    assert [g.tier for g in gangs] == ["gold", "bronze", "silver"]
    assert [g.workload_type.value for g in gangs] == ["training", "batch", "inference"]
    assert gangs[0].pod_sets[0].allowed_nodes == frozenset({"h100-a1", "h100-a2", "h100-b1"})
    assert gangs[0].preferred_level == "cloud.google.com/gce-topology-subblock"
    assert gangs[2].pod_sets[0].vram_mib == 141 * 1024


def test_topology_name_missing_is_reported() -> None:
    dump = ClusterDump.of([node("n1"), workload("w", [pod_set()], cluster_queue=None)])
    config = PlacementConfig.from_spec({"topology": {"topologyName": "nope"}})
    with pytest.raises(TranslationError, match="nope"):
        dump.gang(dump.kind("Workload")[0], config, dump.snapshot())
