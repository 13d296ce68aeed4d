"""The plane's objects through kubectl: server-side apply, the CRDs it installs before
the controllers start (Kueue's conversion webhooks rewritten to URLs), and the probes of
what the objects say (nodes Ready, ClusterQueues Active, Kueue's webhook answering)."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from plane.components import (
    KUEUE_CONVERSION_CRDS,
    controller_crds,
    installed_controllers,
    yaml_docs,
)
from plane.environment import REPO
from plane.processes import ClusterError, log
from plane.state_files import StateFiles

# kube-apiserver tears down the informer of a (mutating) policy parameter kind for good (until it
# restarts) as soon as no binding names that kind for a moment (kubernetes/kubernetes#130887):
# after that, every binding with ConfigMap parameters finds none. The tests install and
# uninstall the chart and the controller's gate policies many times per plane, so the
# plane keeps one binding with ConfigMap parameters for its whole life. It matches
# nothing (no one creates the resource it names).
CONFIGMAP_PARAM_KEEPER: list[dict[str, Any]] = [
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": "e2e-configmap-param-keeper"},
        "spec": {
            "failurePolicy": "Ignore",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["e2e.invalid"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["nothing"],
                    }
                ]
            },
            "mutations": [
                {
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {"expression": "Object{}"},
                }
            ],
            "reinvocationPolicy": "Never",
        },
    },
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": "e2e-configmap-param-keeper"},
        "spec": {
            "policyName": "e2e-configmap-param-keeper",
            "paramRef": {
                "name": "e2e-configmap-param-keeper",
                "namespace": "default",
                "parameterNotFoundAction": "Allow",
            },
        },
    },
]


class PlaneObjects(StateFiles):
    """kubectl on the plane's admin kubeconfig, and what the bring-up reads and writes."""

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        argv = [str(self.bin / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        r = subprocess.run(argv, input=input, text=True, capture_output=True, timeout=timeout)
        if check and r.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed:\n{r.stderr.strip()}")
        return r

    def apply(self, docs: list[dict[str, Any]] | str, retries: int = 1, delay: float = 1.0) -> None:
        """Server-side apply a list of objects (or YAML text)."""
        # objects go as one JSON List: dumping megabytes of CRDs as YAML takes seconds
        text = (
            docs
            if isinstance(docs, str)
            else json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
        )
        for attempt in range(retries):
            r = self.kubectl(
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=nexus-e2e",
                "-f",
                "-",
                input=text,
                check=False,
            )
            if r.returncode == 0:
                return
            if attempt == retries - 1:
                raise ClusterError(f"kubectl apply failed:\n{r.stderr.strip()}")
            time.sleep(delay)

    def _ca_bundle(self) -> str:
        return base64.b64encode((self.pki / "ca.crt").read_bytes()).decode()

    def _crds(self, b: Path, ports: dict[str, int]) -> list[dict[str, Any]]:
        out = []
        for f in sorted((b / "manifests" / "kueue" / "crd").glob("*.yaml")):
            for doc in yaml_docs(f):
                if doc["metadata"]["name"] in KUEUE_CONVERSION_CRDS:
                    doc["spec"]["conversion"] = {
                        "strategy": "Webhook",
                        "webhook": {
                            "clientConfig": {
                                "url": f"https://127.0.0.1:{ports['kueue_webhook']}/convert",
                                "caBundle": self._ca_bundle(),
                            },
                            "conversionReviewVersions": ["v1"],
                        },
                    }
                out.append(doc)
        # nexus-admit's own CRDs, before the controller-manager starts, so that its garbage
        # collector knows ResourceReservations (owned by Workloads) from its first discovery
        for f in sorted((REPO / "crds").glob("*.yaml")):
            out += yaml_docs(f)
        nrt = b / "manifests" / "nrt" / "crd.yaml"
        if nrt.exists():
            out += yaml_docs(nrt)
        else:
            log(f"WARNING: {nrt} missing (binaries built before the NRT CRD was added)")
        # before Kueue starts: it runs its ProvisioningRequest check only if the kind is
        # served when it starts (provisioning.ServerSupportsProvisioningRequest)
        provreq = b / "manifests" / "provreq" / "crd.yaml"
        if provreq.exists():
            out += yaml_docs(provreq)
        else:
            log(f"WARNING: {provreq} missing (binaries built before it was added)")
        for c in installed_controllers(b):
            out += controller_crds(b, c)
        return out

    # -- readiness probes ---------------------------------------------------------------
    def _webhook_answers(self) -> bool:
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "generateName": "webhook-probe-",
                "namespace": "default",
                "labels": {"kueue.x-k8s.io/queue-name": "probe"},
            },
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "c", "image": "probe"}],
                    }
                }
            },
        }
        r = self.kubectl(
            "create",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            "-",
            input=json.dumps(job),
            check=False,
        )
        if r.returncode != 0:
            return False
        return json.loads(r.stdout).get("spec", {}).get("suspend") is True

    def _count_ready_nodes(self) -> int:
        r = self.kubectl("get", "nodes", "-o", "json", check=False)
        if r.returncode != 0:
            return 0
        n = 0
        for item in json.loads(r.stdout)["items"]:
            for c in item.get("status", {}).get("conditions", []):
                if c["type"] == "Ready" and c["status"] == "True":
                    n += 1
        return n

    def _clusterqueues_active(self) -> bool:
        r = self.kubectl("get", "clusterqueues.v1beta2.kueue.x-k8s.io", "-o", "json", check=False)
        if r.returncode != 0:
            return False
        items = json.loads(r.stdout)["items"]
        if not items:
            return False
        for cq in items:
            if (cq.get("spec") or {}).get("admissionChecksStrategy"):
                continue  # active only while its check's controller runs (nexus-admit's)
            conds = {c["type"]: c["status"] for c in cq.get("status", {}).get("conditions", [])}
            if conds.get("Active") != "True":
                return False
        return True
