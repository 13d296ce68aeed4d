"""The load benchmark's KWOK stages: one pod IP, so a replayed play is not refused; a play
on an old copy of a pod refused by the apiserver; node status heartbeats rare, so they do
not fall in one phase."""

from __future__ import annotations

import re

import pytest
import yaml
from plane.components import one_pod_ip, played_once, rare_node_status
from plane.processes import ClusterError

# the shape of KWOK v0.8.0's stage/pod/fast/pod-ready.yaml around its IPs
STAGE = """\
  next:
    statusTemplate: |
      {{ $hostIPs := NodeIPsWith .spec.nodeName }}
      {{ with $hostIPs }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ $podIPs := PodIPsWith .spec.nodeName }}
      {{ with $podIPs }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      phase: Running
"""


def test_the_pod_ip_list_goes_and_the_rest_stays() -> None:
    out = one_pod_ip(STAGE)
    assert "podIPs:" not in out
    assert "podIP: {{ index . 0 | Quote }}" in out
    assert "hostIPs:" in out and out.count("- ip: {{ . | Quote }}") == 1
    assert out.endswith("      phase: Running\n")


def test_a_stage_of_another_shape_is_refused_not_guessed() -> None:
    with pytest.raises(ClusterError, match="podIPs"):
        one_pod_ip(STAGE.replace("podIPs:", "podIps:"))


# KWOK v0.8.0's stage/pod/fast/pod-ready.yaml, shortened around what played_once moves
POD_READY = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Pending'
  next:
    statusTemplate: |
      {{ $now := Now }}

      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Ready
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
""" + STAGE.split("statusTemplate: |\n", 1)[1]


def _rendered(template: str) -> object:
    """The template as YAML once its actions are rendered by hand: a pod with one
    container, resourceVersion "42", every value "v", a list ranged over once."""
    out = []
    for line in template.splitlines():
        if re.fullmatch(r"\s*\{\{.*\}\}\s*", line):
            continue  # an action alone on its line renders to nothing here
        out.append(re.sub(r"\{\{ \.metadata\.resourceVersion \| Quote \}\}", '"42"',
                          re.sub(r"\{\{(?! \.metadata\.resourceVersion).*?\}\}", '"v"', line)))
    return yaml.safe_load("\n".join(out))


def test_the_pod_ready_play_carries_the_resource_version_it_was_played_on() -> None:
    out = yaml.safe_load(played_once(one_pod_ip(POD_READY)))
    assert out["spec"]["selector"] == yaml.safe_load(POD_READY)["spec"]["selector"]
    assert "statusTemplate" not in out["spec"]["next"]
    [patch] = out["spec"]["next"]["patches"]
    assert patch["subresource"] == "status"
    assert "root" not in patch  # the template names both metadata and status
    played = _rendered(patch["template"])
    assert played["metadata"] == {"resourceVersion": "42"}
    original = _rendered(yaml.safe_load(one_pod_ip(POD_READY))["spec"]["next"]["statusTemplate"])
    assert played["status"] == original
    assert played["status"]["phase"] == "Running" and played["status"]["podIP"] == "v"


def test_a_pod_ready_stage_without_a_status_template_is_refused_not_guessed() -> None:
    with pytest.raises(ClusterError, match="statusTemplate"):
        played_once(POD_READY.replace("statusTemplate:", "template:"))


# the shape of KWOK v0.8.0's stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
HEARTBEAT = """\
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
  delay:
    durationMilliseconds: 600000
    jitterDurationMilliseconds: 610000
  next:
"""


def test_a_node_status_heartbeat_once_per_four_grace_periods() -> None:
    out = rare_node_status(HEARTBEAT, 3600)
    # KWOK draws between the two; a jitter under the duration would replace it
    assert "    durationMilliseconds: 14400000\n    jitterDurationMilliseconds: 14410000\n" in out
    assert out.replace("14400000", "600000").replace("14410000", "610000") == HEARTBEAT


def test_a_heartbeat_stage_of_another_shape_is_refused_not_guessed() -> None:
    with pytest.raises(ClusterError, match="610-s delay"):
        rare_node_status(HEARTBEAT.replace("600000\n", "300000\n"), 3600)
