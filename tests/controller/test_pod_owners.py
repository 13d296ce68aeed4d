"""Membership by the owner chain Kueue uses (issue 28, item 5): a label or annotation a
tenant writes is no proof; a shared owner (a Job's pods) or the pod among the Workload's
owners (plain pods, pod groups) is."""

from __future__ import annotations

import asyncio
from typing import Any

from nexus_admit.controller.pod_owners import OwnerChains, owned_member


def obj(uid: str, owners: list[str], **meta: Any) -> dict[str, Any]:
    refs = [{"kind": "X", "name": o, "uid": o} for o in owners]
    return {"metadata": {"name": uid, "uid": uid, "ownerReferences": refs, **meta}}


def test_a_jobs_pod_shares_the_workloads_owner() -> None:
    assert owned_member(obj("p", ["job-uid"]), obj("w", ["job-uid"]))


def test_a_plain_pod_is_among_the_workloads_owners() -> None:
    assert owned_member(obj("p1", []), obj("w", ["p0", "p1"]))


def test_a_label_or_annotation_naming_the_workload_is_no_proof() -> None:
    rider = obj(
        "rider",
        ["other-job"],
        labels={"kueue.x-k8s.io/pod-group-name": "w"},
        annotations={"kueue.x-k8s.io/workload": "w"},
    )
    assert not owned_member(rider, obj("w", ["p0", "p1"]))


# ------------------------------------------------------------------ OwnerChains


def ref(kind: str, name: str, uid: str) -> dict[str, str]:
    return {"kind": kind, "name": name, "uid": uid}


def node(kind: str, name: str, uid: str, *owners: dict[str, str]) -> dict[str, Any]:
    return {
        "kind": kind,
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "ownerReferences": list(owners)},
    }


class FakeGets:
    """The objects an apiserver would answer GETs with, counting the reads."""

    def __init__(self, *objs: dict[str, Any], failing: frozenset[str] = frozenset()) -> None:
        self.objs = {(o["kind"], o["metadata"]["name"]): o for o in objs}
        self.reads: list[tuple[str, str]] = []
        self.failing = failing

    async def __call__(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        self.reads.append((kind, name))
        if name in self.failing:
            raise OSError("connection reset")
        return self.objs.get((kind, name))


def jobset_pod(name: str = "p") -> dict[str, Any]:
    return node("Pod", name, f"{name}-uid", ref("Job", "js-workers-0", "job-uid"))


def test_a_jobsets_pod_is_the_workloads_through_its_job() -> None:
    """pod → Job → JobSet: the Workload is owned by the JobSet, two levels up."""
    gets = FakeGets(node("Job", "js-workers-0", "job-uid", ref("JobSet", "js", "js-uid")))
    chains = OwnerChains(gets)
    workload = obj("w", ["js-uid"])
    pod = jobset_pod()
    assert not owned_member(pod, workload, chains.ancestor_uids(pod))  # nothing read yet
    asyncio.run(chains.resolve([pod]))
    assert owned_member(pod, workload, chains.ancestor_uids(pod))
    assert not owned_member(pod, obj("other", ["other-js"]), chains.ancestor_uids(pod))


def test_a_trainjobs_pod_three_levels_down_and_the_job_read_once() -> None:
    gets = FakeGets(
        node("Job", "js-workers-0", "job-uid", ref("JobSet", "tj", "js-uid")),
        node("JobSet", "tj", "js-uid", ref("TrainJob", "tj", "tj-uid")),
    )
    chains = OwnerChains(gets)
    pods = [jobset_pod("a"), jobset_pod("b")]
    asyncio.run(chains.resolve(pods))
    asyncio.run(chains.resolve(pods))  # cached: no more reads
    assert gets.reads == [("Job", "js-workers-0"), ("JobSet", "tj")]
    assert all(owned_member(p, obj("w", ["tj-uid"]), chains.ancestor_uids(p)) for p in pods)


def test_an_owner_of_an_unknown_kind_ends_the_chain_without_a_read() -> None:
    gets = FakeGets()
    chains = OwnerChains(gets)
    pod = node("Pod", "p", "p-uid", ref("Widget", "w", "widget-uid"))
    asyncio.run(chains.resolve([pod]))
    assert gets.reads == []
    assert chains.ancestor_uids(pod) == {"widget-uid"}


def test_an_owner_recreated_under_the_same_name_is_read_again() -> None:
    gets = FakeGets(node("Job", "js-workers-0", "old-uid", ref("JobSet", "js", "old-js")))
    chains = OwnerChains(gets)
    asyncio.run(chains.resolve([node("Pod", "p0", "p0", ref("Job", "js-workers-0", "old-uid"))]))
    gets.objs[("Job", "js-workers-0")] = node(
        "Job", "js-workers-0", "job-uid", ref("JobSet", "js", "js-uid")
    )
    pod = jobset_pod()
    asyncio.run(chains.resolve([pod]))
    assert "js-uid" in chains.ancestor_uids(pod) and "old-js" not in chains.ancestor_uids(pod)


def test_a_failed_read_leaves_the_owner_unknown_and_is_tried_again() -> None:
    gets = FakeGets(
        node("Job", "js-workers-0", "job-uid", ref("JobSet", "js", "js-uid")),
        failing=frozenset({"js-workers-0"}),
    )
    chains = OwnerChains(gets)
    pod = jobset_pod()
    asyncio.run(chains.resolve([pod]))
    assert "js-uid" not in chains.ancestor_uids(pod)  # not a member yet: it waits
    gets.failing = frozenset()
    asyncio.run(chains.resolve([pod]))
    assert "js-uid" in chains.ancestor_uids(pod)


def test_an_owner_cycle_stops_at_the_depth_limit() -> None:
    gets = FakeGets(
        node("Job", "a", "a-uid", ref("Job", "b", "b-uid")),
        node("Job", "b", "b-uid", ref("Job", "a", "a-uid")),
    )
    chains = OwnerChains(gets)
    pod = node("Pod", "p", "p-uid", ref("Job", "a", "a-uid"))
    asyncio.run(chains.resolve([pod]))
    assert chains.ancestor_uids(pod) == {"a-uid", "b-uid"}
    assert len(gets.reads) == 2


def test_a_pod_with_thousands_of_owner_references_costs_a_few_reads() -> None:
    """Every object is untrusted input: a tenant's pod listing 5,000 made-up owners is read
    up through its controller first and at most MAX_OWNERS_READ owners per object."""
    from nexus_admit.controller.pod_owners import MAX_OWNERS_READ

    gets = FakeGets(node("Job", "real", "real-uid", ref("JobSet", "js", "js-uid")))
    chains = OwnerChains(gets)
    refs = [ref("Job", f"fake-{i}", f"fake-{i}") for i in range(5000)]
    refs.append({**ref("Job", "real", "real-uid"), "controller": True})
    pod = {"metadata": {"name": "p", "uid": "p-uid", "ownerReferences": refs}}
    asyncio.run(chains.resolve([pod]))
    jobs = [r for r in gets.reads if r[0] == "Job"]
    assert len(jobs) == MAX_OWNERS_READ and ("Job", "real") in jobs
    assert gets.reads[MAX_OWNERS_READ:] == [("JobSet", "js")]  # the controller's owner
    assert owned_member(pod, obj("w", ["js-uid"]), chains.ancestor_uids(pod))
