"""Our scheduling gate added by the apiserver itself: a MutatingAdmissionPolicy (GA and on by
default since Kubernetes 1.36) gates every pod created with a reservation label, so the
pods a Job controller creates in a burst never wait for a webhook call. The pod webhook
still reviews pods from anyone else (a tenant creating pods directly) and denies those that
name a reservation that is not theirs; for the trusted creators, the ungater makes the same
check before it gives a pod a slot (`controller/webhook/review.foreign_reason`).

Who uses it: the helm chart renders the same objects (`tests/charts` checks they match) and
`e2e/nexus_controller.py` installs them on the real control plane.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from nexus_admit.kube import labels as L

__all__ = [
    "POLICY_API_VERSION",
    "TRUSTED_POD_CREATORS",
    "pod_gate_binding",
    "pod_gate_policy",
    "untrusted_creator_condition",
]

POLICY_API_VERSION: Final = "admissionregistration.k8s.io/v1"
# The Job controller's own identity (kube-controller-manager with
# --use-service-account-credentials, as kubeadm runs it): it creates pods only from a Job's
# template, which Kueue wrote our label into. JobSet, LeaderWorkerSet... create Jobs, so
# their pods come from it too.
TRUSTED_POD_CREATORS: Final = ("system:serviceaccount:kube-system:job-controller",)

_NOT_GATED = (
    "!has(object.spec.schedulingGates) || "
    f"!object.spec.schedulingGates.exists(g, g.name == '{L.GATE_PLACEMENT}')"
)
_ADD_GATE = (
    "Object{spec: Object.spec{schedulingGates: "
    f'[Object.spec.schedulingGates{{name: "{L.GATE_PLACEMENT}"}}]}}}}'
)


def pod_gate_policy(name: str) -> dict[str, Any]:
    """Gate each pod created with a reservation label (scheduling gates are a map keyed by
    name, so the apply merges ours with the pod's own)."""
    return {
        "apiVersion": POLICY_API_VERSION,
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ],
                "objectSelector": {
                    "matchExpressions": [{"key": L.LABEL_RESERVATION, "operator": "Exists"}]
                },
            },
            "matchConditions": [{"name": "not-gated-yet", "expression": _NOT_GATED}],
            "mutations": [
                {"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": _ADD_GATE}}
            ],
        },
    }


def pod_gate_binding(name: str, namespace_selector: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": POLICY_API_VERSION,
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "matchResources": {"namespaceSelector": dict(namespace_selector)},
        },
    }


def untrusted_creator_condition(trusted: Sequence[str] = TRUSTED_POD_CREATORS) -> dict[str, str]:
    """The pod webhook's matchCondition when the policy gates: only pods created by someone
    other than the trusted controllers are sent to it."""
    names = ", ".join(f"'{t}'" for t in trusted)
    return {
        "name": "untrusted-creator",
        "expression": f"!(request.userInfo.username in [{names}])",
    }
