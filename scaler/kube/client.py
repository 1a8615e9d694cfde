"""The only module that talks to the Kubernetes API server.

Every call the scaler makes is a method here, and each maps to one RBAC rule the Helm chart grants
(``tests/test_chart.py`` checks the two agree, by recording the requests these methods send):

==============================  ============  ================  =========
method                          API group     resource          verb
==============================  ============  ================  =========
``get_scaled_object``           keda.sh       scaledobjects     get
``get_deployment``              apps          deployments       get
``list_pods``                   "" (core)     pods              list
``watch_pods``                  "" (core)     pods              watch
``set_pod_annotation``          "" (core)     pods              patch (only with deletion cost on)
==============================  ============  ================  =========

Errors come back as ``KubeError`` naming the object and what RBAC or the object lacks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

KEDA_GROUP = "keda.sh"
KEDA_VERSION = "v1alpha1"
REQUEST_TIMEOUT_S = 3.0  # the evaluator's first decision for an object is bounded at 2 s; don't stall rounds
RETRIES = 1  # urllib3 retries per request (its default of 3 would multiply the timeout)


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _explain(exc: ApiException, what: str, verb: str, resource: str) -> KubeError:
    status = int(exc.status or 0)
    if status == 404:
        return KubeError(f"{what} not found", status)
    if status in (401, 403):
        return KubeError(f"{what}: {verb} {resource} is forbidden ({status}); the scaler's RBAC must allow it "
                         "(see the Helm chart's ClusterRole)", status)
    reason = exc.reason or ""
    with suppress(ValueError, AttributeError):
        reason = json.loads(exc.body).get("message", reason) if exc.body else reason
    return KubeError(f"{what}: {verb} {resource} failed with HTTP {status}: {reason}", status)


@contextmanager
def _calling(what: str, verb: str, resource: str) -> Iterator[None]:
    """Turn the client's exceptions (HTTP errors, unreachable server) into ``KubeError``."""
    try:
        yield
    except ApiException as exc:
        raise _explain(exc, what, verb, resource) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise KubeError(f"{what}: {verb} {resource}: API server unreachable ({type(exc).__name__}: {exc})") from None


class KubeApi:
    """Thin, typed access to the five calls the scaler makes; one instance is shared by all watchers."""

    def __init__(self, api_client: client.ApiClient, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.timeout = request_timeout_s

    @classmethod
    def from_environment(cls) -> KubeApi:
        """In a pod: the ServiceAccount's token; elsewhere: the current kubeconfig context."""
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)
        configuration.retries = RETRIES
        return cls(client.ApiClient(configuration))

    @classmethod
    def for_host(cls, host: str) -> KubeApi:
        """An unauthenticated client for ``host`` (tests serve recorded responses on 127.0.0.1)."""
        configuration = client.Configuration()
        configuration.host = host
        configuration.retries = RETRIES
        return cls(client.ApiClient(configuration))

    def get_scaled_object(self, namespace: str, name: str) -> dict[str, Any]:
        """The ScaledObject as a dict (KEDA's CRD has no generated model)."""
        with _calling(f"ScaledObject {namespace}/{name}", "get", "scaledobjects.keda.sh"):
            found = self.custom.get_namespaced_custom_object(
                KEDA_GROUP, KEDA_VERSION, namespace, "scaledobjects", name, _request_timeout=self.timeout)
        if not isinstance(found, dict):
            raise KubeError(f"ScaledObject {namespace}/{name}: the API server answered {type(found).__name__}, "
                            "not an object")
        return found

    def get_deployment(self, namespace: str, name: str) -> client.V1Deployment:
        """The scale target."""
        with _calling(f"Deployment {namespace}/{name}", "get", "deployments.apps"):
            return self.apps.read_namespaced_deployment(name, namespace, _request_timeout=self.timeout)

    def list_pods(self, namespace: str, selector: str) -> client.V1PodList:
        """The target's pods now, with the resourceVersion a watch resumes from."""
        with _calling(f"pods in {namespace} matching {selector!r}", "list", "pods"):
            return self.core.list_namespaced_pod(namespace, label_selector=selector, _request_timeout=self.timeout)

    def watch_pods(self, namespace: str, selector: str, resource_version: str,
                   timeout_s: int) -> Iterator[dict[str, Any]]:
        """Watch events (ADDED/MODIFIED/DELETED/BOOKMARK) after ``resource_version`` for ``timeout_s``.

        Raises ``KubeError`` with status 410 when the version has expired: list again, then watch.
        """
        stream = watch.Watch().stream(
            self.core.list_namespaced_pod, namespace, label_selector=selector, resource_version=resource_version,
            timeout_seconds=timeout_s, allow_watch_bookmarks=True, _request_timeout=timeout_s + self.timeout)
        with _calling(f"pods in {namespace} matching {selector!r}", "watch", "pods"):
            yield from stream

    def set_pod_annotation(self, namespace: str, name: str, key: str, value: str | None) -> None:
        """Set (or, with None, remove) one annotation by JSON merge patch; nothing else is touched."""
        body = {"metadata": {"annotations": {key: value}}}
        with _calling(f"Pod {namespace}/{name}", "patch", "pods"):
            self.core.patch_namespaced_pod(name, namespace, body, _content_type="application/merge-patch+json",
                                           _request_timeout=self.timeout)
