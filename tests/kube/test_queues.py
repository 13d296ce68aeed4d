"""The queue lookup that decides whether a pod is gated: a missing or malformed link in
LocalQueue → ClusterQueue → checks means "not ours", never a crash."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexus_admit.kube import labels as L
from nexus_admit.kube.queues import (
    cluster_queue_checks,
    gated_queue_key,
    gated_queues,
    pod_queue,
    queue_uses_check,
)

CHECK = "nexus-placement"


def lq(name: str, cq: Any, ns: str = "team") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"clusterQueue": cq}}


def cq(name: str, *checks: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": c} for c in checks]}},
    }


def lookup_of(*objects: tuple[str, Mapping[str, Any]]) -> Any:
    table: dict[tuple[str, str], Mapping[str, Any]] = {}
    for kind, obj in objects:
        m = obj["metadata"]
        key = f"{m['namespace']}/{m['name']}" if kind == "LocalQueue" else m["name"]
        table[(kind, key)] = obj
    return lambda kind, key: table.get((kind, key))


WITH = lookup_of(
    ("LocalQueue", lq("gpu", "gpu-cq")),
    ("LocalQueue", lq("cpu", "cpu-cq")),
    ("LocalQueue", lq("dangling", "no-such-cq")),
    ("LocalQueue", lq("empty", None)),
    ("ClusterQueue", cq("gpu-cq", "other-check", CHECK)),
    ("ClusterQueue", cq("cpu-cq", "other-check")),
)


@pytest.mark.parametrize(
    ("namespace", "queue", "gated"),
    [
        pytest.param("team", "gpu", True, id="queue-with-the-check"),
        pytest.param("team", "cpu", False, id="check-not-listed"),
        pytest.param("team", "nope", False, id="local-queue-missing"),
        pytest.param("other", "gpu", False, id="same-name-other-namespace"),
        pytest.param("team", "dangling", False, id="cluster-queue-missing"),
        pytest.param("team", "empty", False, id="local-queue-names-no-cluster-queue"),
        pytest.param("team", "", False, id="no-queue-label"),
    ],
)
def test_a_pod_is_gated_only_through_a_queue_that_lists_the_check(
    namespace: str, queue: str, gated: bool
) -> None:
    assert queue_uses_check(namespace, queue, WITH, {CHECK}) is gated


def test_no_checks_of_ours_gate_nothing() -> None:
    assert not queue_uses_check("team", "gpu", WITH, set())


@pytest.mark.parametrize(
    "spec",
    [
        None,
        [],
        "x",
        {"admissionChecksStrategy": "x"},
        {"admissionChecksStrategy": {"admissionChecks": "nexus-placement"}},
        {"admissionChecksStrategy": {"admissionChecks": [CHECK[0], None, 3, {"name": 5}]}},
        {"admissionChecks": "nexus-placement"},
    ],
)
def test_a_malformed_cluster_queue_lists_no_check(spec: Any) -> None:
    assert CHECK not in cluster_queue_checks({"metadata": {"name": "x"}, "spec": spec})


def test_the_older_plain_list_of_checks_counts_too() -> None:
    assert cluster_queue_checks({"spec": {"admissionChecks": [CHECK]}}) == {CHECK}


@pytest.mark.parametrize(
    "pod",
    [
        {},
        {"metadata": None},
        {"metadata": {"labels": []}},
        {"metadata": {"labels": {L.KUEUE_QUEUE_NAME_LABEL: 3}}},
    ],
)
def test_a_malformed_pod_names_no_queue(pod: Any) -> None:
    assert pod_queue(pod) == ""


def test_gated_queues_lists_every_local_queue_with_its_cluster_queue_only_when_it_uses_the_check(
) -> None:
    local = [
        lq("gpu", "gpu-cq"),
        lq("gpu", "gpu-cq", ns="other"),
        lq("cpu", "cpu-cq"),
        lq("dangling", "no-such-cq"),
        {"metadata": "junk"},
        "junk",
        {"metadata": {"name": 3, "namespace": "team"}, "spec": {"clusterQueue": "gpu-cq"}},
    ]
    clusters = [cq("gpu-cq", CHECK), cq("cpu-cq"), {"metadata": None}, cq("odd", None)]
    listed, problems = gated_queues(local, clusters, {CHECK})  # type: ignore[arg-type]
    # listed with "": known not to use the check (never gated); absent: not known yet
    # and each namespace: does one of its queues use the check
    assert listed == {"team.gpu": "gpu-cq", "other.gpu": "gpu-cq", "team.cpu": "",
                      "team.dangling": "", "team": "uses-check", "other": "uses-check"}
    assert problems == []


def test_a_queue_name_too_long_for_a_configmap_key_is_reported_not_listed() -> None:
    long = "q" * 250
    listed, problems = gated_queues([lq(long, "gpu-cq")], [cq("gpu-cq", CHECK)], {CHECK})
    assert listed == {}
    assert len(problems) == 1 and f"team/{long}" in problems[0]
    assert gated_queue_key("team", long) is None


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(st.lists(json_like, max_size=4), st.lists(json_like, max_size=4))
def test_arbitrary_objects_never_crash_the_queue_list(local: Any, clusters: Any) -> None:
    listed, _ = gated_queues(local, clusters, {CHECK})
    assert all(isinstance(v, str) for v in listed.values())


@given(json_like, json_like)
def test_arbitrary_objects_never_crash_the_lookup(local: Any, cluster: Any) -> None:
    def lookup(kind: str, key: str) -> Any:
        return local if kind == "LocalQueue" else cluster

    assert queue_uses_check("team", "q", lookup, {CHECK}) in (True, False)


def test_a_statefulset_is_listed_with_its_queues_value() -> None:
    """Kueue suspends a StatefulSet's pods without the queue label: the StatefulSet's own
    queue decides, under its own key; a StatefulSet of an unknown queue stays unlisted
    (its pods gated to be safe, like a queue not known yet)."""
    from nexus_admit.kube.queues import gated_parent_key, suspending_statefulset

    def sts(name: str, queue: str | None) -> dict[str, object]:
        labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
        return {"metadata": {"name": name, "namespace": "ns", "labels": labels}}

    lqs = [
        {"metadata": {"name": "gold", "namespace": "ns"}, "spec": {"clusterQueue": "cq-gold"}},
        {"metadata": {"name": "plain", "namespace": "ns"}, "spec": {"clusterQueue": "cq-plain"}},
    ]
    cqs = [
        {
            "metadata": {"name": "cq-gold"},
            "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": "nexus"}]}},
        },
        {"metadata": {"name": "cq-plain"}, "spec": {}},
    ]
    stss = [sts("db", "gold"), sts("web", "plain"), sts("lost", "nowhere"), sts("free", None)]
    listed, _ = gated_queues(lqs, cqs, {"nexus"}, stss)
    assert listed[str(gated_parent_key("ns", "StatefulSet", "db"))] == "cq-gold"
    assert listed[str(gated_parent_key("ns", "StatefulSet", "web"))] == ""
    assert "ns_StatefulSet_lost" not in listed and "ns_StatefulSet_free" not in listed
    pod = {
        "metadata": {
            "annotations": {"kueue.x-k8s.io/pod-suspending-parent": "statefulset"},
            "ownerReferences": [{"kind": "StatefulSet", "name": "db", "uid": "u"}],
        }
    }
    assert suspending_statefulset(pod) == "db"
    pod["metadata"]["annotations"] = {}
    assert suspending_statefulset(pod) == ""
