"""`make demo`'s samples (config/samples/demo/) through the running controller, so the demo
cannot rot: a gold Indexed Job of 4 x 8 GPUs, a silver plain-pod group of 3 x 2 GPUs and a
bronze Indexed Job of 4 x 1 GPU, each admitted with every pod Running on its reserved node.
The check is the demo's own (`e2e/demo.py`); the printed report is checked for what the
README shows from it."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import demo
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]


def test_the_demo_samples_are_placed_and_reported(e2e_cluster: Any, nexus_controller: Any) -> None:
    namespace = f"e2e-demo-{uuid.uuid4().hex[:5]}"
    t0 = time.monotonic()
    try:
        demo.submit(e2e_cluster, namespace)
        problems = demo.wait_placed(e2e_cluster, namespace, timeout=120)
        assert not problems, problems
        took = time.monotonic() - t0
        text = demo.report(e2e_cluster, namespace)
        # kubectl aligns each block by its longest key: count the words, not the spaces
        assert len(re.findall(r"^\s*State:\s+Ready$", text, re.M)) == 3, text
        assert text.count("Placed ") == 3, "one Placed Event per sample"
        for sample in ("llm-pretrain", "chat-serve", "embed-batch"):
            assert sample in text
        rr_table = text.split(f"$ kubectl get rr -n {namespace}\n", 1)[1].splitlines()
        assert rr_table[0].split() == ["NAME", "WORKLOAD", "PHASE", "NODES", "GPUS", "MODE", "AGE"]
        gpus = sorted(int(row.split()[4]) for row in rr_table[1:4])
        assert gpus == [4, 6, 32], rr_table
        print(f"\n[demo] samples placed and Running in {took:.1f}s")
    finally:
        demo.remove_namespace(e2e_cluster, namespace)
