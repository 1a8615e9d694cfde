"""The ``leadscale`` command: one entry point, one subcommand per job.

Each subcommand lives beside the code it drives and exposes ``register(subparsers)``, which adds its
parser and sets ``func(args) -> int``. Modules keep heavy imports (matplotlib, optuna, httpx) inside
their run functions so ``leadscale --help`` stays fast, and so the scaler's own install (without the
``sim`` extra) still lists every command: a simulator command run without the extra says what to install
(``missing_extra``) instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# module paths whose ``register(subparsers)`` adds one or more subcommands, in help order
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "scaler.serve_cli",
    "scaler.shadow_cli",
    "scaler.kube.cli",
    "simulator.replay_cli",
    "simulator.cli",
    "simulator.compare_cli",
    "simulator.advisor_cli",
)
# top-level modules the ``sim`` extra installs (pyproject.toml; tests/test_packaging.py keeps the two equal)
SIM_EXTRA_MODULES = frozenset({"optuna", "matplotlib", "tqdm", "numba"})


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
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in SIM_EXTRA_MODULES:
            raise
        print(missing_extra(args.command, exc.name), file=sys.stderr)
        return 2



def missing_extra(command: str, module: str) -> str:
    """The one-line answer when ``leadscale COMMAND`` needs a module only the ``sim`` extra installs."""
    return (f"leadscale {command}: needs {module!r}, which comes with the simulator extra; "
            "install it with: pip install 'leadscale[sim]'")


if __name__ == "__main__":
    sys.exit(main())
