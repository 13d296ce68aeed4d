"""Issue 28 on the real control plane: no tenant's object stops placement or ungating.

Each test is one attack from the issue, made with ordinary objects a tenant may create, and
checks that another gang beside it is still placed, ungated and Running, and that the odd
object's owner is told (an Event) where it looks. Checked against the cluster's own
objects, never the controller's view.
"""

from __future__ import annotations

import pytest
from e2e_util import wait_for
from test_controller import GATE, INDEX, SLOT, job, job_pods, running, wait_check

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]


def test_a_superscript_completion_index_stops_no_ungating(
    nexus_namespace, core_v1, batch_v1, custom_objects
):
    """Item 2. Before: a NonIndexed Job whose template annotates job-completion-index "²"
    made every ungating pass fail (`"²".isdigit()` and then `int("²")`), so a Gold Job
    beside it stayed gated. Now "²" is no rank: both Jobs are ungated and Running."""
    ns = nexus_namespace
    batch_v1.create_namespaced_job(
        ns,
        job("odd", "nexus-gold", pods=1, gpus=8, indexed=False, annotations={INDEX: "²"}),
    )
    # the odd Job's pod is gated first, so each ungating pass meets it before the gold one
    wait_check(custom_objects, ns, "odd", ("Ready",))
    batch_v1.create_namespaced_job(ns, job("gold", "nexus-gold", pods=1, gpus=8))
    wait_check(custom_objects, ns, "gold", ("Ready",))
    (gold,) = wait_for("gold Running", lambda: running(core_v1, ns, "gold", 1), timeout=120)
    assert gold.metadata.annotations[SLOT] == "main/0"
    (odd,) = wait_for("odd Running", lambda: running(core_v1, ns, "odd", 1), timeout=120)
    assert odd.metadata.annotations[INDEX] == "²"
    assert odd.metadata.annotations[SLOT] == "main/0"  # unranked: the first free slot
    for p in job_pods(core_v1, ns, "odd") + job_pods(core_v1, ns, "gold"):
        assert GATE not in [g.name for g in p.spec.scheduling_gates or []]
