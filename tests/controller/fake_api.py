"""An in-memory stand-in for `controller/api.py`'s KubeApi, for unit tests of the loop's
logic (placing, lifecycle) without a cluster. It implements the same methods with the
same answers (create → False on AlreadyExists, delete → False when absent, get → None),
keeps a resourceVersion, and records every write so a test can count them. The e2e tests
run the same code against the real apiserver; this is not a substitute for them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from nexus_admit.controller.api import ApiException


def _key(kind: str, name: str, namespace: str | None) -> tuple[str, str]:
    return kind, f"{namespace}/{name}" if namespace else name


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str, str]] = []  # (verb, kind, key)
        self.rv = 100
        self.fail: dict[tuple[str, str], int] = {}  # (verb, kind) → failures left
        self.dry_run = False

    # ---- test helpers ----
    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        m = obj["metadata"]
        self.rv += 1
        stored = copy.deepcopy(dict(obj))
        stored["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[_key(obj["kind"], m["name"], m.get("namespace"))] = stored
        return copy.deepcopy(stored)

    def count(self, verb: str, kind: str) -> int:
        return sum(1 for v, k, _ in self.writes if v == verb and k == kind)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for (k, _), o in self.objects.items() if k == kind]

    def _maybe_fail(self, verb: str, kind: str) -> None:
        left = self.fail.get((verb, kind), 0)
        if left:
            self.fail[(verb, kind)] = left - 1
            raise ApiException(status=500, reason=f"injected {verb} {kind} failure")

    # ---- KubeApi ----
    def list(
        self, kind: str, keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    ) -> tuple[list[dict[str, Any]], int | None]:
        items = self.of_kind(kind)
        return ([keep(i) for i in items] if keep is not None else items), self.rv

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        obj = self.objects.get(_key(kind, name, namespace))
        return copy.deepcopy(obj) if obj is not None else None

    def create(self, kind: str, body: Mapping[str, Any]) -> bool:
        m = body["metadata"]
        self._maybe_fail("create", kind)
        key = _key(kind, m["name"], m.get("namespace"))
        self.writes.append(("create", kind, key[1]))
        if key in self.objects:
            return False
        self.put({"kind": kind, **body})
        return True

    def delete(self, kind: str, name: str, namespace: str | None = None) -> bool:
        self._maybe_fail("delete", kind)
        key = _key(kind, name, namespace)
        self.writes.append(("delete", kind, key[1]))
        return self.objects.pop(key, None) is not None

    def apply_status(
        self, kind: str, body: Mapping[str, Any], *, guarded: bool = True
    ) -> dict[str, Any]:
        m = body["metadata"]
        self._maybe_fail("apply", kind)
        key = _key(kind, m["name"], m.get("namespace"))
        self.writes.append(("apply", kind, key[1]))
        obj = self.objects.get(key)
        if obj is None:
            raise ApiException(status=404, reason="not found")
        status = obj.setdefault("status", {})
        for field, value in (body.get("status") or {}).items():
            if field in ("admissionChecks", "conditions"):  # list-map keyed by name / type
                by = "name" if field == "admissionChecks" else "type"
                rows = {r[by]: r for r in status.get(field) or []}
                rows.update({r[by]: r for r in value})
                status[field] = list(rows.values())
            else:
                status[field] = value
        return self.put(obj)

    def apply(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of a whole object we own (its data replaced)."""
        m = body["metadata"]
        self._maybe_fail("apply", kind)
        key = _key(kind, m["name"], m.get("namespace"))
        self.writes.append(("apply", kind, key[1]))
        return self.put({**(self.objects.get(key) or {}), **copy.deepcopy(dict(body))})

    def merge_status(
        self, kind: str, name: str, namespace: str | None, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        key = _key(kind, name, namespace)
        self.writes.append(("status", kind, key[1]))
        obj = self.objects.get(key)
        if obj is None:
            raise ApiException(status=404, reason="not found")
        obj.setdefault("status", {}).update(status)
        return self.put(obj)

    def merge_spec(
        self, kind: str, name: str, namespace: str | None, spec: Mapping[str, Any],
        resource_version: str,
    ) -> dict[str, Any]:
        key = _key(kind, name, namespace)
        self._maybe_fail("patch", kind)
        self.writes.append(("patch", kind, key[1]))
        obj = self.objects.get(key)
        if obj is None:
            raise ApiException(status=404, reason="not found")
        if obj["metadata"].get("resourceVersion") != resource_version:
            raise ApiException(status=409, reason="the object has been modified")
        obj.setdefault("spec", {}).update(copy.deepcopy(dict(spec)))
        return self.put(obj)

    def patch_pod(self, name: str, namespace: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        key = _key("Pod", name, namespace)
        self.writes.append(("patch", "Pod", key[1]))
        obj = self.objects.get(key)
        if obj is None:
            raise ApiException(status=404, reason="not found")
        spec = obj.setdefault("spec", {})
        for k, v in (patch.get("spec") or {}).items():
            if k == "schedulingGates":
                drop = {g["name"] for g in v if g.get("$patch") == "delete"}
                spec[k] = [g for g in spec.get(k) or [] if g["name"] not in drop]
            else:
                spec[k] = {**(spec.get(k) or {}), **v} if isinstance(v, dict) else v
        ann = (patch.get("metadata") or {}).get("annotations") or {}
        obj["metadata"].setdefault("annotations", {}).update(ann)
        return self.put(obj)

    # ---- the leader Lease (resourceVersion checked like the apiserver does) ----
    def get_lease(self, name: str, namespace: str) -> dict[str, Any] | None:
        self._maybe_fail("get", "Lease")
        return self.get("Lease", name, namespace)

    def write_lease(self, body: Mapping[str, Any], *, create: bool) -> dict[str, Any]:
        m = body["metadata"]
        self._maybe_fail("create" if create else "update", "Lease")
        key = _key("Lease", m["name"], m.get("namespace"))
        self.writes.append(("create" if create else "update", "Lease", key[1]))
        current = self.objects.get(key)
        if create and current is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        if not create:
            if current is None:
                raise ApiException(status=404, reason="not found")
            if str(m.get("resourceVersion")) != current["metadata"]["resourceVersion"]:
                raise ApiException(status=409, reason="Conflict: the object has been modified")
        return self.put({"kind": "Lease", **body})
