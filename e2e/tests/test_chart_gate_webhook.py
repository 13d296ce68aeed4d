"""The chart on the oldest plane (1.34), where `webhook.gateMode: auto` renders `webhook` (no
`admissionregistration.k8s.io/v1` MutatingAdmissionPolicy served): installed with `auto`.

The tests are test_chart.py's own, imported so that they run here with this module's
`gate_mode`: the install renders the three hooks and no policy, no queue list ConfigMap nor
the right to write it; the controller, logged in as the chart's ServiceAccount, serves the
webhook that now reviews every labelled pod (the Job controller's too: the reservation,
its Workload and the pod's owners read with that ServiceAccount's rights) and places a
gang; `helm uninstall` leaves nothing behind. Its own module, apart from
test_gate_webhook.py, so that two controllers never run side by side.
"""

from __future__ import annotations

import pytest
import test_chart

# collected here too, in test_chart's order (the last one uninstalls), with this module's
# `gate_mode`; the fixtures they use are test_chart's, set up anew for this module
release = test_chart.release
sa_controller = test_chart.sa_controller
test_helm_install_creates_the_objects_and_prints_the_cluster_queue_line = (
    test_chart.test_helm_install_creates_the_objects_and_prints_the_cluster_queue_line
)
test_service_account_can_do_what_the_controller_does_and_nothing_more = (
    test_chart.test_service_account_can_do_what_the_controller_does_and_nothing_more
)
test_the_controller_as_the_chart_service_account_places_a_gang = (
    test_chart.test_the_controller_as_the_chart_service_account_places_a_gang
)
test_helm_uninstall_leaves_nothing_cluster_scoped_but_the_crds = (
    test_chart.test_helm_uninstall_leaves_nothing_cluster_scoped_but_the_crds
)

pytestmark = [pytest.mark.e2e, pytest.mark.gate_webhook, pytest.mark.timeout(300, func_only=True)]


@pytest.fixture(scope="module")
def gate_mode() -> str:
    return "webhook"
