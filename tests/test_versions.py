"""One version: `nexus_admit.__version__`. The wheel's metadata (pyproject.toml reads it), the
chart's `version` and `appVersion`, the tag `make image` gives the image (the chart's
default image tag is its appVersion), the chart `make chart` packages, and `nexus-admit
--version` all say the same. A release bumps `__version__` and Chart.yaml together (this
test names whichever was forgotten) and adds its CHANGELOG.md entry."""

from __future__ import annotations

import re
import subprocess
import tarfile
import tomllib
from pathlib import Path

import yaml
from typer.testing import CliRunner

from nexus_admit import __version__
from nexus_admit.cli import app
from tests.charts.helm import CHART

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_is_a_release_number() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__), __version__


def test_pyproject_reads_the_package_version() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"], "written once, in nexus_admit/__init__.py"
    assert "version" in pyproject["project"]["dynamic"]
    dynamic = pyproject["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "nexus_admit.__version__"}


def test_the_chart_carries_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == __version__, "charts/nexus-admit/Chart.yaml version"
    assert chart["appVersion"] == __version__, "charts/nexus-admit/Chart.yaml appVersion"


def test_nexus_admit_version_prints_it() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"nexus-admit {__version__}\n"


def test_make_image_tags_the_image_with_it() -> None:
    tag = subprocess.run(
        ["bash", str(ROOT / "e2e" / "build" / "image.sh"), "--print-tag"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert tag == f"nexus-admit:{__version__}"


def test_make_chart_packages_the_chart_with_it(tmp_path: Path) -> None:
    """`helm package` through the Makefile (with the helm binary of the control plane build,
    cached: tests/charts uses the same)."""
    subprocess.run(
        ["make", "-s", "--no-print-directory", "chart", f"CHART_DIST={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    (package,) = tmp_path.glob("*.tgz")
    assert package.name == f"nexus-admit-{__version__}.tgz"
    with tarfile.open(package) as tar:
        member = tar.extractfile("nexus-admit/Chart.yaml")
        assert member is not None
        chart = yaml.safe_load(member.read())
    assert (chart["version"], chart["appVersion"]) == (__version__, __version__)


def test_the_chart_promises_the_oldest_kubernetes_the_tests_run_on() -> None:
    # make test's second plane runs KUBERNETES_OLDEST_VERSION: the chart refuses anything older
    pinned = dict(
        line.split("=", 1)
        for line in (ROOT / "e2e" / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    major, minor = pinned["KUBERNETES_OLDEST_VERSION"].removeprefix("v").split(".")[:2]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={major}.{minor}.0-0", "charts/nexus-admit/Chart.yaml"
