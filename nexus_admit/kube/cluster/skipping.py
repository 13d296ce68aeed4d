"""Listing a malformed object as skipped: what is wrong and what the pass did instead."""

from __future__ import annotations

from collections.abc import Iterable

from nexus_admit.kube.errors import Obj, Skipped, TranslationError, object_ref

__all__ = ["culprit", "skip"]


def skip(
    skipped: list[Skipped], obj: Obj, error: Exception, reason: str, outcome: str, owner: str = ""
) -> None:
    """List `obj` as skipped: what is wrong (the field when known) and what the pass did."""
    if isinstance(error, TranslationError):
        field, message = error.field, error.message
    else:  # a shape no parser expected: named by its type, never a crash of the pass
        field, message = "", f"cannot be read ({type(error).__name__}: {error})"[:300]
    kind = str(obj.get("kind") or "object")
    skipped.append(Skipped.of(obj, kind, field, reason, f"{message}; {outcome}", owner))


def culprit(error: Exception, candidates: Iterable[Obj | None]) -> Obj:
    """Which of a node's objects (Node, NRT, ResourceSlices) the error names; the Node when
    it names none of them."""
    objs = [o for o in candidates if o is not None]
    if isinstance(error, TranslationError):
        for o in objs:
            if object_ref(o) == error.obj_ref:
                return o
    return objs[0]
