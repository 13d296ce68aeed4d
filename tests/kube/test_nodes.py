"""Node objects → model Nodes: allocatable, GFD labels, taints, NUMA zones, DRA."""

from typing import Any

import pytest
from kube_factories import GPU_TAINT, node, nrt

from nexus_admit.kube.cluster import node_from_object, topologies_from_objects
from nexus_admit.kube.cluster.nodes import node_not_ready
from nexus_admit.kube.errors import TranslationError
from nexus_admit.model import GPU_WHOLE, Taint


def test_allocatable_and_gfd_labels() -> None:
    obj = node(
        "h1",
        cpu="222",
        memory="1980Gi",
        pods="64",
        labels={"nvidia.com/gpu.clique": "c1.7", "rack": "r1"},
        taints=[GPU_TAINT],
    )
    n, avail = node_from_object(obj)
    assert n.name == "h1"
    assert (n.cpu_milli, n.memory_mib, n.max_pods) == (222_000, 1980 * 1024, 64)
    assert (n.free_cpu_milli, n.free_memory_mib, n.free_pods) == (222_000, 1980 * 1024, 64)
    assert n.gpu_product == "NVIDIA-H100-80GB-HBM3"
    assert n.gpu_memory_mib == 81559
    assert n.gpu_free == [GPU_WHOLE] * 8
    assert n.clique == "c1.7"
    assert n.labels["rack"] == "r1"
    assert n.taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    assert n.schedulable
    assert n.numa_zones == []
    assert avail == {}


def test_cpu_only_node_and_unschedulable() -> None:
    n, _ = node_from_object(node("c1", gpus=0, unschedulable=True))
    assert n.gpu_count == 0
    assert n.gpu_product == ""
    assert n.gpu_memory_mib == 0
    assert not n.schedulable
    assert n.clique is None


def test_gpu_count_follows_allocatable_not_label() -> None:
    obj = node("h1", gpus=8)
    obj["status"]["allocatable"]["nvidia.com/gpu"] = "7"  # one device unhealthy
    n, _ = node_from_object(obj)
    assert n.gpu_count == 7


def test_time_slicing_replicas_count_devices() -> None:
    obj = node("l1", gpus=4, labels={"nvidia.com/gpu.replicas": "4"})
    obj["status"]["allocatable"]["nvidia.com/gpu"] = "16"
    n, _ = node_from_object(obj)
    assert n.gpu_count == 4


def test_capacity_used_when_allocatable_missing() -> None:
    obj = node("h1", cpu="8")
    del obj["status"]["allocatable"]
    n, _ = node_from_object(obj)
    assert n.cpu_milli == 8000


def _ready(status: str, reason: str | None = None) -> dict[str, Any]:
    obj = node("h1")
    condition = {"type": "Ready", "status": status} | ({"reason": reason} if reason else {})
    obj["status"]["conditions"] = [{"type": "DiskPressure", "status": "False"}, condition]
    return obj


@pytest.mark.parametrize(
    ("obj", "schedulable", "why"),
    [
        pytest.param(_ready("True"), True, None, id="ready"),
        pytest.param(node("h1"), True, None, id="no-conditions-yet"),
        pytest.param(_ready("False", "KubeletNotReady"), False,
                     "NotReady (Ready False: KubeletNotReady)", id="not-ready"),
        pytest.param(_ready("Unknown", "NodeStatusUnknown"), False,
                     "NotReady (Ready Unknown: NodeStatusUnknown)", id="unreachable"),
    ],
)
def test_a_node_that_is_not_ready_takes_no_placement(
    obj: dict[str, Any], schedulable: bool, why: str | None
) -> None:
    """Whatever a pod tolerates: a NotReady node's taints may be tolerated, its kubelet
    still runs nothing."""
    n, _ = node_from_object(obj)
    assert n.schedulable is schedulable
    assert node_not_ready(obj) == why


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda o: o["status"].update({"conditions": "Ready"}), "status.conditions"),
        (lambda o: o["status"].update({"conditions": [7]}), "status.conditions[0]"),
        (
            lambda o: o["status"].update({"conditions": [{"type": "Ready", "status": "yes"}]}),
            "status.conditions[0].status",
        ),
        (
            lambda o: o["metadata"]["labels"].update({"nvidia.com/gpu.memory": "80GB"}),
            "metadata.labels[nvidia.com/gpu.memory]",
        ),
        (lambda o: o["status"]["allocatable"].update({"cpu": "lots"}), "status.allocatable[cpu]"),
        (
            lambda o: o["status"]["allocatable"].update({"memory": "-1Gi"}),
            "status.allocatable[memory]",
        ),
        (
            lambda o: o["spec"].update({"taints": [{"key": "k", "effect": "Sometimes"}]}),
            "spec.taints[0].effect",
        ),
        (lambda o: o["spec"].update({"taints": [{"effect": "NoSchedule"}]}), "spec.taints[0].key"),
        (lambda o: o["metadata"].update({"labels": ["a"]}), "metadata.labels"),
    ],
)
def test_malformed_node_names_field(mutate: Any, field: str) -> None:
    obj = node("bad")
    mutate(obj)
    with pytest.raises(TranslationError) as e:
        node_from_object(obj)
    assert e.value.obj_ref == "Node bad"
    assert e.value.field == field
    assert str(e.value).startswith(f"Node bad, field {field}: ")


def test_numa_from_node_resource_topology() -> None:
    n, avail = node_from_object(
        node("h1", cpu="224"), nrt=nrt("h1", [("112", 4), ("112", 4)], ["100", "112"])
    )
    assert [(z.id, z.gpu_indices, z.cpu_milli) for z in n.numa_zones] == [
        (0, (0, 1, 2, 3), 112_000),
        (1, (4, 5, 6, 7), 112_000),
    ]
    assert avail == {0: 100_000, 1: 112_000}
    assert n.numa_zone_of_gpu(5) == 1


def test_nrt_zones_sorted_by_name_number_and_non_node_zones_ignored() -> None:
    obj = nrt("h1", [("10", 2), ("20", 6)])
    obj["zones"][0]["name"], obj["zones"][1]["name"] = "node-1", "node-0"
    obj["zones"].append({"name": "core-0", "type": "Core", "resources": []})
    n, _ = node_from_object(node("h1"), nrt=obj)
    assert [(z.id, z.gpu_indices, z.cpu_milli) for z in n.numa_zones] == [
        (0, (0, 1, 2, 3, 4, 5), 20_000),
        (1, (6, 7), 10_000),
    ]


def test_nrt_without_gpu_counts_splits_gpus_evenly() -> None:
    n, _ = node_from_object(node("h1"), nrt=nrt("h1", [("32", 0), ("32", 0)]))
    assert [z.gpu_indices for z in n.numa_zones] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_numa_label_fallback() -> None:
    n, _ = node_from_object(
        node("l1", cpu="126", gpus=4, labels={"scheduling.kubenexus.io/numa-zones": "2"})
    )
    assert [(z.id, z.gpu_indices, z.cpu_milli, z.free_cpu_milli) for z in n.numa_zones] == [
        (0, (0, 1), 63_000, 63_000),
        (1, (2, 3), 63_000, 63_000),
    ]


def _slice(node_name: str, devices: list[dict[str, Any]], *, beta: bool = False) -> dict[str, Any]:
    if beta:
        devices = [
            {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
            for d in devices
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node_name}-gpu"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _dra_gpu(i: int, numa: int | None = None) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "type": {"string": "gpu"},
        "index": {"int": i},
        "productName": {"string": "NVIDIA H200"},
        "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{i:02x}"},
    }
    if numa is not None:
        attrs["numaNode"] = {"int": numa}
    return {"name": f"gpu-{i}", "attributes": attrs, "capacity": {"memory": {"value": "143771Mi"}}}


@pytest.mark.parametrize("beta", [False, True])
def test_dra_resource_slices_give_gpus_when_no_device_plugin(beta: bool) -> None:
    obj = node("d1", gpus=0)
    devices = [_dra_gpu(i, numa=i // 2) for i in range(4)]
    devices.append({"name": "mig-0", "attributes": {"type": {"string": "mig"}}})
    n, _ = node_from_object(obj, resource_slices=[_slice("d1", devices, beta=beta)])
    assert n.gpu_count == 4
    assert n.gpu_product == "NVIDIA-H200"
    assert n.gpu_memory_mib == 143771
    assert [z.gpu_indices for z in n.numa_zones] == [(0, 1), (2, 3)]


def test_dra_other_drivers_ignored() -> None:
    sl = _slice("d1", [_dra_gpu(0)])
    sl["spec"]["driver"] = "example.com/fpga"
    n, _ = node_from_object(node("d1", gpus=0), resource_slices=[sl])
    assert n.gpu_count == 0


def test_topologies() -> None:
    topo = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": "fabric"},
        "spec": {"levels": [{"nodeLabel": "block"}, {"nodeLabel": "kubernetes.io/hostname"}]},
    }
    assert topologies_from_objects([topo]) == {"fabric": ("block", "kubernetes.io/hostname")}
    topo["spec"]["levels"] = [{}]
    with pytest.raises(TranslationError, match=r"spec.levels\[0\].nodeLabel"):
        topologies_from_objects([topo])
