"""``leadscale serve``: run the KEDA external scaler (gRPC) and its own metrics endpoint.

Every flag has an environment-variable twin (``LEADSCALE_<FLAG>``, dashes as underscores) so the
Helm chart can configure the container without rewriting its command line; a flag given on the
command line wins over the environment. Heavy imports (grpc, prometheus_client) happen in ``run``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from scaler import evaluation, warmup
from scaler.cli_types import boolean, choice, integer, number, port, seconds
from scaler.limits import Limit

ENV_PREFIX = "LEADSCALE_"


def _env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


# (flag, type, default, help); the environment default is resolved at parse time
FLAGS: tuple[tuple[str, Callable[[str], Any], Any, str], ...] = (
    ("--host", str, "0.0.0.0", "address the gRPC and metrics servers listen on"),
    ("--port", port, 9090, "gRPC port KEDA connects to (scalerAddress)"),
    ("--metrics-port", port, 9091, "port of the scaler's own /metrics and /decisions; 0 picks a free one"),
    ("--metrics-host", str, None, "address /metrics and /decisions listen on (default: --host)"),
    ("--prometheus-url", str, None, "default Prometheus for triggers without prometheusAddress"),
    ("--prometheus-auth-modes", str, None,
     "how to reach --prometheus-url, as KEDA's Prometheus trigger's authModes: bearer, basic, tls (comma-separated)"),
    ("--prometheus-auth-dir", str, None,
     "directory of files named after KEDA's Prometheus TriggerAuthentication parameters: bearerToken, username, "
     "password, ca, cert, key (a mounted Secret); sent only to --prometheus-url"),
    ("--scrape-targets", str, None, "comma-separated pod /metrics URLs: direct-scrape mode instead of Prometheus"),
    ("--interval", seconds, evaluation.DEFAULT_INTERVAL_S, "seconds between evaluations of each scaled object"),
    ("--staleness-limit", seconds, evaluation.DEFAULT_STALENESS_LIMIT_S,
     "seconds a last good decision may be reused after failed fetches; older means UNAVAILABLE"),
    ("--idle-timeout", seconds, 600.0, "drop a scaled object not asked about for this many seconds"),
    ("--warm-up", number(Limit(0.0, 86_400.0), "seconds"), warmup.DEFAULT_SPAN_S,
     "replay this much of a new scaled object's Prometheus history through the policy, so a restarted scaler "
     "decides with what it had learned (efficiency, headroom bands); 0 turns it off"),
    ("--kubernetes", boolean, False,
     "read ready/starting pods, measured lead time and min/max from the API server (in-cluster or kubeconfig)"),
    ("--deletion-cost", boolean, False,
     "with --kubernetes: before a scale-down, mark the least busy pods for deletion (pod-deletion-cost)"),
    ("--max-workers", integer(4), 256, "gRPC worker threads (each open StreamIsActive holds one)"),
    ("--max-objects", integer(1), 10_000,
     "most scaled objects evaluated at once; a new one past it is RESOURCE_EXHAUSTED until others idle out"),
    ("--tls-cert", str, None, "server certificate (PEM); enables TLS"),
    ("--tls-key", str, None, "server private key (PEM)"),
    ("--tls-client-ca", str, None, "CA bundle (PEM) that client certificates must chain to; enables mTLS"),
    ("--decision-process", boolean, True,
     "compute decisions in a process of their own, so RPCs never wait behind an evaluation round; false keeps "
     "them in the serving process"),
    ("--pin-serving-cpu", boolean, True,
     "run every thread of the serving process on one CPU of those the scaler may use (a call's thread hand-offs "
     "stay on one core: less CPU a call, faster bursts); the decision process stays where the kernel puts it. "
     "Needs --decision-process and at least two CPUs; otherwise nothing is pinned"),
    ("--gil-switch-ms", number(Limit(0.05, 100.0), "milliseconds"), 0.5,
     "longest an RPC thread waits for the interpreter while the evaluator computes (Python's switch interval; "
     "Python's own default is 5)"),
    ("--log-level", choice("DEBUG", "INFO", "WARNING", "ERROR"), "INFO", "Python logging level"),
    ("--log-format", choice("text", "json"), "text",
     "text: 'time level logger message' lines (decision messages are JSON); json: one JSON object per line"),
)


def _env_default(flag: str, convert: Callable[[str], Any], default: Any) -> Any:
    raw = os.environ.get(_env_name(flag))
    if raw is None or raw == "":
        return default
    try:
        return convert(raw)
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"leadscale serve: environment {_env_name(flag)}={raw!r}: {exc}") from None


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``serve`` subcommand."""
    parser = subparsers.add_parser(
        "serve",
        help="run the KEDA external scaler (gRPC) with its metrics endpoint",
        description="Run the KEDA external scaler. Every flag can also be set as LEADSCALE_<FLAG> "
                    "(e.g. LEADSCALE_PROMETHEUS_URL); the command line wins.",
    )
    for flag, convert, default, text in FLAGS:
        parser.add_argument(flag, type=convert, default=None,
                            help=f"{text} (env {_env_name(flag)}; default {default})")
    parser.set_defaults(func=run)


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill flags not given on the command line from the environment, then from the defaults."""
    values = {}
    for flag, convert, default, _ in FLAGS:
        dest = flag.lstrip("-").replace("-", "_")
        given = getattr(args, dest, None)
        values[dest] = given if given is not None else _env_default(flag, convert, default)
    problems = []
    if bool(values["tls_cert"]) != bool(values["tls_key"]):
        problems.append("--tls-cert and --tls-key must be given together")
    if values["deletion_cost"] and not values["kubernetes"]:
        problems.append("--deletion-cost needs --kubernetes")
    if values["tls_client_ca"] and not values["tls_cert"]:
        problems.append("--tls-client-ca (mTLS) needs --tls-cert and --tls-key")
    if (values["prometheus_auth_modes"] or values["prometheus_auth_dir"]) and not values["prometheus_url"]:
        problems.append("--prometheus-auth-modes/--prometheus-auth-dir need --prometheus-url "
                        "(credentials go only there)")
    if values["metrics_host"] is None:
        values["metrics_host"] = values["host"]
    if problems:
        raise SystemExit("leadscale serve: " + "; ".join(problems))
    return argparse.Namespace(**{**vars(args), **values})


def run(args: argparse.Namespace) -> int:
    """Start the servers and block until SIGTERM/SIGINT."""
    from scaler.service import serve_forever

    return serve_forever(resolve(args))
