"""What Kueue leaves out of a Workload, read the way kube-scheduler sees the pods: the
`job-name` / `controller-uid` labels the Job controller puts on a Job's pods are not in
Kueue's pod template, yet a spread over them is the gang's own spread."""

from __future__ import annotations

import pytest
from builders import CHECK, job
from e2e_util import all_running, pods_with_labels, wait_for, workload_owned_by
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

HOSTNAME = "kubernetes.io/hostname"


@pytest.mark.parametrize("key", ["job-name", "batch.kubernetes.io/job-name"])
def test_a_spread_over_the_jobs_own_pods_by_job_name_is_honoured(
    key, nexus_namespace, core_v1, batch_v1, custom_objects
):
    """Two 4-GPU pods would share one 8-GPU node; one pod per node is asked by a spread
    selecting the Job's own name."""
    ns = nexus_namespace
    name = "spread" if key == "job-name" else "spread-batch"
    spread_job = job(name, "nexus-gold", 2, 4)
    spread_job.spec.template.spec.topology_spread_constraints = [client.V1TopologySpreadConstraint(
        max_skew=1, topology_key=HOSTNAME, when_unsatisfiable="DoNotSchedule",
        label_selector=client.V1LabelSelector(match_labels={key: name}))]
    uid = batch_v1.create_namespaced_job(ns, spread_job).metadata.uid

    def answered():
        wl = workload_owned_by(custom_objects, ns, uid)
        entry = next((c for c in ((wl or {}).get("status") or {}).get("admissionChecks") or []
                      if c.get("name") == CHECK), {})
        return entry if entry.get("state") in ("Ready", "Rejected", "Retry") else None

    entry = wait_for("nexus to answer the spread gang", answered, timeout=90)
    assert entry["state"] == "Ready", entry.get("message")
    pods = wait_for("both pods running", lambda: (
        p if all_running(p := pods_with_labels(core_v1, ns, f"job-name={name}"), 2) else None),
        timeout=90)
    assert len({p.spec.node_name for p in pods}) == 2
