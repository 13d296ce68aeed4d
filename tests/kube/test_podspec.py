"""A pod set's pod spec as the apiserver admits its pods: a namespace LimitRange's container
defaults (the LimitRanger admission plugin), read with kube-scheduler's sum."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_admit.kube.errors import TranslationError
from nexus_admit.kube.kueue import KueueIndex
from nexus_admit.kube.podspec import with_limit_range_defaults, workload_template_requests
from nexus_admit.kube.requests import pod_requests

WORKLOAD: dict[str, Any] = {"kind": "Workload", "metadata": {"name": "w", "namespace": "team"}}


def _limit_range(name: str, *items: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "LimitRange", "metadata": {"name": name, "namespace": "team"},
            "spec": {"limits": list(items)}}


def _container(requests: dict[str, str] | None = None,
               limits: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": "c", "resources": resources, **extra}


def _admitted(spec: dict[str, Any], *limit_ranges: dict[str, Any]) -> tuple[int, int]:
    """(CPU milli, memory MiB) of one pod as kube-scheduler counts it once admitted."""
    admitted = with_limit_range_defaults(WORKLOAD, spec, limit_ranges, "spec")
    r = pod_requests(WORKLOAD, admitted, "spec")
    return r.cpu_milli, r.memory_mib


CPU_DEFAULT = _limit_range("defaults", {
    "type": "Container", "defaultRequest": {"cpu": "2", "memory": "1Gi"},
    "default": {"cpu": "4", "memory": "2Gi"}})


def test_a_container_without_requests_takes_the_default_request() -> None:
    spec = {"containers": [_container(), _container({"cpu": "1"})]}
    assert _admitted(spec) == (1000, 0)
    # the first container gets both defaults, the second only memory
    assert _admitted(spec, CPU_DEFAULT) == (3000, 2048)


def test_a_limit_alone_is_the_request_and_is_not_defaulted() -> None:
    spec = {"containers": [_container(limits={"cpu": "8"})]}
    assert _admitted(spec, CPU_DEFAULT) == (8000, 1024)


def test_init_containers_are_defaulted_and_counted_at_their_peak() -> None:
    spec = {"containers": [_container({"cpu": "1"})],
            "initContainers": [_container(restartPolicy="Always"), _container()]}
    # the sidecar (2 CPUs) runs beside the main container and the later init container:
    # max(1 + 2, 2 + 2) CPUs
    assert _admitted(spec, CPU_DEFAULT)[0] == 4000


@pytest.mark.parametrize(
    ("item", "cpu_milli"),
    [
        ({"default": {"cpu": "3"}}, 3000),
        ({"max": {"cpu": "5"}}, 5000),
        ({"min": {"cpu": "500m"}}, 500),
        ({"min": {"cpu": "500m"}, "max": {"cpu": "5"}, "defaultRequest": {"cpu": "1"}}, 1000),
        ({"type": "Pod", "max": {"cpu": "5"}}, 0),
    ],
    ids=["default-limit", "max", "min", "default-request-first", "pod-type-sets-no-default"],
)
def test_a_limit_range_as_the_apiserver_stores_it(item: dict[str, Any], cpu_milli: int) -> None:
    """An unset defaultRequest is the default, else the max, else the min (the apiserver's
    defaulting of a LimitRange; a dump may hold one without it)."""
    lr = _limit_range("lr", {"type": "Container", **item})
    assert _admitted({"containers": [_container()]}, lr)[0] == cpu_milli


def test_of_several_limit_ranges_the_first_by_name_sets_a_default() -> None:
    later = _limit_range("b", {"type": "Container", "defaultRequest": {"cpu": "7"}})
    first = _limit_range("a", {"type": "Container", "defaultRequest": {"memory": "3Gi"}},
                         {"type": "Container", "defaultRequest": {"cpu": "5"}})
    assert _admitted({"containers": [_container()]}, later, first) == (5000, 3072)


def test_pod_level_requests_are_fixed_before_the_containers_are_defaulted() -> None:
    """A pod-level limit with no request for it is the pod's request (the pod's defaulting
    runs before admission); the containers' defaults do not change it."""
    spec = {"containers": [_container()], "resources": {"limits": {"cpu": "6"}}}
    assert _admitted(spec) == (6000, 0)
    assert _admitted(spec, CPU_DEFAULT) == (6000, 1024)
    stated = {"containers": [_container()], "resources": {"requests": {"memory": "8Gi"}}}
    assert _admitted(stated, CPU_DEFAULT) == (2000, 8192)


def test_nothing_to_default_leaves_the_spec_as_it_is() -> None:
    spec = {"containers": [_container({"cpu": "1", "memory": "1Gi"})]}
    assert with_limit_range_defaults(WORKLOAD, spec, [CPU_DEFAULT], "spec") is not spec
    assert with_limit_range_defaults(WORKLOAD, spec, [], "spec") is spec
    pvc_only = _limit_range("pvc", {"type": "PersistentVolumeClaim", "max": {"storage": "1Gi"}})
    assert with_limit_range_defaults(WORKLOAD, spec, [pvc_only], "spec") is spec


def test_a_malformed_default_names_the_limit_range() -> None:
    broken = _limit_range("broken", {"type": "Container", "defaultRequest": {"cpu": "lots"}})
    with pytest.raises(TranslationError, match="LimitRange team/broken"):
        with_limit_range_defaults(WORKLOAD, {"containers": [_container()]}, [broken], "spec")


def test_template_requests_are_the_admitted_pods_when_the_defaults_are_known() -> None:
    # what a TAS assignment holds and a reservation without requests takes (one reader)
    workload = {**WORKLOAD, "spec": {"podSets": [{"name": "main", "count": 1, "template": {
        "spec": {"runtimeClassName": "kata", "containers": [_container({"memory": "2Gi"})]}}}]}}
    kata = {"kind": "RuntimeClass", "metadata": {"name": "kata"}, "handler": "kata",
            "overhead": {"podFixed": {"cpu": "250m", "memory": "160Mi"}}}
    admitted = KueueIndex.of(runtime_classes=[kata], limit_ranges=[CPU_DEFAULT])
    assert workload_template_requests(workload) == {("team/w", "main"): (0, 2048, 0)}
    assert workload_template_requests(workload, admitted) == {
        ("team/w", "main"): (2_000 + 250, 2048 + 160, 0)}
