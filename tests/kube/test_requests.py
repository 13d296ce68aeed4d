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


def _args(pod: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    return pod, pod["spec"]
