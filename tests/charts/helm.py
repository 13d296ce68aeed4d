"""The helm chart `charts/nexus-admit`, rendered with the helm binary the e2e build made.

Who uses it: `tests/charts/` (lint, render, schema) and `e2e/tests/test_chart.py` (the
same renders sent to the real apiserver). The helm binary is the one `e2e/build/build.sh`
builds and caches with the control plane (`bash e2e/build/build.sh` prints its directory at
once when cached).

`python -m tests.charts.helm` rewrites the PlacementConfig part of values.schema.json from
the pydantic model (the test `test_values_schema_placement_spec_is_current` checks it).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "nexus-admit"
SCHEMA = CHART / "values.schema.json"
# the renders are checked as for a 1.36 cluster, the first that serves the gate policy API
# (without --kube-version helm reports its client-go's, 1.37 for v3.22.0:
# test_chart_defaults.py)
KUBE_VERSION = "1.36.0"
# what a 1.36 cluster serves and helm's built-in capabilities lack (webhook.gateMode: auto)
POLICY_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


@functools.cache
def bin_dir() -> Path:
    override = os.environ.get("NEXUS_E2E_BIN")
    if override:
        return Path(override)
    out = subprocess.run(
        ["bash", str(ROOT / "e2e" / "build" / "build.sh")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "GOTOOLCHAIN": "local"},
    )
    return Path(out.stdout.strip().splitlines()[-1])


def helm(*args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [str(bin_dir() / "helm"), *args], capture_output=True, text=True, timeout=timeout
    )
    if check and r.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{r.stderr}")
    return r


def render(
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "nexus-admit",
    namespace: str = "nexus-system",
    tmp: Path | None = None,
    include_crds: bool = False,
    api_versions: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """`helm template` with `values` (a values file), as a list of objects. `api_versions`:
    what the cluster serves beyond helm's built-in set (`.Capabilities.APIVersions`)."""
    r = template(
        values,
        release=release,
        namespace=namespace,
        tmp=tmp,
        include_crds=include_crds,
        api_versions=api_versions,
    )
    if r.returncode != 0:
        raise AssertionError(f"helm template failed:\n{r.stderr}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def template(
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "nexus-admit",
    namespace: str = "nexus-system",
    tmp: Path | None = None,
    include_crds: bool = False,
    api_versions: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    args += ["--kube-version", KUBE_VERSION]
    for v in api_versions:
        args += ["--api-versions", v]
    if include_crds:
        args.append("--include-crds")
    if values:
        if tmp is None:
            raise ValueError("render with values needs a tmp directory for the values file")
        f = tmp / f"values-{abs(hash(json.dumps(values, sort_keys=True)))}.yaml"
        f.write_text(yaml.safe_dump(dict(values)))
        args += ["--values", str(f)]
    return helm(*args)


def by_kind(objects: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


# ---- the PlacementConfig part of values.schema.json, from the pydantic model ----------

_DROP = frozenset({"title", "default"})


def _inline(node: Any, defs: Mapping[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline(n, defs) for n in node]
    if not isinstance(node, Mapping):
        return node
    if "$ref" in node:
        target = defs[str(node["$ref"]).rsplit("/", 1)[-1]]
        return _inline({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$defs" or key in _DROP:
            continue
        if key == "properties":
            out[key] = {k: _inline(v, defs) for k, v in value.items()}
        else:
            out[key] = _inline(value, defs)
    return out


def placement_spec_schema() -> dict[str, Any]:
    """JSON schema of PlacementConfig.spec (camelCase, unknown keys refused), refs inlined."""
    from nexus_admit.model import PlacementConfig

    raw = PlacementConfig.model_json_schema(by_alias=True, mode="validation")
    spec: dict[str, Any] = _inline(raw, raw.get("$defs", {}))
    spec["description"] = (
        "The PlacementConfig spec (generated from nexus_admit.model.PlacementConfig by "
        "`python -m tests.charts.helm`; do not edit by hand)."
    )
    return spec


def main() -> int:
    schema = json.loads(SCHEMA.read_text())
    schema["properties"]["placementConfig"]["properties"]["spec"] = placement_spec_schema()
    SCHEMA.write_text(json.dumps(schema, indent=2) + "\n")
    print(f"wrote {SCHEMA.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
