"""Process set-up of `nexus-admit run` that the e2e tests cannot see: the malloc arena cap
(the soak's RSS measures its effect, in `make bench-e2e`)."""

from __future__ import annotations

import platform

import pytest

from nexus_admit.controller.operator import cap_malloc_arenas


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_malloc_arenas_are_capped_on_glibc() -> None:
    assert cap_malloc_arenas() is True
