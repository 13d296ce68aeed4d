"""Events fit the apiserver's 1 KiB note limit, counted in UTF-8 bytes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from nexus_admit.controller.events import NOTE_LIMIT_BYTES, event_body, fit_note

WORKLOAD = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "Workload",
    "metadata": {"name": "w", "namespace": "ns", "uid": "u"},
}


@pytest.mark.parametrize(
    "note",
    [
        pytest.param("x" * 1024, id="1024-ascii-fits-as-is"),
        pytest.param("x" * 1025, id="one-byte-over"),
        # the old cut kept 1,023 characters and added "…" (3 bytes): 1,026 bytes, refused
        pytest.param("x" * 2000, id="long-ascii"),
        pytest.param("tier gold → premium; " * 80, id="arrows"),
        pytest.param("é" * 700, id="two-byte-characters"),
        pytest.param("名" * 400, id="three-byte-characters"),
        pytest.param("🚀" * 300, id="four-byte-characters"),
    ],
)
def test_every_note_fits_the_limit_in_bytes(note: str) -> None:
    body = event_body(WORKLOAD, "Placed", note, "Normal", datetime(2030, 1, 1, tzinfo=UTC), "Place")
    out = body["note"]
    assert len(out.encode()) <= NOTE_LIMIT_BYTES
    if len(note.encode()) <= NOTE_LIMIT_BYTES:
        assert out == note
    else:
        assert out.endswith("…")
        assert note.startswith(out[:-1]), "a prefix of the note, no character split"
        assert len(out.encode()) > NOTE_LIMIT_BYTES - 8, "cut no shorter than it must be"


def test_a_short_note_is_unchanged() -> None:
    assert fit_note("placed 2 pods") == "placed 2 pods"
