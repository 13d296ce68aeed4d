"""Problem preparation: eligibility memoised on the snapshot must not leak between configs."""

from __future__ import annotations

from nexus_admit.model import Gang, PodSet
from nexus_admit.placement.problem import prepare
from tests.factories import BLOCK, HOST, RACK, config, gpu_node, snapshot


def test_required_level_eligibility_is_keyed_by_the_label_not_its_position() -> None:
    """Under both configs the required level is the second level, but a different label:
    the node without a rack label is out for the first and in for the second."""
    zone = "example.com/zone"
    snap = snapshot(gpu_node("racked"), gpu_node("unracked"))
    del snap.nodes["unracked"].labels[RACK]
    for node in snap:
        node.labels[zone] = "z0"
    by_rack = prepare(snap, Gang("ns/a", (PodSet("w", 1, gpus=1),), required_level=RACK),
                      config((BLOCK, RACK, HOST)))
    assert by_rack.candidates["w"] == ["racked"]
    by_block = prepare(snap, Gang("ns/b", (PodSet("w", 1, gpus=1),), required_level=BLOCK),
                       config((zone, BLOCK, HOST)))
    assert by_block.candidates["w"] == ["racked", "unracked"]


def test_idle_room_counts_whole_gangs_per_domain_as_if_the_nodes_were_idle() -> None:
    snap = snapshot(gpu_node("a", used=range(8), rack="r0"), gpu_node("b", rack="r0"),
                    gpu_node("c", used=range(2), rack="r1"))
    problem = prepare(snap, Gang("ns/g", (PodSet("w", 2, gpus=4),)), config())
    rack = problem.level_index(RACK)
    assert problem.idle_room(rack) == {("b0", "r0"): 2, ("b0", "r1"): 1}
    # memoised per snapshot: a second problem reads the same answer
    assert prepare(snap, Gang("ns/h", (PodSet("w", 2, gpus=4),)), config()).idle_room(rack) == \
        {("b0", "r0"): 2, ("b0", "r1"): 1}
