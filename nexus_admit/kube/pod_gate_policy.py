"""Our scheduling gate added by the apiserver itself: MutatingAdmissionPolicies (GA and on by
default since Kubernetes 1.36), so the pods a controller creates in a burst never wait for
a webhook call, and pods of queues without our check never depend on nexus-admit.

- `pod_gate_policy`: every pod created with a reservation label (Kueue wrote it into a
  Job's template when our check turned Ready).
- `queue_gate_policy`: every pod created with Kueue's queue label whose queue uses our
  check, whoever creates it (a ReplicaSet, LeaderWorkerSet, a tenant), and every pod Kueue
  suspends through its StatefulSet (created without the queue label: the StatefulSet's
  queue decides). CEL cannot look a LocalQueue up, so its binding reads a ConfigMap the
  controller keeps (`controller/queue_gate.py`, keys from `kube/queues.py`).

The pod webhook still reviews reservation-labelled pods from anyone but the trusted
creators and denies those that name a reservation that is not theirs; for the trusted
creators, the ungater makes the same check before it gives a pod a slot
(`controller/webhook/review.foreign_reason`).

Who uses it: the helm chart renders the same objects (`tests/charts` checks they match) and
`e2e/nexus_controller.py` installs them on the real control plane.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from nexus_admit.kube import labels as L
from nexus_admit.kube.queues import SUSPENDING_PARENT_ANNOTATION

__all__ = [
    "KUEUE_MANAGED_CONDITION",
    "POLICY_API_VERSION",
    "QUEUE_GATE_CONDITION",
    "TRUSTED_POD_CREATORS",
    "pin_hook_condition",
    "pod_gate_binding",
    "pod_gate_policy",
    "queue_gate_binding",
    "queue_gate_policy",
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


def pod_gate_policy(name: str, *, pin_at_creation: bool = False) -> dict[str, Any]:
    """Gate each pod created with a reservation label (scheduling gates are a map keyed by
    name, so the apply merges ours with the pod's own). `pin_at_creation`: the pin hook
    (`pin_hook_condition`) may take the gate off again in the same request, so the policy
    is not reinvoked after it (it would put the gate back)."""
    return {
        "apiVersion": POLICY_API_VERSION,
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never" if pin_at_creation else "IfNeeded",
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


# the queue's key in the ConfigMap (kube/queues.gated_queue_key): a namespace has no dots.
# request.namespace, not object.metadata.namespace: a pod may be created without one.
# Listed with its ClusterQueue: the queue uses our check; listed with "": it does not;
# not listed: not known yet (created a moment ago), gated to be safe, and the ungater lifts
# the gate once it knows. No data at all (nexus-admit never wrote it): nothing is gated.
_QUEUE_KEY: Final = (
    f"(request.namespace + '.' + object.metadata.labels['{L.KUEUE_QUEUE_NAME_LABEL}'])"
)
_PARENT_KEY: Final = "(request.namespace + '_StatefulSet_' + r.name)"
_QUEUED: Final = (
    "has(object.metadata.labels) && "
    f"'{L.KUEUE_QUEUE_NAME_LABEL}' in object.metadata.labels"
)
_SUSPENDED_BY_STATEFULSET: Final = (
    "has(object.metadata.annotations) && "
    f"'{SUSPENDING_PARENT_ANNOTATION}' in object.metadata.annotations && "
    f"object.metadata.annotations['{SUSPENDING_PARENT_ANNOTATION}'] == 'statefulset' && "
    "has(object.metadata.ownerReferences)"
)
# a pod with the queue label: its queue decides; a pod Kueue suspends through its
# StatefulSet (no queue label yet): the StatefulSet's entry decides
KUEUE_MANAGED_CONDITION: Final = f"({_QUEUED}) || ({_SUSPENDED_BY_STATEFULSET})"
# a StatefulSet not listed yet (created a moment ago): gated unless its namespace is known
# to have no queue that uses the check
_NAMESPACE_GATES: Final = (
    "(!(request.namespace in params.data) || params.data[request.namespace] != '')"
)
QUEUE_GATE_CONDITION: Final = (
    f"has(params.data) && (({_QUEUED}) ? "
    f"(!({_QUEUE_KEY} in params.data) || params.data[{_QUEUE_KEY}] != '') : "
    "object.metadata.ownerReferences.exists(r, r.kind == 'StatefulSet' && "
    f"(({_PARENT_KEY} in params.data) ? params.data[{_PARENT_KEY}] != '' : {_NAMESPACE_GATES})))"
)


def queue_gate_policy(name: str) -> dict[str, Any]:
    """Gate each pod created with the queue label of a queue that uses our check, or
    suspended by Kueue through a StatefulSet whose queue does (the binding's ConfigMap
    lists them). A pod with a reservation label is `pod_gate_policy`'s."""
    policy = pod_gate_policy(name)
    spec = policy["spec"]
    spec["paramKind"] = {"apiVersion": "v1", "kind": "ConfigMap"}
    spec["matchConstraints"]["objectSelector"] = {
        "matchExpressions": [{"key": L.LABEL_RESERVATION, "operator": "DoesNotExist"}]
    }
    spec["matchConditions"] = [
        *spec["matchConditions"],
        {"name": "kueue-managed", "expression": KUEUE_MANAGED_CONDITION},
        {"name": "queue-uses-the-check", "expression": QUEUE_GATE_CONDITION},
    ]
    return policy


def queue_gate_binding(
    name: str, namespace_selector: Mapping[str, Any], configmap_namespace: str, configmap: str
) -> dict[str, Any]:
    """The binding that hands `queue_gate_policy` the ConfigMap of gated queues. Without
    the ConfigMap no pod is gated by it (Allow): never a refusal of a pod nexus-admit does
    not place."""
    binding = pod_gate_binding(name, namespace_selector)
    binding["spec"]["paramRef"] = {
        "name": configmap,
        "namespace": configmap_namespace,
        "parameterNotFoundAction": "Allow",
    }
    return binding


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


def pin_hook_condition(trusted: Sequence[str] = TRUSTED_POD_CREATORS) -> dict[str, str]:
    """The pin hook's matchCondition (`controller/ungating/at_creation.py`): only pods the trusted
    controllers create, which the pod gate policy has gated and no other hook reviews."""
    names = ", ".join(f"'{t}'" for t in trusted)
    return {"name": "trusted-creator", "expression": f"request.userInfo.username in [{names}]"}
