"""A brute-force placement oracle written from the definitions, not from the engine.

It shares only the model types with nexus_admit (Node, PodSet, Gang, PlacementConfig and
its lookups of tier costs, hardware classes and VRAM thresholds). Feasibility and every
objective term are computed here from what ARCHITECTURE §1, `PlacementConfig`'s field
docs and the term list promise:

* capacity: a node's free CPU, memory and pod slots hold the pods put on it; a whole-GPU
  pod takes that many untouched GPUs, a shared pod a share of one GPU with that much free;
  static eligibility: the Kueue flavor's nodes (allowed nodes), GPU count, VRAM per GPU;
* NUMA: a pod is aligned when its GPUs hang off one zone that also has its CPU free (the
  zone's CPU is then taken); single-numa-node requires that on nodes with zones; a pod is
  counted unaligned only where one zone could ever hold its GPUs;
* levels: a required level keeps every pod bound to it inside one domain of it; domains
  are qualified by the levels above them. A pod set is bound to the level it or its podset
  group states (the first member stating one), else to the gang's level when it or its
  group has GPUs or the gang has none; a GPU-less pod set beside GPU pod sets and bound to
  nothing (a driver) is free, and uses only nodes without GPUs when those have room for all
  its pods; the pod sets bound to one level share one domain of it;
* the objective, in thousandths of a point (the engine's integer scale, so the comparison
  is exact): tier cost per GPU share; stranded VRAM per GPU below the tier's line;
  pristine islands (8-GPU nodes) and pristine NVLink cliques the gang starts but leaves
  part idle; extra domains per level (× level weight 1, 2, 4 … from the rack up) and
  levels split (× gang GPUs), for packing or preferred-level gangs; nodes used and GPU
  share left idle on touched GPU nodes (packing); GPUs left free in touched racks when a
  rack could hold the gang (packing or one-pod gangs); unaligned pods; the busiest node's
  pods and the pairs of the service's pods sharing a node or domain, siblings included,
  × PlacementConfig.spread's weight of that level (spreading types); fragGradient (FGD's
  measure, per pod the growth that as many pods of the set as fit cause, averaged) and
  fillOrder (per node used, its rank with non-islands first, packing only), each
  per-pod/per-node cost rounded to a thousandth.

The best value over every assignment of pods to nodes (and of GPUs and NUMA zones on each
node) is what the engine must reach.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

from nexus_admit.model import (
    ClusterSnapshot,
    Gang,
    Node,
    NumaPolicy,
    PlacementConfig,
    PodSet,
    Slot,
)

WHOLE = 1000
HOST = "kubernetes.io/hostname"


@dataclass(frozen=True)
class Shape:
    """A typical pod of the target workload (FGD): CPU, share per GPU, GPUs, popularity."""

    cpu: int
    share: int
    gpus: int
    popularity: float


# dyadic popularities, so the float arithmetic of the measure is exact
MIX = (
    Shape(0, WHOLE, 1, 0.25),
    Shape(0, 500, 1, 0.125),
    Shape(0, 250, 1, 0.125),
    Shape(0, WHOLE, 2, 0.125),
    Shape(0, WHOLE, 4, 0.125),
    Shape(0, WHOLE, 8, 0.25),
)


# ------------------------------------------------------------------ one node's pods
@dataclass(frozen=True)
class _State:
    cpu: int
    mem: int
    pods: int
    gpu: tuple[int, ...]
    zone_cpu: tuple[int, ...]


def _zones(node: Node) -> list[tuple[int, ...]]:
    return [z.gpu_indices for z in node.numa_zones]


def _alignable(node: Node, ps: PodSet) -> bool:
    whole = 0 if _fractional(ps) else ps.gpus
    return bool(node.numa_zones) and whole <= max(len(z) for z in _zones(node))


def _fractional(ps: PodSet) -> bool:
    return ps.gpus == 1 and ps.gpu_milli < WHOLE


def best_unaligned(node: Node, pods: Sequence[PodSet], policy: NumaPolicy) -> int | None:
    """The fewest unaligned pods over every way to fit `pods` on `node`; None if none fits."""
    zones = _zones(node)
    zone_of = {g: z for z, members in enumerate(zones) for g in members}
    strict = policy is NumaPolicy.SINGLE_NUMA_NODE and bool(zones)
    order = tuple(pods)

    def options(ps: PodSet, s: _State) -> Iterator[tuple[_State, bool]]:
        """(state after, aligned) for every distinct way to put one pod of `ps`."""
        cpu, mem, npods = s.cpu - ps.cpu_milli, s.mem - ps.memory_mib, s.pods - 1
        if min(cpu, mem, npods) < 0:
            return

        def take(gpus: Sequence[int], amount: int, zone: int | None) -> _State:
            gpu = list(s.gpu)
            for g in gpus:
                gpu[g] -= amount
            zc = list(s.zone_cpu)
            if zone is not None:
                zc[zone] -= ps.cpu_milli
            return _State(cpu, mem, npods, tuple(gpu), tuple(zc))

        if ps.gpus == 0:
            for z in range(len(zones)):
                if s.zone_cpu[z] >= ps.cpu_milli:
                    yield take((), 0, z), True
            if not strict:
                yield take((), 0, None), False
            return
        if _fractional(ps):
            seen = set()
            for g, free in enumerate(s.gpu):
                z = zone_of.get(g)
                if free < ps.gpu_milli or (z, free) in seen:
                    continue
                seen.add((z, free))
                if z is not None and s.zone_cpu[z] >= ps.cpu_milli:
                    yield take((g,), ps.gpu_milli, z), True
                if not strict:
                    yield take((g,), ps.gpu_milli, None), False
            return
        free = [g for g, f in enumerate(s.gpu) if f == WHOLE]
        for z, members in enumerate(zones):
            zfree = [g for g in members if s.gpu[g] == WHOLE]
            if len(zfree) >= ps.gpus and s.zone_cpu[z] >= ps.cpu_milli:
                yield take(zfree[: ps.gpus], WHOLE, z), True
        if strict or len(free) < ps.gpus:
            return
        if not zones:
            yield take(free[: ps.gpus], WHOLE, None), False
            return
        # unaligned: how many GPUs from each zone (which ones within a zone is immaterial)
        per_zone = [[g for g in members if s.gpu[g] == WHOLE] for members in zones]
        for split in itertools.product(*(range(len(p) + 1) for p in per_zone)):
            if sum(split) == ps.gpus:
                picked = [g for p, k in zip(per_zone, split, strict=True) for g in p[:k]]
                yield take(picked, WHOLE, None), False

    @cache
    def search(i: int, s: _State) -> int | None:
        if i == len(order):
            return 0
        ps = order[i]
        best: int | None = None
        for after, aligned in options(ps, s):
            rest = search(i + 1, after)
            if rest is None:
                continue
            value = rest + (0 if aligned or not _alignable(node, ps) else 1)
            if best is None or value < best:
                best = value
        return best

    start = _State(
        node.free_cpu_milli,
        node.free_memory_mib,
        node.free_pods,
        tuple(node.gpu_free),
        tuple(z.free_cpu_milli for z in node.numa_zones),
    )
    return search(0, start)


def eligible(node: Node, ps: PodSet) -> bool:
    if not node.schedulable:
        return False
    if ps.allowed_nodes is not None and node.name not in ps.allowed_nodes:
        return False
    if ps.gpus and (node.gpu_count < ps.gpus or node.gpu_memory_mib < ps.vram_mib):
        return False
    return True


def capacity(node: Node, ps: PodSet, policy: NumaPolicy) -> int:
    """How many pods of `ps` alone fit on `node` now."""
    k = 0
    while k < ps.count and best_unaligned(node, [ps] * (k + 1), policy) is not None:
        k += 1
    return k


# ------------------------------------------------------------------ fragmentation (FGD)
def fgd(gpu: Sequence[int], cpu: int, mix: Sequence[Shape] = MIX) -> float:
    """Node fragmentation in milli-GPUs: for each typical pod, the idle share it cannot use
    (all of it if it cannot run here, else the idle share of GPUs below its request)."""
    total = sum(gpu)
    out = 0.0
    for m in mix:
        runs = (
            m.gpus > 0
            and m.share > 0
            and sum(1 for f in gpu if f >= m.share) >= m.gpus
            and cpu >= m.cpu
        )
        frag = sum(f for f in gpu if f < m.share) if runs else total
        out += m.popularity * frag
    return out


def frag_growth_per_pod(node: Node, ps: PodSet, k: int) -> float:
    """F after `k` pods of `ps` put greedily (a share where F grows least, lowest GPU on
    ties; whole pods on the lowest free GPUs) minus F now, per pod placed."""
    gpu, cpu = list(node.gpu_free), node.free_cpu_milli
    before = fgd(gpu, cpu) if gpu else 0.0
    after, placed = before, 0
    for _ in range(k):
        cpu -= ps.cpu_milli
        if cpu < 0:
            break
        if ps.gpus == 0:
            after = fgd(gpu, cpu) if gpu else 0.0
        elif _fractional(ps):
            trials = []
            for g, free in enumerate(gpu):
                if free >= ps.gpu_milli:
                    trial = list(gpu)
                    trial[g] -= ps.gpu_milli
                    trials.append((fgd(trial, cpu), g))
            if not trials:
                break
            after, g = min(trials, key=lambda t: (t[0], t[1]))
            gpu[g] -= ps.gpu_milli
        else:
            free = [g for g, f in enumerate(gpu) if f == WHOLE][: ps.gpus]
            if len(free) < ps.gpus:
                break
            for g in free:
                gpu[g] = 0
            after = fgd(gpu, cpu)
        placed += 1
    return (after - before) / max(placed, 1)


# ------------------------------------------------------------------ the objective
def paths(node: Node, levels: Sequence[str]) -> tuple[tuple[str, ...] | None, ...]:
    out: list[tuple[str, ...] | None] = []
    prefix: list[str] = []
    for level in levels:
        value = node.name if level == HOST else node.labels.get(level)
        if value is None or (out and out[-1] is None):
            out.append(None)
            continue
        prefix.append(value)
        out.append(tuple(prefix))
    return tuple(out)


class Oracle:
    def __init__(self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig):
        self.snap, self.gang, self.config = snapshot, gang, config
        self.levels = config.resolve_levels(snapshot.kueue_topologies)
        self.path = {n.name: paths(n, self.levels) for n in snapshot}
        self.sets = {ps.name: ps for ps in gang.pod_sets}
        # level index -> the pod sets that must share one domain of it
        self.bound: dict[int, set[str]] = defaultdict(set)
        for ps in gang.pod_sets:
            level = self._level_of(ps)
            if level is not None:
                self.bound[self.levels.index(level)].add(ps.name)

    def _level_of(self, ps: PodSet) -> str | None:
        group = [p for p in self.gang.pod_sets if ps.group is not None and p.group == ps.group]
        group = group or [ps]
        stated = [p.required_level for p in group if p.required_level is not None]
        if stated:
            return stated[0]
        gang_has_gpus = any(p.gpus for p in self.gang.pod_sets)
        if any(p.gpus for p in group) or not gang_has_gpus:
            return self.gang.required_level
        return None

    def _eligible_nodes(self, ps: PodSet) -> list[str]:
        names = [n.name for n in self.snap if eligible(n, ps)]
        if ps.gpus or self._level_of(ps) is not None or not any(
            p.gpus for p in self.gang.pod_sets
        ):
            return names
        cpu_nodes = [n for n in names if not self.snap.nodes[n].gpu_count]
        room = sum(capacity(self.snap.nodes[n], ps, self.gang.numa_policy) for n in cpu_nodes)
        return cpu_nodes if room >= ps.count else names

    def _one_domain_each(self, counts: Mapping[tuple[str, str], int]) -> list[str]:
        """The required levels whose bound pods span several domains (or none)."""
        out = []
        for li, names in self.bound.items():
            domains = {self.path[n][li] for (p, n), c in counts.items() if p in names and c}
            if len(domains) > 1 or None in domains:
                out.append(self.levels[li])
        return out

    # -- the written definition of each term, in thousandths of a point
    def value(self, counts: Mapping[tuple[str, str], int], unaligned: int) -> int:
        """The objective of pods per (pod set, node) with `unaligned` pods off their zone."""
        gang, cfg, w = self.gang, self.config, self.config.weights
        nodes = self.snap.nodes
        packs = gang.workload_type.packs
        per_node: dict[str, int] = defaultdict(int)
        share_on: dict[str, int] = defaultdict(int)
        total = 0
        for (p, n), c in counts.items():
            ps, node = self.sets[p], nodes[n]
            per_node[n] += c
            if not ps.gpus:
                continue
            share_on[n] += c * ps.gpus * ps.gpu_milli
            cost = cfg.class_cost(gang.tier, cfg.hardware_class(node.gpu_product))
            total += w.tier_mismatch * cost * c * ps.gpus * ps.gpu_milli
            if ps.vram_mib and not _fractional(ps):
                line = Fraction(str(cfg.min_vram_utilization(gang.tier))) * node.gpu_memory_mib
                stranded = max(Fraction(0), line - ps.vram_mib) / 1024
                total += c * round(w.vram_stranded * ps.gpus * stranded * 1000)
        # islands: a pristine 8-GPU node or NVLink clique started but left part idle
        def filled(n: str) -> bool:
            return share_on.get(n, 0) >= sum(nodes[n].gpu_free)

        def pristine(node: Node) -> bool:
            return node.gpu_count > 0 and all(f == WHOLE for f in node.gpu_free)

        broken = sum(
            1 for n in share_on
            if nodes[n].gpu_count >= cfg.island_min_gpus and pristine(nodes[n]) and not filled(n)
        )
        cliques: dict[str, list[Node]] = defaultdict(list)
        for node in self.snap:
            if node.clique is not None:
                cliques[node.clique].append(node)
        for members in cliques.values():
            if all(pristine(m) for m in members):
                names = [m.name for m in members]
                if any(m in share_on for m in names) and not all(filled(m) for m in names):
                    broken += 1
        total += w.island_broken * 1000 * broken
        # topology: extra domains and split levels (weights 1, 2, 4 … from the rack up)
        above = len(self.levels) - 1
        spread = split = 0
        for li in range(above):
            weight = 2 ** (above - 1 - li)
            used = {self.path[n][li] for n in per_node}
            spread += (len(used) - 1) * weight
            split += weight if len(used) > 1 else 0
        if packs or gang.preferred_level:
            gpus = max(1, -(-gang.gpu_milli // WHOLE))
            total += 1000 * (w.domain_spread * spread + w.gang_split * gpus * split)
        if packs:
            total += w.node_count * 1000 * len(per_node)
            total += w.fragmentation * sum(sum(nodes[n].gpu_free) - s for n, s in share_on.items())
        # BestFit among racks, for gangs one rack could hold
        rack = len(self.levels) - 2
        if rack >= 0 and (packs or gang.pod_count == 1):
            free: dict[tuple[str, ...], int] = defaultdict(int)
            for node in self.snap:
                d = self.path[node.name][rack]
                if node.gpu_count and d is not None:
                    free[d] += sum(node.gpu_free)
            if max(free.values(), default=0) >= gang.gpu_milli:
                touched = {d for n in per_node if (d := self.path[n][rack]) is not None}
                taken = sum(s for n, s in share_on.items() if self.path[n][rack] is not None)
                total += w.domain_fragmentation * (sum(free[d] for d in touched) - taken)
        total += w.numa_unaligned * 1000 * unaligned
        if not packs:
            total += w.spread * 1000 * max(per_node.values(), default=0)
            total += 1000 * self._pairs(per_node)
        if w.frag_gradient:
            for (p, n), c in counts.items():
                ps, node = self.sets[p], nodes[n]
                k = max(1, min(ps.count, capacity(node, ps, gang.numa_policy)))
                per_pod = frag_growth_per_pod(node, ps, k)  # milli-GPUs per pod
                total += c * round(w.frag_gradient * (per_pod / 1000) * 1000)
        if w.fill_order and packs:
            listed = list(self.snap)
            order = sorted(range(len(listed)),
                           key=lambda i: (listed[i].gpu_count >= cfg.island_min_gpus, i))
            rank = {listed[i].name: pos / max(len(listed), 1) for pos, i in enumerate(order)}
            total += sum(round(w.fill_order * 1000 * rank[n]) for n in per_node)
        return total

    def _pairs(self, per_node: Mapping[str, int]) -> int:
        """Spread: per level, each pair of the service's pods (the gang's and the siblings
        already placed) that this placement puts into one domain, × that level's weight."""
        spread, total = self.config.spread, 0
        for li, level in enumerate(self.levels):
            weight = spread.node if level == HOST else spread.levels.get(level, spread.domain)
            placed: dict[tuple[str, ...], int] = defaultdict(int)
            siblings: dict[tuple[str, ...], int] = defaultdict(int)
            def domain(n: str, li: int = li, level: str = level) -> tuple[str, ...] | None:
                return (n,) if level == HOST else self.path[n][li]  # a node is always one

            for n, c in per_node.items():
                if (d := domain(n)) is not None:
                    placed[d] += c
            for n, c in self.gang.siblings.items():
                if n in self.path and (d := domain(n)) is not None:
                    siblings[d] += c
            total += weight * sum(siblings[d] * x + x * (x - 1) // 2 for d, x in placed.items())
        return total

    # -- brute force
    def best(self) -> int | None:
        """The lowest objective over every feasible placement, None if there is none."""
        gang = self.gang
        eligible_nodes = {ps.name: self._eligible_nodes(ps) for ps in gang.pod_sets}
        per_set = [
            list(_distributions(ps.count, eligible_nodes[ps.name])) for ps in gang.pod_sets
        ]
        best: int | None = None
        for combo in itertools.product(*per_set):
            counts = {
                (ps.name, n): c
                for ps, dist in zip(gang.pod_sets, combo, strict=True)
                for n, c in dist.items()
            }
            used = {n for _, n in counts}
            if self._one_domain_each(counts):
                continue
            unaligned = 0
            for n in used:
                pods = [self.sets[p] for (p, m), c in counts.items() if m == n for _ in range(c)]
                found = best_unaligned(self.snap.nodes[n], pods, gang.numa_policy)
                if found is None:
                    break
                unaligned += found
            else:
                value = self.value(counts, unaligned)
                best = value if best is None else min(best, value)
        return best

    # -- someone else's answer, checked and costed by the same definitions
    def check(self, slots: Sequence[Slot]) -> tuple[list[str], int]:
        """(what breaks a hard constraint, the objective of `slots`)."""
        gang, problems = self.gang, []
        state = {n.name: n.copy() for n in self.snap}
        counts: dict[tuple[str, str], int] = defaultdict(int)
        unaligned = 0
        for slot in slots:
            ps, node = self.sets[slot.pod_set], state[slot.node]
            counts[(ps.name, node.name)] += 1
            if node.name not in self._eligible_nodes(ps):
                problems.append(f"{slot} on an ineligible node")
            node.free_cpu_milli -= ps.cpu_milli
            node.free_memory_mib -= ps.memory_mib
            node.free_pods -= 1
            if len(set(slot.gpu_indices)) != ps.gpus:
                problems.append(f"{slot} has {len(slot.gpu_indices)} GPUs, wants {ps.gpus}")
            for g in slot.gpu_indices:
                need = ps.gpu_milli if _fractional(ps) else WHOLE
                if node.gpu_free[g] < need:
                    problems.append(f"{slot}: GPU {g} has {node.gpu_free[g]} free")
                node.gpu_free[g] -= need
            zone = next((z for z in node.numa_zones if z.id == slot.numa_zone), None)
            if slot.numa_zone is not None:
                if zone is None or not set(slot.gpu_indices) <= set(zone.gpu_indices):
                    problems.append(f"{slot}: GPUs not in zone {slot.numa_zone}")
                else:
                    zone.free_cpu_milli -= ps.cpu_milli
                    if zone.free_cpu_milli < 0:
                        problems.append(f"{slot}: zone {slot.numa_zone} out of CPU")
            elif node.numa_zones and gang.numa_policy is NumaPolicy.SINGLE_NUMA_NODE:
                problems.append(f"{slot}: no NUMA zone under single-numa-node")
            if slot.numa_zone is None and _alignable(node, ps):
                unaligned += 1
            if min(node.free_cpu_milli, node.free_memory_mib, node.free_pods) < 0:
                problems.append(f"{slot}: node {node.name} over capacity")
        for level in self._one_domain_each(counts):
            problems.append(f"slots span several {level} domains")
        for ps in gang.pod_sets:
            if sum(1 for s in slots if s.pod_set == ps.name) != ps.count:
                problems.append(f"pod set {ps.name}: wrong number of slots")
        return problems, self.value(counts, unaligned)


def _distributions(count: int, names: Sequence[str]) -> Iterator[dict[str, int]]:
    """Every way to put `count` identical pods on `names`."""
    if not names:
        return
    for cuts in itertools.combinations_with_replacement(range(len(names)), count):
        out: dict[str, int] = defaultdict(int)
        for i in cuts:
            out[names[i]] += 1
        yield dict(out)
