"""Effective requests of a pod spec; a shape of requests translated once and shared, never
an answer for a malformed spec."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import TranslationError
from nexus_admit.kube.requests import pod_requests


def _pod(requests: dict[str, Any], limits: dict[str, Any] | None = None,
         init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [
        {"name": "c", "resources": {"requests": requests, **({"limits": limits} if limits else {})}}
    ]}
    if init is not None:
        spec["initContainers"] = init
    return {"kind": "Pod", "metadata": {"name": "p", "namespace": "t"}, "spec": spec}


def test_effective_requests_in_model_units() -> None:
    got = pod_requests(*_args(_pod({"cpu": "1500m", "memory": "1Gi"}, {L.GPU_RESOURCE: "2"})))
    assert (got.cpu_milli, got.memory_mib, got.gpus) == (1500, 1024, 2)
    # a sidecar adds to the containers; a classic init container counts only at its peak
    sidecar = {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}}
    init = {"name": "i", "resources": {"requests": {"cpu": "4"}}}
    got = pod_requests(*_args(_pod({"cpu": "1500m"}, init=[sidecar, init])))
    assert got.cpu_milli == 5000  # max(1.5 + 1, 1 + 4)
    got = pod_requests(*_args(_pod({"cpu": "1500m"}, init=[init, sidecar])))
    assert got.cpu_milli == 4000  # max(1.5 + 1, 4): the sidecar starts after it


def test_one_shape_of_requests_is_one_answer() -> None:
    a = pod_requests(*_args(_pod({"cpu": "3", "memory": "5Gi"})))
    b = pod_requests(*_args(_pod({"cpu": "3", "memory": "5Gi"})))
    assert a is b


@pytest.mark.parametrize("bad", [True, {"cpu": "1"}, "lots"], ids=["boolean", "object", "text"])
def test_a_malformed_quantity_is_refused_though_a_valid_look_alike_was_seen(bad: Any) -> None:
    pod_requests(*_args(_pod({"cpu": "1"})))
    pod_requests(*_args(_pod({"cpu": 1})))  # a number: the long way, the same value
    for _ in range(2):  # refused every time, never kept
        with pytest.raises(TranslationError, match=r"cpu"):
            pod_requests(*_args(_pod({"cpu": bad})))


def test_a_fractional_gpu_is_refused_every_time() -> None:
    for _ in range(2):
        with pytest.raises(TranslationError, match="whole devices"):
            pod_requests(*_args(_pod({L.GPU_RESOURCE: "0.5"})))


@pytest.mark.parametrize(
    ("pod_level", "cpu_milli", "memory_mib"),
    [
        ({"requests": {"cpu": "6"}}, 6000, 1024),
        ({"requests": {"memory": "4Gi"}, "limits": {"cpu": "8", "memory": "4Gi"}}, 1500, 4096),
        ({"limits": {"cpu": "8", "memory": "8Gi"}}, 1500, 1024),
        ({"limits": {"cpu": "8", "hugepages-2Mi": "1Gi"}}, 1500, 1024),
        ({"requests": {L.GPU_RESOURCE: "4"}}, 1500, 1024),
    ],
    ids=["request-replaces-the-sum", "limit-of-a-resource-no-container-requests",
         "limit-of-requested-resources-changes-nothing", "hugepages-by-limit",
         "a-gpu-is-no-pod-level-resource"],
)
def test_pod_level_resources_replace_the_containers_figure(
    pod_level: dict[str, Any], cpu_milli: int, memory_mib: int
) -> None:
    """kube-scheduler reads pod-level `spec.resources` for CPU, memory and hugepages in
    place of the containers' sum; a pod-level limit alone is the request only where no
    container requests that resource (the apiserver's defaulting of the pod)."""
    pod = _pod({"cpu": "1500m", "memory": "1Gi"}, {L.GPU_RESOURCE: "2"})
    pod["spec"]["resources"] = pod_level
    pod["spec"]["overhead"] = {"cpu": "0"}
    got = pod_requests(*_args(pod))
    assert (got.cpu_milli, got.memory_mib, got.gpus) == (cpu_milli, memory_mib, 2)
    if "hugepages-2Mi" in pod_level.get("limits", {}):
        assert got.raw is not None and got.raw["hugepages-2Mi"] == 2**30


def test_pod_overhead_adds_to_pod_level_resources() -> None:
    pod = _pod({"memory": "1Gi"})
    pod["spec"] |= {"resources": {"requests": {"memory": "3Gi"}}, "overhead": {"memory": "1Gi"}}
    assert pod_requests(*_args(pod)).memory_mib == 4096


def test_pod_level_shapes_are_kept_apart() -> None:
    """The shared answer per shape of requests tells pods with and without pod-level
    resources apart."""
    plain = _pod({"cpu": "1"})
    pod_level = _pod({"cpu": "1"})
    pod_level["spec"]["resources"] = {"requests": {"cpu": "3"}}
    assert pod_requests(*_args(plain)).cpu_milli == 1000
    assert pod_requests(*_args(pod_level)).cpu_milli == 3000
    assert pod_requests(*_args(plain)).cpu_milli == 1000


def test_malformed_pod_level_resources_are_refused() -> None:
    pod = _pod({"cpu": "1"})
    pod["spec"]["resources"] = {"requests": {"cpu": "lots"}}
    for _ in range(2):
        with pytest.raises(TranslationError, match=r"spec\.resources\.requests\[cpu\]"):
            pod_requests(*_args(pod))


def _args(pod: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    return pod, pod["spec"]
