"""The load benchmark's KWOK pod-ready stage: one pod IP, so a replayed play is not refused."""

from __future__ import annotations

import pytest
from plane.components import one_pod_ip
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
