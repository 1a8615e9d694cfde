"""The ``leadscale`` command: one entry point, one subcommand per job.

Each subcommand lives beside the code it drives and exposes ``register(subparsers)``, which adds its
parser and sets ``func(args) -> int``. Modules keep heavy imports (matplotlib, optuna, httpx) inside
their run functions so ``leadscale --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# module paths whose ``register(subparsers)`` adds one or more subcommands, in help order
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "scaler.serve_cli",
    "scaler.kube.cli",
    "simulator.replay_cli",
    "simulator.cli",
    "simulator.compare_cli",
    "simulator.advisor_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leadscale",
        description="Autoscale vLLM on Kubernetes GPUs from token-weighted load and cold-start lead time.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_path in SUBCOMMAND_MODULES:
        importlib.import_module(module_path).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
