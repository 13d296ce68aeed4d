"""The built wheel carries its data: installed outside the source tree, it loads the packaged
traces and runs `nexus-admit simulate` from `/` with no data directory to point at. Installed
without extras (`pip install nexus-admit`) into a venv of its own, `simulate` and `plan` run
with the core dependencies alone.

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
    # the real objects `nexus-admit bench --store-memory` copies
    "nexus_admit/data/live/objects.json",
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
    # nothing of the source tree or the test's venv on the path of what runs
    unset = ("NEXUS_ADMIT_DATA", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in unset}
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


# what the extras bring (controller, report): none may be needed by the offline commands
EXTRAS_ONLY = ("kopf", "kubernetes", "prometheus_client", "matplotlib")
SAMPLE_DUMP = ROOT / "config" / "samples" / "cluster-dump.yaml"
_OFFLINE = ("NewConnectionError", "Failed to establish a new connection", "name resolution")


@pytest.fixture(scope="module")
def bare_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv of its own (no system site-packages) with the wheel installed as a user would,
    without extras: its core dependencies come from the package index (or pip's cache)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    made = _run(sys.executable, "-m", "venv", venv)
    assert made.returncode == 0, made.stderr
    installed = _run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel)
    if installed.returncode != 0 and any(s in installed.stderr for s in _OFFLINE):
        pytest.skip(f"the package index is out of reach: {installed.stderr.strip()[-300:]}")
    assert installed.returncode == 0, installed.stderr
    return venv


def test_a_wheel_installed_without_extras_has_none_of_theirs(bare_venv: Path) -> None:
    probe = _run(
        bare_venv / "bin" / "python",
        "-I",
        "-c",
        "import importlib.util, sys; import nexus_admit; print(nexus_admit.__file__); "
        f"print([m for m in {EXTRAS_ONLY!r} if importlib.util.find_spec(m)])",
        cwd="/",
    )
    assert probe.returncode == 0, probe.stderr
    package, present = probe.stdout.splitlines()
    assert Path(package).is_relative_to(bare_venv)
    assert present == "[]"


def test_simulate_and_plan_run_without_extras_from_the_root_directory(bare_venv: Path) -> None:
    cli = bare_venv / "bin" / "nexus-admit"
    assert _run(cli, "simulate", "--help", cwd="/").returncode == 0
    simulated = _run(
        cli, "simulate", "--no-openb", "--replay-hosts", "16", "--replay-jobs", "20",
        "--replay-seeds", "1", "--replay-policies", "default,nexus", "--workers", "1", cwd="/",
    )
    assert simulated.returncode == 0, simulated.stderr
    assert "gang replay h16-j20, seed 1" in simulated.stdout
    planned = _run(cli, "plan", "-s", SAMPLE_DUMP, cwd="/")
    assert planned.returncode == 0, planned.stderr
    assert "team-llm/llm-pretrain: placed" in planned.stdout
