"""The container image recipe (`Dockerfile`), checked without a container engine (the image
itself is built and run by e2e/tests/test_image.py): the recipe's shape, and what its last
stage does — the wheel installed into a clean virtual environment runs `nexus-admit run
--help` from `/` with the arguments the chart passes, without matplotlib (the optional
extra `report`, which the image leaves out).

The clean venv gets nexus-admit from the wheel only; its runtime dependencies come from the
development venv's site-packages through a .pth line (offline). The dev venv reaches its
editable nexus_admit only through its own .pth finder, which a .pth-listed directory does
not run, so the import must come from the wheel (asserted).
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.test_wheel import wheel  # noqa: F401  (the fixture: the wheel, built offline)

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
# --ignore-installed: without it pip "upgrades" the dev venv's own editable nexus-admit,
# i.e. uninstalls it from the environment it runs in, whatever --prefix says
PIP_INSTALL = (
    *(sys.executable, "-m", "pip", "install", "--ignore-installed"),
    *("--no-deps", "--no-index", "--quiet"),
)
CHART_ARGS = (
    "--webhook-cert=/etc/nexus-admit/webhook/tls.crt",
    "--webhook-key=/etc/nexus-admit/webhook/tls.key",
    "--health-port=8080",
)


def test_the_dockerfile_installs_only_the_wheel_and_runs_as_non_root() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, flags=re.M)
    assert len(stages) == 2, "a build stage and a runtime stage"
    runtime = text.split("\nFROM ")[-1]
    assert (
        'pip install --no-cache-dir --no-index --find-links /wheels "nexus-admit[controller]"'
        in (runtime)
    )
    assert "COPY" not in runtime, "the runtime stage gets wheels only (bind-mounted)"
    (user,) = re.findall(r"^USER\s+(\S+)", runtime, flags=re.M)
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric non-root user (runAsNonRoot can check it)"
    # kopf looks the user's name up at start (getpass.getuser()): the uid needs a passwd entry
    assert re.search(rf"^RUN echo \"[a-z-]+:x:{uid}:{uid}:.*>> /etc/passwd", runtime, flags=re.M)
    assert re.search(r'^ENTRYPOINT \["nexus-admit"\]', runtime, flags=re.M)


def test_the_wheel_declares_the_controller_dependencies(wheel: Path) -> None:  # noqa: F811
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [
            line for line in z.read(meta).decode().splitlines() if line.startswith("Requires-Dist:")
        ]
    for dep in ("kopf", "kubernetes", "prometheus-client"):
        assert any(dep in r and 'extra == "controller"' in r for r in requires), dep
    # cachetools: the offline tools' translation caches use it too (kube/versioned.py)
    for dep in ("ortools", "pydantic", "typer", "cachetools"):
        assert any(dep in r and "extra" not in r for r in requires), dep
    # the simulator's plots only: not in the image, which installs [controller]
    plots = [r for r in requires if "matplotlib" in r]
    assert plots and all('extra == "report"' in r for r in plots), plots


def test_nexus_admit_run_works_from_the_wheel_in_a_clean_venv(
    wheel: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    installed = subprocess.run(
        [*PIP_INSTALL, "--prefix", str(venv), str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    assert importlib.metadata.distribution("nexus-admit"), "the dev install is untouched"
    (site / "zz-runtime-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # the image has no matplotlib (the extra `report`); the dev site-packages has it, so it
    # is made unimportable here (.pth files run in name order: this one first)
    (site / "aa-no-matplotlib.pth").write_text("import sys; sys.modules['matplotlib'] = None\n")
    # the console script comes with the wheel; its shebang names the python pip ran under
    # (here the dev venv's), so it is run with the clean venv's python
    exe = venv / "bin" / "nexus-admit"
    assert exe.exists()

    where = subprocess.run(
        [py, "-c", "import nexus_admit; print(nexus_admit.__file__)"],
        capture_output=True,
        text=True,
        cwd="/",
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(site), f"nexus_admit imported from {where}"
    no_plots = subprocess.run(
        [py, "-c", "import matplotlib"], capture_output=True, text=True, cwd="/", check=False
    )
    assert no_plots.returncode != 0 and "ModuleNotFoundError" in no_plots.stderr

    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "COLUMNS": "200", "HOME": str(tmp_path)}
    helped = subprocess.run(
        [py, exe, "run", "--help"], capture_output=True, text=True, cwd="/", env=env, check=False
    )
    assert helped.returncode == 0, helped.stderr
    for flag in ("--webhook-cert", "--health-port", "--no-webhook", "--policy"):
        assert flag in helped.stdout

    # the chart's arguments reach the option checks of the installed copy (exit 2, the flag)
    refused = subprocess.run(
        [py, exe, "run", *CHART_ARGS],
        capture_output=True,
        text=True,
        cwd="/",
        env=env,
        check=False,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--webhook-cert /etc/nexus-admit/webhook/tls.crt: cannot read the file" in (
        refused.stderr
    )


@pytest.mark.parametrize("port", ["8080", "9443"])
def test_the_exposed_ports_are_the_chart_defaults(port: str) -> None:
    assert re.search(rf"^EXPOSE .*\b{port}\b", DOCKERFILE.read_text(), flags=re.M)
