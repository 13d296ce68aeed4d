"""Kubernetes Events (events.k8s.io/v1) on the objects users look at: the Workload for every
decision, the pod when it is denied or pinned. `kubectl describe workload` shows them.

Who calls it: `workload_check.py` (on a real transition of the check only), `lifecycle.py`.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from nexus_admit.controller.api import KubeApi
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import meta

__all__ = ["NOTE_LIMIT_BYTES", "event_body", "fit_note", "post_event"]

log = logging.getLogger(__name__)
# the API's limit on an event's note, in bytes (Go's len of the UTF-8 string): a longer
# note makes the apiserver refuse the whole Event
NOTE_LIMIT_BYTES = 1024
_ELLIPSIS = "…"
_INSTANCE = socket.gethostname()[:128]


def fit_note(note: str) -> str:
    """`note`, cut to NOTE_LIMIT_BYTES of UTF-8 with "…" at the cut (never inside a
    character)."""
    data = note.encode()
    if len(data) <= NOTE_LIMIT_BYTES:
        return note
    room = NOTE_LIMIT_BYTES - len(_ELLIPSIS.encode())
    return data[:room].decode(errors="ignore") + _ELLIPSIS


def event_body(
    regarding: Mapping[str, Any],
    reason: str,
    note: str,
    event_type: str,
    now: datetime,
    action: str,
) -> dict[str, Any]:
    m = meta(regarding)
    name = str(m.get("name") or "object")
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        # client-go's naming: the object's name, a dot, a unique suffix
        "metadata": {
            "name": f"{name[:200]}.{uuid.uuid4().hex[:16]}",
            "namespace": m.get("namespace") or "default",
        },
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "reportingController": L.ADMISSION_CHECK_CONTROLLER,
        "reportingInstance": _INSTANCE,
        "action": action,
        "reason": reason,
        "type": event_type,
        "note": fit_note(note),
        "regarding": {
            "apiVersion": regarding.get("apiVersion"),
            "kind": regarding.get("kind"),
            "name": name,
            "namespace": m.get("namespace"),
            "uid": m.get("uid"),
            "resourceVersion": m.get("resourceVersion"),
        },
    }


def post_event(
    api: KubeApi,
    regarding: Mapping[str, Any],
    reason: str,
    note: str,
    *,
    event_type: str = "Normal",
    now: datetime,
    action: str = "Place",
) -> None:
    """Best effort: a lost Event must never fail the decision it describes."""
    try:
        api.create("Event", event_body(regarding, reason, note, event_type, now, action))
    except Exception as e:  # ApiException, OSError, urllib3's own errors in an outage
        log.warning("could not post event %s on %s: %s", reason, meta(regarding).get("name"), e)
