"""What the plane is asked for through the environment (e2e/cluster.py's docstring lists
the variables) and where its binaries come from."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import fleet as fleet_mod
from plane.processes import ClusterError

E2E_DIR = Path(__file__).resolve().parent.parent
REPO = E2E_DIR.parent


def kubernetes_line() -> str:
    """Which Kubernetes the plane runs: "newest" (KUBERNETES_VERSION, the whole suite) or
    "oldest" (KUBERNETES_OLDEST_VERSION, the tests that depend on who gates pods)."""
    line = os.environ.get("NEXUS_E2E_KUBERNETES") or "newest"
    if line not in ("newest", "oldest"):
        raise ClusterError(f"NEXUS_E2E_KUBERNETES must be newest or oldest, not {line!r}")
    return line


def default_state_dir() -> Path:
    # the two planes keep apart, so one never reuses the other's running processes
    default = ".e2e-state" if kubernetes_line() == "newest" else ".e2e-state-oldest"
    return Path(os.environ.get("NEXUS_E2E_STATE") or REPO / default).resolve()


def fleet_spec() -> dict[str, Any]:
    """fleet.yaml, scaled when NEXUS_E2E_FLEET_NODES asks for a larger fleet (bench-e2e)."""
    spec = fleet_mod.load()
    nodes = os.environ.get("NEXUS_E2E_FLEET_NODES")
    return fleet_mod.scaled(spec, int(nodes)) if nodes else spec


def node_grace_seconds() -> int | None:
    """Longer node heartbeats for large fleets on a busy machine (bench-e2e): KWOK renews
    1,000 leases less often and the node lifecycle controller waits as long before it
    marks a late node NotReady and taints it."""
    value = os.environ.get("NEXUS_E2E_NODE_GRACE_SECONDS")
    return int(value) if value else None


def build_binaries() -> Path:
    """Run build.sh (returns at once when cached) and return the binary directory."""
    override = os.environ.get("NEXUS_E2E_BIN")
    if override:
        return Path(override).resolve()
    out = subprocess.run(
        ["bash", str(E2E_DIR / "build" / "build.sh")],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )  # stderr (progress) goes straight to ours
    if out.returncode != 0:
        raise ClusterError(f"e2e/build/build.sh failed with exit code {out.returncode}")
    return Path(out.stdout.strip().splitlines()[-1])
