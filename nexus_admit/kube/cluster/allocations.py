"""The GPU devices DRA ResourceClaims hold: `status.allocation.devices.results` name each
device by (driver, pool, device), which the node's ResourceSlices turn into the node's GPU
index (`nodes.dra_device_indices`). kube-scheduler's allocator writes them before it binds
the pod, so they are the truth about which devices a claim-using pod took."""

from __future__ import annotations

from collections.abc import Mapping

from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import Obj, mapping, sequence

__all__ = ["allocated_devices"]

DraDevice = tuple[str, str, str]


def allocated_devices(
    claim: Obj, known: Mapping[DraDevice, tuple[str, int]]
) -> list[tuple[str, int]]:
    """(node, GPU index) of every whole GPU the claim holds on a node of the snapshot
    (devices of other drivers, and MIG devices, which are not whole GPUs, are not counted).
    Raises TranslationError when the allocation cannot be read."""
    status = mapping(claim, claim.get("status"), "status")
    allocation = mapping(claim, status.get("allocation"), "status.allocation")
    devices = mapping(claim, allocation.get("devices"), "status.allocation.devices")
    held: list[tuple[str, int]] = []
    fld = "status.allocation.devices.results"
    for i, result in enumerate(sequence(claim, devices.get("results"), fld)):
        result = mapping(claim, result, f"{fld}[{i}]")
        if result.get("driver") != L.DRA_GPU_DRIVER:
            continue
        where = known.get(
            (L.DRA_GPU_DRIVER, str(result.get("pool") or ""), str(result.get("device") or ""))
        )
        if where is not None:
            held.append(where)
    return held
