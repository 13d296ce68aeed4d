"""Watch gaps, seen as kopf's list rounds: the store is re-listed when a watch broke off.

Who calls it: `operator.py` installs the observer before kopf starts; `watches.resync_loop`
re-lists the kinds `ListRounds.take` names.

Why: kopf lists a kind once before it watches it, and again only when that watch could not
go on from where it was (a 410 Gone, a broken connection, an apiserver restart). Objects
deleted in such a gap never produce a DELETED event, and kopf's list brings only what is
left, so the store would keep them. A full re-list on a short period covered this, but at
5,000 nodes and 20,000 pods each one is about 15 s of the controller's CPU; a re-list of the
kind whose watch broke, when it broke, covers it at the cost of the gap.

kopf has no public hook for its list rounds: its watch stream calls
`kopf._cogs.clients.fetching.fetch_objs` through the module at each round, and this module
wraps that function (kopf is pinned below 2 in pyproject.toml; `tests/controller/
test_list_rounds.py` runs kopf's own watch stream through the wrapper). Where kopf no longer
has it, `observe` says so and the caller keeps the short re-list period.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from nexus_admit.controller.api import RESOURCES

__all__ = ["ListRounds", "forget", "observe"]

log = logging.getLogger("nexus_admit.list_rounds")

# (API group, plural) → the store's kind name
_KINDS = {(r.group, r.plural): kind for kind, r in RESOURCES.items()}

# who is told of each list round kopf starts: (API group, plural) → None
_listeners: list[Callable[[str, str], None]] = []


@dataclass(slots=True)
class ListRounds:
    """kopf's list rounds per kind: the first is its start; every later one ends a gap."""

    rounds: dict[str, int] = field(default_factory=dict)
    gaps: set[str] = field(default_factory=set)  # kinds to re-list, not yet taken
    on_gap: Callable[[str], None] | None = None  # told of each gap (metrics, a wake-up)

    def listed(self, group: str, plural: str) -> None:
        """kopf starts a list of `group`/`plural` (its watch stream's first, or a gap's)."""
        kind = _KINDS.get((group, plural))
        if kind is None:  # kopf's own kinds (peering, namespaces): not in the store
            return
        self.rounds[kind] = self.rounds.get(kind, 0) + 1
        if self.rounds[kind] > 1:
            log.info("kopf lists %s again (its watch broke off): the store re-lists it", kind)
            self.gaps.add(kind)
            if self.on_gap is not None:
                self.on_gap(kind)

    def take(self) -> set[str]:
        """The kinds whose watch broke off since the last take."""
        taken, self.gaps = self.gaps, set()
        return taken

    def give_back(self, kinds: set[str]) -> None:
        """Kinds taken whose re-list failed: taken again at the next try."""
        self.gaps |= kinds


def observe(listener: Callable[[str, str], None]) -> bool:
    """Tell `listener` (API group, plural) of every list kopf starts from now on in this
    process. False when kopf's list function is not where this expects it."""
    try:
        from kopf._cogs.clients import fetching
    except ImportError:
        return _unobservable("kopf._cogs.clients.fetching is gone")
    original = getattr(fetching, "fetch_objs", None)
    if original is None:
        return _unobservable("kopf's fetch_objs is gone")
    if not getattr(original, "_nexus_observed", False):
        async def fetch_objs(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            resource = kwargs.get("resource")
            group, plural = getattr(resource, "group", None), getattr(resource, "plural", None)
            if isinstance(group, str) and isinstance(plural, str):
                for tell in list(_listeners):
                    tell(group, plural)
            async for chunk in original(*args, **kwargs):
                yield chunk

        fetch_objs._nexus_observed = True  # type: ignore[attr-defined]
        setattr(fetching, "fetch_objs", fetch_objs)  # noqa: B010 (kopf's module, not ours)
    _listeners.append(listener)
    return True


def forget(listener: Callable[[str, str], None]) -> None:
    """Stop telling `listener` (a controller shut down in the same process: tests)."""
    if listener in _listeners:
        _listeners.remove(listener)


def _unobservable(why: str) -> bool:
    log.warning("kopf's list rounds cannot be observed (%s): watch gaps are found by the "
                "periodic re-list only", why)
    return False
