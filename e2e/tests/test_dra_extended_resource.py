"""DRA extended-resource mapping (GA in Kubernetes 1.37) on the real control plane: a pod
asking `nvidia.com/gpu` on a node whose GPUs only a DRA driver publishes.

One KWOK node of 8 H100 without `nvidia.com/gpu` in its allocatable, its GPUs published as
ResourceSlices (e2e/dra_harness.py), and a DeviceClass that names `nvidia.com/gpu` as its
`extendedResourceName`: kube-scheduler then serves a pod's `nvidia.com/gpu` from that class,
through a ResourceClaim it makes for the pod (named in the pod's
`status.extendedResourceClaimStatus`). A plain pod (no queue) takes four GPUs that way; a Job
of the nexus queue asking four more must be placed on the same node: nexus counts the plain
pod's GPUs once, from its claim, not once more from its request (which would leave the node
full, and the Job waiting). Evidence: the node the Job's pod runs on, and the devices each
claim holds (disjoint, eight in all).

Runs on a plane that keeps `extendedResourceName` (1.36 on: the DRAExtendedResource gate is
beta there, GA in 1.37); the module skips where the apiserver drops it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import dra_harness as H
import pytest
from builders import WORKER_IMAGE, job
from dra_harness import GPUS_PER_NODE, claim_devices, claims, running_pods
from e2e_util import wait_for
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900, func_only=True)]

NODE = H.DraNode("dra-ext-0", "dra-ext-rack", "NVIDIA H100 80GB HBM3", "81559Mi", "Hopper")
CLASS = "gpu-extended.nvidia.com"
GPU = "nvidia.com/gpu"


def _device_class() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.driver == "{H.DRIVER}"'}}],
            "extendedResourceName": GPU,
        },
    }


@pytest.fixture(scope="module")
def extended_fleet(e2e_cluster: Any, kube_api) -> Any:
    custom = client.CustomObjectsApi(kube_api)
    H.bring_up(e2e_cluster, kube_api, [NODE])
    created = custom.create_cluster_custom_object(*H.RESOURCE, "deviceclasses", _device_class())

    def tear_down() -> None:
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(*H.RESOURCE, "deviceclasses", CLASS)
        H.tear_down(e2e_cluster, kube_api, [NODE])

    if created["spec"].get("extendedResourceName") != GPU:
        tear_down()
        pytest.skip("this apiserver drops DeviceClass extendedResourceName "
                    "(DRAExtendedResource off)")
    yield
    tear_down()


@pytest.fixture
def extended_ns(extended_fleet: Any, nexus_controller: Any, e2e_namespace: str,
                custom_objects, batch_v1, core_v1) -> Any:
    H.local_queue(custom_objects, e2e_namespace, [NODE.name])
    yield e2e_namespace
    batch_v1.delete_collection_namespaced_job(e2e_namespace, propagation_policy="Background")
    core_v1.delete_collection_namespaced_pod(e2e_namespace, grace_period_seconds=0)


def _plain_pod(name: str, gpus: int) -> client.V1Pod:
    """A pod of no queue, bound by kube-scheduler alone, asking `nvidia.com/gpu`."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            restart_policy="Never",
            node_selector={"kubernetes.io/hostname": NODE.name},
            containers=[client.V1Container(
                name="main", image=WORKER_IMAGE,
                resources=client.V1ResourceRequirements(
                    requests={"cpu": "4", "memory": "16Gi", GPU: str(gpus)},
                    limits={GPU: str(gpus)}),
            )],
        ),
    )


def _devices_of(custom: client.CustomObjectsApi, ns: str, pod: client.V1Pod) -> set[str]:
    """The devices the claim kube-scheduler made for `pod`'s extended resource holds."""
    status = pod.status.extended_resource_claim_status
    assert status is not None, f"{pod.metadata.name}: no extendedResourceClaimStatus"
    (claim,) = [c for c in claims(custom, ns)
                if c["metadata"]["name"] == status.resource_claim_name]
    return {device for node, device in claim_devices(claim) if node == NODE.name}


def test_gpus_a_dra_claim_serves_for_an_extended_resource_are_counted_once(
    extended_ns: str, batch_v1, core_v1, custom_objects
) -> None:
    ns = extended_ns
    core_v1.create_namespaced_pod(ns, _plain_pod("plain", 4))
    plain = wait_for("the plain pod Running", lambda: (
        p if (p := core_v1.read_namespaced_pod("plain", ns)).status.phase == "Running"
        else None), timeout=120)
    assert plain.spec.node_name == NODE.name
    held_by_plain = _devices_of(custom_objects, ns, plain)
    assert len(held_by_plain) == 4, held_by_plain

    # four more GPUs on the same node through the nexus queue: the node has exactly four
    # left, and only if the plain pod's GPUs are counted once
    batch_v1.create_namespaced_job(ns, job("extended", H.QUEUE, pods=1, gpus=4))
    (pod,) = wait_for("the Job's pod Running", lambda: (
        p if len(p := running_pods(core_v1, ns, "extended")) == 1 else None), timeout=180)
    assert pod.spec.node_name == NODE.name
    held_by_job = _devices_of(custom_objects, ns, pod)
    assert len(held_by_job) == 4 and not held_by_job & held_by_plain, (
        held_by_job, held_by_plain)
    assert len(held_by_job | held_by_plain) == GPUS_PER_NODE
