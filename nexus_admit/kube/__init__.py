"""Translation between Kubernetes objects and the model (pure functions), label and
annotation keys, and cluster dumps. No Kubernetes client is imported here."""

from nexus_admit.kube.errors import TranslationError

__all__ = ["TranslationError"]
