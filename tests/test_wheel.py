"""The built wheel carries its data: installed outside the source tree, it loads the packaged
traces and runs `nexus-admit simulate` from `/` with no data directory to point at.

The wheel is built offline with the venv's setuptools (no build isolation) from a copy of
the sources, so stale `build/` output in the checkout cannot leak into it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGED = {
    "nexus_admit/data/README.md",
    "nexus_admit/data/lingjun/topo.csv.gz",
    "nexus_admit/data/openb/openb_node_list_gpu_node.csv.gz",
    "nexus_admit/data/openb/openb_pod_list_default.csv.gz",
    "nexus_admit/data/openb/openb_pod_list_multigpu50.csv.gz",
    "nexus_admit/data/openb/openb_pod_list_gpuspec33.csv.gz",
}

# Run inside the installed copy: where the package came from, the packaged row counts, then
# a tiny gang replay through the CLI entry point.
PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import nexus_admit
from nexus_admit.sim import openb, replay
from nexus_admit.sim.data import packaged_data
print(json.dumps({
    "package": nexus_admit.__file__,
    "data": str(packaged_data()),
    "nodes": len(openb.load_nodes()),
    "pods": {t: len(openb.load_pods(t)) for t in openb.TRACES},
    "hosts": len(replay.load_fabric()),
}))
from nexus_admit.cli import main
sys.argv = ["nexus-admit", "simulate", "--no-openb", "--replay-hosts", "16",
            "--replay-jobs", "20", "--replay-seeds", "1", "--replay-policies", "default",
            "--workers", "1"]
main()
"""


def _run(*args: str | Path, cwd: Path | str = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NEXUS_ADMIT_DATA"}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "nexus_admit",
        source / "nexus_admit",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    built = _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        source,
        "--no-deps",
        "--no-index",
        "--no-build-isolation",
        "--quiet",
        "-w",
        work / "dist",
    )
    assert built.returncode == 0, built.stderr
    (path,) = (work / "dist").glob("nexus_admit-*.whl")
    return path


def test_the_wheel_carries_the_data_and_its_notice(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert names >= PACKAGED
    assert not any(n.startswith(("tests/", "e2e/")) for n in names)


def test_the_installed_wheel_runs_on_its_packaged_data_from_the_root_directory(
    wheel: Path, tmp_path: Path
) -> None:
    target = tmp_path / "site"
    installed = _run(
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-index",
        "--quiet",
        "--target",
        target,
        wheel,
    )
    assert installed.returncode == 0, installed.stderr

    # -I: no PYTHONPATH, no user site, no script directory; cwd "/": no source tree nearby
    probe = _run(sys.executable, "-I", "-c", PROBE, target, cwd="/")
    assert probe.returncode == 0, probe.stderr
    facts = json.loads(probe.stdout.splitlines()[0])
    assert Path(facts["package"]).is_relative_to(target)
    assert Path(facts["data"]) == target / "nexus_admit" / "data"
    assert facts["nodes"] == 1213
    assert facts["pods"] == {"default": 8152, "multigpu50": 9061, "gpuspec33": 8152}
    assert facts["hosts"] == 847
    assert "gang replay h16-j20, seed 1" in probe.stdout
