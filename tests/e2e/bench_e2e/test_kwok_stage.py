"""The load benchmark's KWOK stages: one pod IP, so a replayed play is not refused; node
status heartbeats rare, so they do not fall in one phase."""

from __future__ import annotations

import pytest
from plane.components import one_pod_ip, rare_node_status
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
