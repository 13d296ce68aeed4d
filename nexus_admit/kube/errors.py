"""The one exception translation raises, and small helpers to read Kubernetes objects
(plain dicts as the API or YAML gives them) with errors that name the object and field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Obj",
    "Skipped",
    "TranslationError",
    "child",
    "mapping",
    "meta",
    "object_key",
    "object_ref",
    "sequence",
]

Obj = Mapping[str, Any]


class TranslationError(ValueError):
    """A Kubernetes object nexus-admit cannot use as it is.

    `obj_ref` names the object ("Workload team-a/llm", "Node gpu-1"), `field` the path inside
    it, and `message` says what is wrong and what to change. `str()` gives one line that can go
    straight into a Workload's admission check message.
    """

    def __init__(self, obj_ref: str, field: str, message: str) -> None:
        self.obj_ref = obj_ref
        self.field = field
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.obj_ref}, field {self.field}" if self.field else self.obj_ref
        return f"{where}: {self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (TranslationError, (self.obj_ref, self.field, self.message))


@dataclass(frozen=True, slots=True)
class Skipped:
    """One object a pass left out because a field of it could not be read, so that everyone
    else's work goes on. `reason` is a short fixed word (a metric label); `message` says
    what is wrong and what to change. `owner` is "Kind namespace/name" of the object whose
    owner should hear of it when that is not the object itself (a reservation's Workload)."""

    kind: str
    namespace: str
    name: str
    field: str
    reason: str
    message: str
    uid: str = ""
    resource_version: str = ""
    owner: str = ""

    @property
    def ref(self) -> str:
        return (
            f"{self.kind} {self.namespace}/{self.name}"
            if self.namespace
            else (f"{self.kind} {self.name}")
        )

    @staticmethod
    def of(obj: Obj, kind: str, field: str, reason: str, message: str, owner: str = "") -> Skipped:
        m = meta(obj)
        return Skipped(
            kind=str(obj.get("kind") or kind),
            namespace=str(m.get("namespace") or ""),
            name=str(m.get("name") or ""),
            field=field,
            reason=reason,
            message=message,
            uid=str(m.get("uid") or ""),
            resource_version=str(m.get("resourceVersion") or ""),
            owner=owner,
        )


# `type(x) is dict` / `is list` first: what JSON decodes to, and a plain type check costs a
# fraction of an ABC `isinstance`, which these hot readers (every pod, every pass) paid
# about a million times in a 5,000-node fleet's first snapshot


def meta(obj: Obj) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if type(m) is dict or isinstance(m, Mapping) else {}


def object_ref(obj: Obj) -> str:
    """'Kind namespace/name' (or 'Kind name' for cluster-scoped objects)."""
    kind = obj.get("kind") or "object"
    m = meta(obj)
    name = m.get("name") or "<unnamed>"
    ns = m.get("namespace")
    return f"{kind} {ns}/{name}" if ns else f"{kind} {name}"


def object_key(obj: Obj) -> str:
    """'namespace/name' (or 'name')."""
    m = meta(obj)
    name = str(m.get("name") or "")
    ns = m.get("namespace")
    return f"{ns}/{name}" if ns else name


def mapping(obj: Obj, value: Any, field: str) -> Mapping[str, Any]:
    """`value` as a mapping; None → {}; anything else is a TranslationError on `field`."""
    if type(value) is dict:
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TranslationError(
            object_ref(obj), field, f"expected an object, got {type(value).__name__} {value!r}"
        )
    return value


def sequence(obj: Obj, value: Any, field: str) -> Sequence[Any]:
    """`value` as a list; None → []; anything else is a TranslationError on `field`."""
    if type(value) is list:
        return value
    if value is None:
        return []
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TranslationError(
            object_ref(obj), field, f"expected a list, got {type(value).__name__} {value!r}"
        )
    return value


def child(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """`obj[key]` when it is a mapping, else {}: for lenient reads of status the controller
    only observes (a malformed value there is someone else's to report)."""
    value = obj.get(key)
    return value if type(value) is dict or isinstance(value, Mapping) else {}
