"""The hooks of nexus-admit's MutatingWebhookConfiguration on the local control plane, by
URL, as the chart's (charts/nexus-admit/templates/webhook.yaml) in each gate mode; tests/
charts compares the two. Pure: the caller gives the port and the cluster's CA."""

from __future__ import annotations

import base64
from typing import Any

from plane.components import KUEUE_NAMESPACE

from nexus_admit.kube import labels as L
from nexus_admit.kube.pod_gate_policy import pin_hook_condition, untrusted_creator_condition

RESERVATION_LABEL = L.LABEL_RESERVATION
QUEUE_LABEL = L.KUEUE_QUEUE_NAME_LABEL
SUSPENDING_PARENT = "kueue.x-k8s.io/pod-suspending-parent"
SYSTEM_NAMESPACES_EXCLUDED = {
    "matchExpressions": [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", KUEUE_NAMESPACE],
        }
    ]
}


def _base_hook(url: str, ca: str) -> dict[str, Any]:
    """What every hook shares: pod creations outside the system namespaces, failing closed."""
    return {
        "clientConfig": {"url": url, "caBundle": ca},
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "namespaceSelector": SYSTEM_NAMESPACES_EXCLUDED,
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 5,
        "reinvocationPolicy": "IfNeeded",
    }


def _policy_mode_hooks(
    hook: dict[str, Any], reserved: dict[str, Any], base_url: str, pin_at_creation: bool
) -> list[dict[str, Any]]:
    # the Job controller's pods are gated by the policy (pod_gate_policy.py), and
    # pods queued in Kueue by the queue gate policy, in the apiserver: no webhook
    # call, so pods of queues without our check never depend on us
    hooks = [{**reserved, "matchConditions": [untrusted_creator_condition()]}]
    if pin_at_creation:
        # the Job controller's pods, gated by the policy: pinned in the same request
        # when their slot is known, else left gated; never refused
        hooks.append({
            **reserved,
            "name": "pod-pin.scheduling.kubenexus.io",
            "clientConfig": {**hook["clientConfig"], "url": f"{base_url}/pod-pin"},
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "matchConditions": [pin_hook_condition()],
        })
    return hooks


def _webhook_mode_hooks(
    hook: dict[str, Any], reserved: dict[str, Any], base_url: str, pin_at_creation: bool
) -> list[dict[str, Any]]:
    no_reservation = {"key": RESERVATION_LABEL, "operator": "DoesNotExist"}
    if pin_at_creation:
        # a pod it would gate gets its slot's pin instead where the slot is certain;
        # called once, so it never judges a pod it has already pinned
        url = f"{base_url}/pod-gate-pin"
        reserved = {**reserved, "clientConfig": {**hook["clientConfig"], "url": url},
                    "reinvocationPolicy": "Never"}
    return [
        reserved,
        {
            # pods queued in Kueue: gated at creation when their queue uses the check
            **hook,
            "name": "queued-pod-gate.scheduling.kubenexus.io",
            "objectSelector": {
                "matchExpressions": [
                    {"key": QUEUE_LABEL, "operator": "Exists"},
                    no_reservation,
                ]
            },
        },
        {
            # pods Kueue suspends through their StatefulSet (no queue label yet)
            **hook,
            "name": "statefulset-pod-gate.scheduling.kubenexus.io",
            "objectSelector": {
                "matchExpressions": [
                    {"key": QUEUE_LABEL, "operator": "DoesNotExist"},
                    no_reservation,
                ]
            },
            "matchConditions": [
                {
                    "name": "suspended-by-statefulset",
                    "expression": (
                        "has(object.metadata.annotations) && "
                        f"'{SUSPENDING_PARENT}' in object.metadata.annotations && "
                        f"object.metadata.annotations['{SUSPENDING_PARENT}'] == "
                        "'statefulset'"
                    ),
                }
            ],
        },
    ]


def webhook_configuration(
    name: str, gate_mode: str, pin_at_creation: bool, port: int, ca_crt: bytes
) -> dict[str, Any]:
    """The MutatingWebhookConfiguration `name` for a controller serving on 127.0.0.1:`port`
    with a certificate the CA `ca_crt` signed."""
    base_url = f"https://127.0.0.1:{port}"
    hook = _base_hook(f"{base_url}/pod-gate", base64.b64encode(ca_crt).decode())
    # pods that carry a reservation label (Kueue put it on a Job's template)
    reserved = {
        **hook,
        "name": "pod-gate.scheduling.kubenexus.io",
        "objectSelector": {
            "matchExpressions": [{"key": RESERVATION_LABEL, "operator": "Exists"}]
        },
    }
    build = _policy_mode_hooks if gate_mode == "policy" else _webhook_mode_hooks
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": build(hook, reserved, base_url, pin_at_creation),
    }
