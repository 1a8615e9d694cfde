"""Kubernetes integration: the scaled target's pods, measured cold starts, drain-aware scale-down.

``client`` is the only module that calls the API server (the Helm chart's RBAC is checked against
it); ``pods``, ``objects``, ``leadtime`` and ``drain`` are pure; ``watcher`` keeps a Deployment's pods
current from a list and a watch; ``scaler.sources.kube`` puts it together for the evaluator;
``cli`` adds ``leadscale kube-status`` and ``leadscale shutdown-advice``.
"""
