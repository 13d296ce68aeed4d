"""`nexus-admit run` refuses options that cannot work, naming the flag to fix (exit 2),
before it touches any cluster. The running controller is tested on the real control plane
(e2e/tests/test_controller.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from nexus_admit.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param([], "--webhook-cert and --webhook-key", id="webhook-without-cert"),
        pytest.param(
            ["--kubeconfig", "/nonexistent"], "--kubeconfig /nonexistent", id="kubeconfig"
        ),
        pytest.param(["--no-webhook", "--health-port", "70000"], "--health-port 70000", id="port"),
        pytest.param(["--no-webhook", "--resync-seconds", "1"], "--resync-seconds", id="resync"),
        pytest.param(["--no-webhook", "--policy", "nope"], "--policy nope: unknown", id="policy"),
        pytest.param(
            ["--webhook-cert", "/nonexistent.crt", "--webhook-key", "/nonexistent.key"],
            "cannot read",
            id="unreadable-cert",
        ),
        pytest.param(
            ["--webhook-cert", "NOTPEM", "--webhook-key", "NOTPEM"],
            "are not a PEM certificate and its private key",
            id="cert-not-pem",
        ),
        pytest.param(
            ["--no-webhook", "--leader-elect"], "needs the Lease's namespace", id="lease-namespace"
        ),
        pytest.param(
            ["--no-webhook", "--leader-elect", "--lease-namespace", "x", "--lease-seconds", "5"],
            "a leader must stop acting before another replica may take its lease",
            id="lease-timing",
        ),
    ],
)
def test_bad_options_exit_2_with_the_flag(args: list[str], says: str, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    junk = tmp_path / "junk.pem"
    junk.write_text("not PEM\n")
    args = [str(junk) if a == "NOTPEM" else a for a in args]
    if "--kubeconfig" not in args:
        args = ["--kubeconfig", str(kubeconfig), *args]
    result = runner.invoke(app, ["run", *args])
    assert result.exit_code == 2, result.output
    assert says in result.output


def test_tick_seconds_out_of_range_exits_2_with_the_flag(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    args = ["run", "--kubeconfig", str(kubeconfig), "--no-webhook", "--tick-seconds", "0.01"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--tick-seconds 0.01: between 0.1 and 60" in result.output


def test_creates_in_flight_out_of_range_exits_2_with_the_flag(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    args = ["run", "--kubeconfig", str(kubeconfig), "--no-webhook", "--creates-in-flight", "0"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--creates-in-flight 0: between 1 and 64" in result.output


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--list-page-size", "-1", "--list-page-size -1: 0 (no pages) or more objects"),
        ("--list-page-timeout", "0", "--list-page-timeout 0.0: above 0"),
    ],
)
def test_list_pages_out_of_range_exit_2_with_the_flag(
    tmp_path: Path, flag: str, value: str, says: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    args = ["run", "--kubeconfig", str(kubeconfig), "--no-webhook", flag, value]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert says in result.output


def test_every_run_option_is_a_flag_with_the_options_default() -> None:
    """RunOptions holds the defaults; `run` exposes each field as a flag with that default
    (a field without a flag cannot be set where the controller is deployed)."""
    import dataclasses
    import inspect

    from nexus_admit.commands.run import run
    from nexus_admit.controller.options import RunOptions

    flags = {name: p.default for name, p in inspect.signature(run).parameters.items()}
    defaults = {f.name: f.default for f in dataclasses.fields(RunOptions)}
    assert flags == defaults
