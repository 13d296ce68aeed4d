"""`nexus-admit simulate` options: the replay's job mix and its per-seed and mean summaries."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nexus_admit.cli import app

runner = CliRunner()
SMALL = ["simulate", "--no-openb", "--replay-hosts", "16", "--replay-jobs", "30",
         "--replay-policies", "default,binpack,nexus", "--workers", "1"]


@pytest.mark.parametrize("mix", ["1,2", "a,b,c", "-1,1,1", "0,0,0"])
def test_a_malformed_mix_is_refused_with_the_expected_form(mix: str) -> None:
    result = runner.invoke(app, [*SMALL, "--replay-mix", mix])
    assert result.exit_code == 2
    assert "three shares" in result.output


def test_replay_mix_and_seed_means_reach_the_report(tmp_path: Path) -> None:
    result = runner.invoke(app, [*SMALL, "--replay-seeds", "3,4", "--replay-mix", "2,1,1",
                                 "--report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "mean over 2 seeds: nexus best on" in result.output
    assert "paired per seed, 95 % interval: nexus" in result.output
    assert "(seed 3), " in result.output  # the per-seed counts, on one line
    assert f"report written to {tmp_path.resolve()}: REPLAY.md, " in result.output
    data = json.loads((tmp_path / "replay.json").read_text())
    assert [s["mix"] for s in data["meta"]["scenarios"]] == [[0.5, 0.25, 0.25]] * 2
    assert {s["name"] for s in data["meta"]["scenarios"]} == {"h16-j30-mix0.5-0.25-0.25"}
    assert {row["seed"] for row in data["comparison"]} == {3, 4, -1}
    text = (tmp_path / "REPLAY.md").read_text()
    assert "mean over seeds (best in bold)" in text
    assert "seed-to-seed noise (2 seeds)" in text
    assert "gang replay h16-j30-mix0.5-0.25-0.25, mean over seeds 3, 4" in text
    means = [row for row in data["comparison"] if row["seed"] == -1]
    assert all(set(row["paired"]) == {"default", "binpack"} for row in means)


@pytest.mark.parametrize(("weights", "message"), [
    ("tierMismatch", "name=integer pairs"),
    ("tierMismatch=x", "name=integer pairs"),
    ("tierMismach=0", "tierMismach: unknown weight"),
    ("gangSplit=-5", "gangSplit: Input should be greater than or equal to 0"),
])
def test_malformed_replay_weights_are_refused_naming_the_problem(weights: str,
                                                                 message: str) -> None:
    result = runner.invoke(app, [*SMALL, "--replay-weights", weights])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split()).replace("│ ", "")


def test_replay_weights_reach_the_scenario_name_and_the_report(tmp_path: Path) -> None:
    result = runner.invoke(app, [*SMALL, "--replay-seeds", "3", "--replay-weights",
                                 "tierMismatch=0,gangSplit=800", "--report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "replay.json").read_text())
    (scenario,) = data["meta"]["scenarios"]
    assert scenario["name"] == "h16-j30-tierMismatch0-gangSplit800"
    assert scenario["weights"] == [["tierMismatch", 0], ["gangSplit", 800]]


def test_replay_locality_wait_and_load_reach_the_scenario(tmp_path: Path) -> None:
    result = runner.invoke(app, [*SMALL, "--replay-seeds", "3", "--replay-locality-wait", "0",
                                 "--replay-load", "2", "--report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (scenario,) = json.loads((tmp_path / "replay.json").read_text())["meta"]["scenarios"]
    assert scenario["name"] == "h16-j30-load2-wait0s"
    assert scenario["locality_wait_seconds"] == 0
    assert scenario["load"] == 2
    refused = runner.invoke(app, [*SMALL, "--replay-locality-wait", "-1"])
    assert refused.exit_code == 2


def compact(text: str) -> str:  # the error box wraps lines anywhere
    return re.sub(r"[\s│╭╮╰╯─]", "", text)


def test_missing_data_is_refused_with_where_to_point(tmp_path: Path) -> None:
    result = runner.invoke(app, [*SMALL, "--data", str(tmp_path)])
    assert result.exit_code == 2
    assert "lingjun/topo.csvnotfound" in compact(result.output)
    assert "NEXUS_ADMIT_DATA" in compact(result.output)
    openb_only = runner.invoke(app, ["simulate", "--no-replay", "--data", str(tmp_path)])
    assert openb_only.exit_code == 2
    assert "openbnotfound" in compact(openb_only.output)
    (tmp_path / "openb").mkdir()
    no_pods = runner.invoke(app, ["simulate", "--no-replay", "--data", str(tmp_path)])
    assert no_pods.exit_code == 2
    assert "openb/openb_node_list_gpu_node.csvnotfound" in compact(no_pods.output)


def test_a_data_directory_that_does_not_exist_is_refused_by_its_option(tmp_path: Path) -> None:
    for args, env in (([*SMALL, "--data", str(tmp_path / "nope")], {}),
                      (SMALL, {"NEXUS_ADMIT_DATA": str(tmp_path / "nope")})):
        result = runner.invoke(app, args, env=env)
        assert result.exit_code == 2
        assert "Invalidvaluefor--data" in compact(result.output)
        assert "nopeisnotadirectory" in compact(result.output)


NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\nn0,96000,393216,8,V100M32\nn1,64000,262144,2,T4\n"
PODS_CSV = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
            "a,4000,8192,1,500,\nb,8000,16384,2,1000,V100M32\n")
OWN = ["simulate", "--no-replay", "--policies", "paper-bestfit,fgd", "--workers", "1",
       "--nodes", "1"]


def test_own_pod_and_node_lists_run_through_the_openb_protocol(tmp_path: Path) -> None:
    pods, nodes = tmp_path / "mine.csv", tmp_path / "fleet.csv"
    pods.write_text(PODS_CSV)
    nodes.write_text(NODES_CSV)
    report = tmp_path / "report"
    result = runner.invoke(app, [*OWN, "--pods", str(pods), "--nodes-file", str(nodes),
                                 "--report", str(report)])
    assert result.exit_code == 0, result.output
    table = json.loads((report / "openb.json").read_text())["table"]
    assert {(row["trace"], row["policy"]) for row in table} == {
        ("mine", "paper-bestfit"), ("mine", "fgd")}
    # the paper's figures are for its own lists, not these
    assert all(row["published_100"] is None for row in table)


def test_a_malformed_row_in_an_own_list_exits_naming_file_line_and_column(
        tmp_path: Path) -> None:
    pods, nodes = tmp_path / "mine.csv", tmp_path / "fleet.csv"
    filler = "".join(f"f{i},1000,1024,0,0,\n" for i in range(96))
    pods.write_text(PODS_CSV + filler + "c,4000,8192,1,half,\n")  # line 100, not ":100:"
    nodes.write_text(NODES_CSV)
    result = runner.invoke(app, [*OWN, "--pods", str(pods), "--nodes-file", str(nodes)])
    assert result.exit_code == 2
    assert f"error: {pods}:100: column gpu_milli: 'half' is not a whole number" in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    pods.write_text(PODS_CSV)
    nodes.write_text("sn,cpu_milli,gpu,model\nn0,96000,8,V100M32\n")
    missing = runner.invoke(app, [*OWN, "--pods", str(pods), "--nodes-file", str(nodes)])
    assert missing.exit_code == 2
    assert f"error: {nodes}:1: missing column(s) memory_mib" in missing.output
    absent = runner.invoke(app, [*OWN, "--pods", str(tmp_path / "nope.csv")])
    assert absent.exit_code == 2
    assert "Invalidvaluefor'--pods'" in compact(absent.output)
