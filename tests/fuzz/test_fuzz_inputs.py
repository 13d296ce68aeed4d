"""Fuzz: malformed Kubernetes objects (valid ones with fields replaced by junk, or removed)
through the translation (Nodes, pods, reservations, NodeResourceTopology, ResourceSlices,
Workloads, PlacementConfigs) and through the pod webhook. Every input is answered: a
result, or the project's own `TranslationError` naming the object and the field; the
webhook always answers, and a denial says why. Any other exception is a crash.

`NEXUS_FUZZ_EXAMPLES` sets the examples per test (default 300; `make fuzz` runs 10,000).
"""

from __future__ import annotations

import asyncio
import copy
import os
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_admit.controller.context import Context
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.webhook.review import decide, review_pod
from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster import build_snapshot
from nexus_admit.kube.errors import TranslationError
from nexus_admit.kube.kueue import KueueIndex
from nexus_admit.kube.translate import placement_config_from_object
from nexus_admit.kube.workload import workload_to_gang
from nexus_admit.model import PlacementConfig
from tests.controller.fake_api import FakeApi
from tests.kube.kube_factories import (
    cluster_queue,
    local_queue,
    node,
    nrt,
    pod,
    pod_set,
    reservation,
    workload,
)

EXAMPLES = int(os.environ.get("NEXUS_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NOW = datetime(2026, 11, 25, 10, 0, 0, tzinfo=UTC)
CONFIG = PlacementConfig()
KINDS = ("Node", "Pod", "ResourceReservation", "NodeResourceTopology", "ResourceSlice")

# values that look almost right are where parsers break
TRICKY = st.sampled_from(
    [
        "", "-1", "0", "1e400", "NaN", "inf", "1Gi", "-4Gi", "10000000000000000000000Ei",
        "1.5", "0.001m", "8", " 8", "Gi", "x", "\x00", "main/-1", "main/99999999999999999999",
        "2026-13-45T99:99:99Z", "nvidia.com/gpu", "a/b/c", "true",
    ]
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    TRICKY,
)
JUNK = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(max_size=6) | TRICKY, inner, max_size=3),
    ),
    max_leaves=8,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any], keep: tuple[str, ...] = ("kind",)) -> Any:
    """`base` with 1-3 of its fields (at any depth) replaced by junk or removed. The object
    itself stays a mapping: watches, lists and kopf only ever hand over mappings."""
    obj = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(obj) if p[0] not in keep]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = obj
        for step in path[:-1]:
            parent = parent[step]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(JUNK)
    return obj


def assert_names_object_and_field(e: TranslationError) -> None:
    assert e.obj_ref and e.obj_ref.split()[0][:1].isupper(), e  # "Kind ns/name"
    assert e.field, e
    assert str(e).startswith(e.obj_ref)


# ---------------------------------------------------------------- bases

NODE = node("n0", labels={"topology.kubernetes.io/zone": "z"})
POD = pod(
    "p",
    "n0",
    gpus=2,
    labels={L.LABEL_RESERVATION: "w-1"},
    annotations={L.ANN_SLOT: "main/0", L.ANN_NUMA_ZONE: "0"},
)
RR = reservation("w-1", "w", [{"index": 0, "node": "n0", "gpus": [0, 1], "numaZone": 0}])
NRT = nrt("n0", [("32", 4), ("32", 4)])
SLICE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "n0-gpu"},
    "spec": {
        "driver": "gpu.nvidia.com",
        "nodeName": "n0",
        "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1},
        "devices": [
            {
                "name": "gpu-0",
                "attributes": {
                    "type": {"string": "gpu"},
                    "index": {"int": 0},
                    "productName": {"string": "NVIDIA H200"},
                    "numaNode": {"int": 0},
                },
                "capacity": {"memory": {"value": "143771Mi"}},
            }
        ],
    },
}
WORKLOAD = workload(
    "w",
    [
        pod_set(
            count=2,
            gpus=4,
            annotations={
                L.ANN_GPU_MEMORY: "40Gi",
                L.ANN_NUMA_POLICY: "single-numa-node",
                L.ANN_REQUIRED_TOPOLOGY: "topology.kubernetes.io/zone",
            },
        )
    ],
)
KUEUE = KueueIndex.of(
    cluster_queues=[cluster_queue("cq", "gold")],
    local_queues=[local_queue("default", "q", "cq")],
)
PLACEMENT_CONFIG = {
    "apiVersion": f"{L.API_GROUP}/{L.API_VERSION}",
    "kind": "PlacementConfig",
    "metadata": {"name": "default"},
    "spec": {
        "topology": {"levels": ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]},
        "hardwareClasses": [{"name": "premium", "gpuProducts": ["NVIDIA-H100*"]}],
        "tiers": [{"name": "gold", "classCosts": {"premium": 0}}],
        "defaultTier": "gold",
        "reservationTTLSeconds": 600,
    },
}


# ---------------------------------------------------------------- translation


@FUZZ
@given(
    st.sampled_from(KINDS),
    st.data(),
)
def test_cluster_objects_translate_or_name_the_field(kind: str, data: st.DataObject) -> None:
    objs: dict[str, list[Any]] = {
        "Node": [NODE],
        "Pod": [POD],
        "ResourceReservation": [RR],
        "NodeResourceTopology": [NRT],
        "ResourceSlice": [SLICE],
    }
    base = objs[kind][0]
    objs[kind] = [data.draw(mutated(base), label=kind)]
    try:
        build_snapshot(
            objs["Node"],
            objs["Pod"],
            objs["ResourceReservation"],
            node_resource_topologies=objs["NodeResourceTopology"],
            resource_slices=objs["ResourceSlice"],
            now=NOW,
        )
    except TranslationError as e:
        assert_names_object_and_field(e)


@FUZZ
@given(mutated(WORKLOAD, keep=("kind", "apiVersion")))
def test_workloads_translate_or_name_the_field(wl: Any) -> None:
    try:
        workload_to_gang(wl, config=CONFIG, kueue=KUEUE, now=NOW)
    except TranslationError as e:
        assert_names_object_and_field(e)


@FUZZ
@given(mutated(PLACEMENT_CONFIG))
def test_placement_configs_translate_or_name_the_field(obj: Any) -> None:
    try:
        placement_config_from_object(obj)
    except TranslationError as e:
        assert e.obj_ref.startswith("PlacementConfig"), e
        assert e.field.startswith("spec"), e


# ---------------------------------------------------------------- webhook

WEBHOOK_POD = {
    "kind": "Pod",
    "metadata": {
        "name": "p",
        "namespace": "default",
        "labels": {L.LABEL_RESERVATION: "w-1"},
        # the Workload's own Job: the owner chain is the proof of membership
        "ownerReferences": [{"apiVersion": "x/v1", "kind": "Job", "name": "w", "uid": "u"}],
    },
    "spec": {"containers": [{"name": "c"}], "schedulingGates": [{"name": "other"}]},
}
WEBHOOK_RR = {
    **RR,
    "spec": {**RR["spec"], "workloadRef": {"name": "w", "namespace": "default", "uid": "uid-w"}},
}


@FUZZ
@given(
    mutated(WEBHOOK_POD),
    st.none() | mutated(WEBHOOK_RR),
    st.none() | mutated(WORKLOAD),
)
def test_webhook_decide_always_answers_and_says_why(pod_: Any, rr: Any, wl: Any) -> None:
    answer = decide(pod_, "default", rr, wl)
    if not answer.allowed:
        assert answer.message and "/" in answer.message


def _webhook_ctx() -> Context:
    api = FakeApi()
    ctx = Context(options=RunOptions(webhook=False), api=api, engine=None)  # type: ignore[arg-type]
    for obj in (
        WEBHOOK_RR,
        WORKLOAD,
        cluster_queue("cq", "gold"),
        local_queue("default", "q", "cq"),
    ):
        api.put(obj)
        ctx.store.upsert(str(obj["kind"]), obj)
    return ctx


@FUZZ
@given(mutated(WEBHOOK_POD))
def test_webhook_review_of_malformed_pods_always_answers(pod_: Any) -> None:
    answer = asyncio.run(review_pod(_webhook_ctx(), pod_, "default"))
    if not answer.allowed:
        assert answer.message


# ---------------------------------------------------------------- whole passes


def _a_pass_beside(objects: list[Any]) -> dict[str, Any]:
    """One controller pass over a store holding `objects` (fuzzed) beside a well-formed Node
    and a well-formed Workload waiting on our check; the Workload's check entry after it."""
    from nexus_admit.controller.loop.cycle import reconcile
    from nexus_admit.controller.store import WATCHED_KINDS
    from nexus_admit.placement.policies import make_policy
    from tests.kube.kube_factories import admission_check

    api = FakeApi()
    api.put(node("good"))
    api.put(cluster_queue("cq", "gold"))
    api.put(admission_check("nexus"))
    good = workload("good-w", [pod_set(count=1, gpus=8)])
    good["status"]["conditions"][0]["lastTransitionTime"] = "2026-11-25T10:00:00Z"
    api.put(good)
    for o in objects:
        if isinstance(o.get("metadata"), dict) and isinstance(o["metadata"].get("name"), str):
            api.put(o)
        else:  # no name: the store keys it anyway (a list or a watch hands such objects)
            api.objects[(str(o["kind"]), f"junk-{len(api.objects)}")] = o
    ctx = Context(options=RunOptions(webhook=False), api=api, engine=make_policy("nexus"))  # type: ignore[arg-type]
    for kind in WATCHED_KINDS:
        ctx.store.replace(kind, *api.list(kind))
    ctx.leadership.synced = True

    async def one_pass() -> None:
        await reconcile(ctx)
        await ctx.workers.background.drain()

    asyncio.run(one_pass())
    wl = api.get("Workload", "good-w", "default")
    assert wl is not None
    return next(c for c in wl["status"]["admissionChecks"] if c["name"] == "nexus")


@settings(FUZZ, max_examples=max(20, EXAMPLES // 3))
@given(
    st.lists(st.sampled_from(KINDS), min_size=1, max_size=3, unique=True),
    st.data(),
)
def test_a_pass_places_a_well_formed_workload_beside_fuzzed_objects(
    kinds: list[str], data: st.DataObject
) -> None:
    """Issue 28, item 1: the fuzz used to end at `TranslationError`, which is right for
    `plan` and was wrong for the controller, where it stopped every placement. A store
    holding malformed Nodes, pods, reservations, NRTs or ResourceSlices (on their own node
    n0) never stops a pass from placing a well-formed Workload on the good node."""
    bases = {"Node": NODE, "Pod": POD, "ResourceReservation": RR,
             "NodeResourceTopology": NRT, "ResourceSlice": SLICE}  # fmt: skip
    objects = [data.draw(mutated(bases[k]), label=k) for k in kinds]
    entry = _a_pass_beside(objects)
    assert entry["state"] == "Ready", entry
