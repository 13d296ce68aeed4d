"""`nexus-admit plan` end to end: text and JSON output, selection, sequencing, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from nexus_admit.cli import app

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "config" / "samples" / "cluster-dump.yaml"
runner = CliRunner()


def _items() -> list[dict[str, Any]]:
    return yaml.safe_load(SAMPLE.read_text())["items"]


def _write(tmp_path: Path, items: list[dict[str, Any]], *, multi: bool = False) -> Path:
    path = tmp_path / "dump.yaml"
    if multi:
        path.write_text(yaml.safe_dump_all(items))
    else:
        path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def _plan(*args: str) -> Any:
    return runner.invoke(app, ["plan", *args])


def _check_schema(doc: dict[str, Any]) -> None:
    assert set(doc) == {"placements"}
    for p in doc["placements"]:
        assert set(p) == {
            "workload",
            "feasible",
            "reason",
            "assignments",
            "terms",
            "solveSeconds",
            "explanation",
            "retryAfterSeconds",
        }
        assert isinstance(p["workload"], str) and "/" in p["workload"]
        assert isinstance(p["feasible"], bool)
        assert isinstance(p["reason"], str)
        assert isinstance(p["solveSeconds"], int | float) and p["solveSeconds"] >= 0
        assert all(isinstance(k, str) and isinstance(v, int | float) for k, v in p["terms"].items())
        assert all(isinstance(line, str) for line in p["explanation"])
        wait = p["retryAfterSeconds"]
        assert wait is None or (isinstance(wait, int | float) and wait >= 0 and not p["feasible"])
        for a in p["assignments"]:
            assert set(a) == {"podSet", "node", "pods", "gpus", "numaZones"}
            assert isinstance(a["podSet"], str) and isinstance(a["node"], str)
            assert isinstance(a["pods"], int) and a["pods"] >= 1
            assert isinstance(a["gpus"], int) and a["gpus"] >= 0
            assert all(isinstance(z, int) for z in a["numaZones"])
        if p["feasible"]:
            assert p["reason"] == "" and p["assignments"]
        else:
            assert p["reason"] and not p["assignments"]


def test_json_sample(tmp_path: Path) -> None:
    r = _plan("--snapshot", str(SAMPLE), "--output", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    _check_schema(doc)
    by = {p["workload"]: p for p in doc["placements"]}
    assert list(by) == [
        "team-llm/llm-pretrain",
        "team-vision/resnet-sweep",
        "team-infer/llama-405b-serve",
    ]
    pre = by["team-llm/llm-pretrain"]
    assert pre["feasible"]
    assert sum(a["pods"] for a in pre["assignments"]) == 2
    assert {a["node"] for a in pre["assignments"]} <= {"h100-a1", "h100-b1"}  # a2 is half used
    assert all(a["gpus"] == 8 for a in pre["assignments"])
    sweep = by["team-vision/resnet-sweep"]
    assert sweep["feasible"]
    assert {a["node"] for a in sweep["assignments"]} <= {"l40s-1", "l40s-2"}
    serve = by["team-infer/llama-405b-serve"]
    assert not serve["feasible"]
    assert "141 GiB" in serve["reason"]


def test_text_output() -> None:
    r = _plan("-s", str(SAMPLE))
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "team-llm/llm-pretrain: placed" in out
    assert "Pod set" in out and "NUMA zones" in out
    assert "team-infer/llama-405b-serve: not placed" in out
    assert "reason:" in out


def test_selected_workload_only() -> None:
    r = _plan("-s", str(SAMPLE), "-w", "team-vision/resnet-sweep", "-o", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [p["workload"] for p in doc["placements"]] == ["team-vision/resnet-sweep"]


def test_each_placement_takes_capacity_before_the_next(tmp_path: Path) -> None:
    items = _items()
    # a second 2x8 H100 gang created after llm-pretrain: only 12 H100 GPUs are left
    (pre,) = [
        o for o in items if o["kind"] == "Workload" and o["metadata"]["name"] == "llm-pretrain"
    ]
    twin = json.loads(json.dumps(pre))
    twin["metadata"]["name"] = "llm-pretrain-2"
    twin["metadata"]["creationTimestamp"] = "2025-05-01T10:01:00Z"
    items.append(twin)
    path = _write(tmp_path, items)
    r = _plan("-s", str(path), "-o", "json")
    assert r.exit_code == 0, r.output
    by = {p["workload"]: p for p in json.loads(r.stdout)["placements"]}
    assert by["team-llm/llm-pretrain"]["feasible"]
    assert not by["team-llm/llm-pretrain-2"]["feasible"]


@pytest.mark.parametrize("policy", ["binpack", "default", "random"])
def test_baseline_policies(policy: str) -> None:
    r = _plan("-s", str(SAMPLE), "-p", policy, "-o", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    _check_schema(doc)
    assert [p["feasible"] for p in doc["placements"]] == [True, True, False]


def test_multi_document_dump(tmp_path: Path) -> None:
    path = _write(tmp_path, _items(), multi=True)
    r = _plan("-s", str(path), "-o", "json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["placements"]) == 3


def test_config_file_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"topology": {"levels": ["topology.kubernetes.io/zone"]}, "defaultTier": "silver"}
        )
    )
    r = _plan("-s", str(SAMPLE), "-c", str(cfg), "-o", "json", "-w", "team-vision/resnet-sweep")
    assert r.exit_code == 0, r.output
    cfg.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "scheduling.kubenexus.io/v1alpha1",
                "kind": "PlacementConfig",
                "metadata": {"name": "x"},
                "spec": {"defaultTier": "nope"},
            }
        )
    )
    r = _plan("-s", str(SAMPLE), "-c", str(cfg))
    assert r.exit_code == 2
    assert "PlacementConfig x" in r.stderr and "nope" in r.stderr


def test_malformed_workload_reported_others_still_placed(tmp_path: Path) -> None:
    items = _items()
    for o in items:
        if o["kind"] == "Workload" and o["metadata"]["name"] == "resnet-sweep":
            o["spec"]["podSets"][0]["template"]["metadata"]["annotations"][
                "scheduling.kubenexus.io/gpu-memory"
            ] = "20GB"
    r = _plan("-s", str(_write(tmp_path, items)), "-o", "json")
    assert r.exit_code == 2
    assert "Workload team-vision/resnet-sweep" in r.stderr
    assert "scheduling.kubenexus.io/gpu-memory" in r.stderr
    assert "'20GB'" in r.stderr
    names = [p["workload"] for p in json.loads(r.stdout)["placements"]]
    assert names == ["team-llm/llm-pretrain", "team-infer/llama-405b-serve"]


def test_malformed_node_stops_the_plan(tmp_path: Path) -> None:
    items = _items()
    for o in items:
        if o["kind"] == "Node" and o["metadata"]["name"] == "l40s-2":
            o["metadata"]["labels"]["nvidia.com/gpu.memory"] = "46 GB"
    r = _plan("-s", str(_write(tmp_path, items)))
    assert r.exit_code == 2
    assert "Node l40s-2, field metadata.labels[nvidia.com/gpu.memory]" in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-w", "team-x/ghost"], "Workload team-x/ghost is not in the snapshot"),
        (["-p", "magic"], "unknown policy 'magic'"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], message: str) -> None:
    r = _plan("-s", str(SAMPLE), *args)
    assert r.exit_code == 2
    assert message in r.stderr


def test_unreadable_or_invalid_dump(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: List\nitems: [\n")
    r = _plan("-s", str(bad))
    assert r.exit_code == 2
    assert "not valid YAML" in r.stderr
    r = _plan("-s", str(tmp_path / "missing.yaml"))
    assert r.exit_code == 2


def test_no_admission_checks_in_dump_warns(tmp_path: Path) -> None:
    items = [o for o in _items() if o["kind"] != "AdmissionCheck"]
    r = _plan("-s", str(_write(tmp_path, items)), "-o", "json")
    assert r.exit_code == 0
    assert "no AdmissionCheck objects" in r.stderr
    assert len(json.loads(r.stdout)["placements"]) == 3


def test_nothing_pending(tmp_path: Path) -> None:
    items = [o for o in _items() if o["kind"] != "Workload"]
    path = _write(tmp_path, items)
    r = _plan("-s", str(path), "-o", "json")
    assert r.exit_code == 0
    assert json.loads(r.stdout) == {"placements": []}
    r = _plan("-s", str(path))
    assert "No workload to place" in r.stdout


def test_console_script_entry_point() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from nexus_admit.cli import main; main()",
            "plan",
            "-s",
            str(SAMPLE),
            "-o",
            "json",
            "-p",
            "binpack",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    _check_schema(json.loads(r.stdout))


def test_help_lists_plan() -> None:
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    assert "plan" in r.stdout
