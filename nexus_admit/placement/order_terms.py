"""The engine's own two objective terms, fragGradient and fillOrder (weights default 0; see
placement/fragmentation.py), in the model and as reported for realised slots.

The shared evaluation (objective.py) has no workload distribution or fill order, so the
engine keeps them here, with the state they need: the target workload, the node memo and
the fill rank of the last snapshot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import partial
from itertools import pairwise
from typing import cast

from ortools.sat.python import cp_model

from nexus_admit.model import GPU_WHOLE, Node, NumaPolicy, PodSet, Slot
from nexus_admit.placement.fragmentation import WorkloadDistribution, fill_rank, gradient_table
from nexus_admit.placement.memo import NodeMemo, pod_shape
from nexus_admit.placement.problem import Problem

__all__ = ["SCALE", "OrderTerms"]

SCALE = 1000  # every term is multiplied by this to make coefficients integers


class OrderTerms:
    def __init__(self, memo: NodeMemo, workload: WorkloadDistribution):
        self.memo = memo
        # target workload for the fragmentation-gradient term (weights.fragGradient)
        self.workload = workload
        self._rank: tuple[tuple[int, int], dict[str, float]] | None = None

    def frag_per_pod(self, problem: Problem, node: Node, pod_set: PodSet) -> float:
        """fragGradient per pod of `pod_set` on `node`, in GPUs: the fragmentation (FGD
        measure, `self.workload`) that as many of these pods as fit add, averaged per pod, so
        the term is linear in the pod count. Remembered per node state on a TrackedSnapshot
        (NodeMemo.derived): a gradient table per node and shape is most of a decision."""
        policy = problem.gang.numa_policy
        value = self.memo.derived(
            node, self._signature(pod_set, policy), partial(self._frag_of, node, pod_set, policy)
        )
        return cast(float, value[0])

    def _signature(self, pod_set: PodSet, policy: NumaPolicy) -> tuple[object, ...]:
        """What `_frag_per_pod` reads besides the node (`NodeMemo.derived`'s signature)."""
        return ("frag-per-pod", *pod_shape(pod_set), pod_set.count, policy, id(self.workload))

    def _frag_of(self, node: Node, pod_set: PodSet, policy: NumaPolicy) -> tuple[float]:
        return (self._frag_per_pod(node, pod_set, policy),)

    def _frag_per_pod(self, node: Node, pod_set: PodSet, policy: NumaPolicy) -> float:
        # one pod (openb's every decision) is costed as one whatever the node's room
        cap = 1 if pod_set.count == 1 else max(
            1, min(pod_set.count, self.memo.capacity(node, pod_set, policy)))
        table = gradient_table(
            node.gpu_free,
            node.free_cpu_milli,
            node.gpu_product,
            pod_set.cpu_milli,
            pod_set.gpus,
            pod_set.gpu_milli,
            cap,
            self.workload,
        )
        return table[-1] / max(len(table) - 1, 1) / GPU_WHOLE

    def one_pod_costs(self, problem: Problem, names: Sequence[str], pod_set: PodSet
                      ) -> list[int]:
        """What `model_terms` charges a gang of one pod of `pod_set` on each of `names`
        (its integer coefficients, SCALE per unit of objective)."""
        weights = problem.config.weights
        nodes = problem.snapshot.nodes
        grad, fill = weights.frag_gradient, weights.fill_order
        rank = self.fill_rank(problem) if fill and problem.gang.workload_type.packs else None
        policy = problem.gang.numa_policy
        signature = self._signature(pod_set, policy)
        derived = self.memo.derived
        out: list[int] = []
        for name in names:
            cost = 0
            if grad:
                node = nodes[name]
                value = derived(node, signature, partial(self._frag_of, node, pod_set, policy))
                cost += round(grad * cast(float, value[0]) * SCALE)
            if rank is not None:
                cost += round(fill * SCALE * rank.get(name, 1.0))
            out.append(cost)
        return out

    def fill_rank(self, problem: Problem) -> dict[str, float]:
        """fillOrder's rank of every node of the snapshot, cached while the snapshot object
        and its size stay the same."""
        nodes = problem.snapshot.nodes
        if self._rank is None or self._rank[0] != (id(nodes), len(nodes)):
            self._rank = (
                (id(nodes), len(nodes)),
                fill_rank(list(nodes.values()), problem.config.island_min_gpus),
            )
        return self._rank[1]

    def model_terms(
        self,
        problem: Problem,
        rep: str,
        entries: list[tuple[PodSet, cp_model.IntVar]],
        nodes_used: cp_model.IntVar,
        model: cp_model.CpModel,
        members: list[str],
    ) -> list[cp_model.LinearExprT]:
        """fragGradient: per GPU of fragmentation the pods add to the node; fillOrder: per
        node used, its rank in the snapshot's order, so successive packing gangs fill the
        same nodes. `values` reports the same two terms for the returned slots.

        A unit of several twins uses its first `nodes_used` members (realise.node_counts),
        each at its own rank. A one-pod gang uses at most one node, the first member, so its
        unit is charged that member's rank per node used, as before (the openb study's gangs
        are all one pod: their models are unchanged)."""
        weights = problem.config.weights
        out: list[cp_model.LinearExprT] = []
        if weights.frag_gradient:
            node = problem.node(rep)
            for pod_set, pods in entries:
                coef = round(
                    weights.frag_gradient * self.frag_per_pod(problem, node, pod_set) * SCALE
                )
                if coef:
                    out.append(coef * pods)
        if weights.fill_order and problem.gang.workload_type.packs:
            rank = self.fill_rank(problem)
            if len(members) > 1 and problem.gang.pod_count > 1:
                # found by the oracle property test: charging every twin the first one's
                # rank made the model's objective differ from the reported fillOrder
                first = [model.new_bool_var(f"uses[{rep},{i}]") for i in range(len(members))]
                model.add(sum(first) == nodes_used)
                for earlier, later in pairwise(first):
                    model.add(earlier >= later)
                for member, flag in zip(members, first, strict=True):
                    coef = round(weights.fill_order * SCALE * rank.get(member, 1.0))
                    if coef:
                        out.append(coef * flag)
                return out
            coef = round(weights.fill_order * SCALE * rank.get(rep, 1.0))
            if coef:
                out.append(coef * nodes_used)
        return out

    def values(self, problem: Problem, slots: Sequence[Slot]) -> dict[str, tuple[float, int]]:
        """The fragGradient and fillOrder terms of `slots` as the model counts them, with
        their weights (only the terms whose weight is on)."""
        weights = problem.config.weights
        out: dict[str, tuple[float, int]] = {}
        if weights.frag_gradient:
            pods: Counter[tuple[str, str]] = Counter((s.pod_set, s.node) for s in slots)
            value = sum(
                count * self.frag_per_pod(problem, problem.node(node), problem.pod_set(name))
                for (name, node), count in pods.items()
            )
            out["fragGradient"] = (round(value, 3), weights.frag_gradient)
        if weights.fill_order and problem.gang.workload_type.packs:
            rank = self.fill_rank(problem)
            value = sum(rank.get(n, 1.0) for n in {s.node for s in slots})
            out["fillOrder"] = (round(value, 3), weights.fill_order)
        return out
