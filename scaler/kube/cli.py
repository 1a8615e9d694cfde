"""``leadscale kube-status`` and ``leadscale shutdown-advice``: what the Kubernetes integration sees.

``kube-status NAMESPACE/SCALEDOBJECT`` prints, as JSON, the view the scaler would use (ready,
starting and stuck pods, min/max, the measured lead time) and each measured cold start phase by
phase. It talks to the API server with the current kubeconfig, or to ``--api-server`` (e.g.
``kubectl proxy`` on http://127.0.0.1:8001). With ``--advise`` it also scrapes the ready pods and
recommends vLLM's ``--shutdown-timeout`` and ``terminationGracePeriodSeconds`` (pod IPs must be
reachable: run it in the cluster). ``shutdown-advice URL...`` does the same from given ``/metrics``
URLs, e.g. through ``kubectl port-forward``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kube-status`` and ``shutdown-advice``."""
    status = subparsers.add_parser("kube-status", help="what the scaler sees of a ScaledObject's pods (JSON)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    status.add_argument("scaled_object", metavar="NAMESPACE/NAME", help="the ScaledObject, e.g. llm/llama3-8b")
    status.add_argument("--api-server", default=None,
                        help="plain-HTTP API endpoint such as kubectl proxy's http://127.0.0.1:8001 "
                             "(default: in-cluster config, else kubeconfig)")
    status.add_argument("--stuck-after", type=float, default=1800.0,
                        help="seconds a pod may stay not ready before it counts as stuck (default 1800)")
    status.add_argument("--advise", action="store_true",
                        help="also scrape the ready pods and recommend shutdown timeout and grace period")
    status.add_argument("--model", default=None, help="vLLM model_name to read when pods serve several")
    status.set_defaults(func=run_status)

    advice = subparsers.add_parser("shutdown-advice", help="vLLM --shutdown-timeout and grace period from /metrics",
                                   description="Recommend vLLM's --shutdown-timeout and the pod's "
                                               "terminationGracePeriodSeconds from the p99 request duration.")
    advice.add_argument("urls", nargs="+", metavar="URL", help="vLLM /metrics URLs (one per pod)")
    advice.add_argument("--model", default=None, help="vLLM model_name to read when pods serve several")
    advice.add_argument("--grace-period", type=int, default=None,
                        help="the Deployment's current terminationGracePeriodSeconds, to compare")
    advice.add_argument("--margin", type=float, default=15.0, help="seconds added for the engine to stop (15)")
    advice.set_defaults(func=run_advice)


def _split(ref: str) -> tuple[str, str]:
    namespace, sep, name = ref.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise SystemExit(f"leadscale kube-status: NAMESPACE/NAME={ref!r}: expected e.g. llm/llama3-8b")
    return namespace, name


def run_status(args: argparse.Namespace) -> int:
    """Print the view and the measured cold starts of one ScaledObject."""
    from dataclasses import asdict

    from scaler.kube.client import KubeApi, KubeError
    from scaler.kube.objects import KubeObjectError
    from scaler.sources.kube import KubeObserver

    namespace, name = _split(args.scaled_object)
    api = KubeApi.for_host(args.api_server) if args.api_server else KubeApi.from_environment()
    observer = KubeObserver(api, watch=False, stuck_after_s=args.stuck_after)
    try:
        view = observer.observe(namespace, name)
        tracker = observer.watcher(observer.target(namespace, name)).tracker
        out: dict[str, Any] = {"view": asdict(view),
                               "cold_starts": [{"pod": s.pod, **s.phases()} for s in tracker.samples()]}
        if args.advise:
            advice, grace = observer.shutdown_advice(namespace, name, args.model)
            out["shutdown_advice"] = {**asdict(advice), "current_grace_period_s": grace,
                                      "explain": advice.explain(grace)}
    except (KubeError, KubeObjectError, ValueError) as exc:
        print(f"leadscale kube-status: {exc}", file=sys.stderr)
        return 1
    finally:
        observer.close()
    print(json.dumps(out, indent=2))
    return 0


def run_advice(args: argparse.Namespace) -> int:
    """Scrape the given /metrics URLs once and print the recommendation."""
    import httpx

    from scaler.kube.drain import parse_pod_metrics, shutdown_advice

    loads = {}
    for url in args.urls:
        try:
            response = httpx.get(url, timeout=5.0)
            response.raise_for_status()
            loads[url] = parse_pod_metrics(response.text, args.model)
        except (httpx.HTTPError, ValueError) as exc:
            print(f"leadscale shutdown-advice: {url}: {exc}", file=sys.stderr)
            return 1
    try:
        advice = shutdown_advice(loads, margin_s=args.margin)
    except ValueError as exc:
        print(f"leadscale shutdown-advice: {exc}", file=sys.stderr)
        return 1
    print(advice.explain(args.grace_period))
    return 0
