"""The scaler stands alone: ``scaler/`` imports nothing from ``simulator/``, and without the ``sim``
extra's modules the live path still imports, parses metadata and serves, while a simulator command
says which extra to install instead of a traceback."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
import tomllib

from conftest import ROOT

from leadscale.cli import SIM_EXTRA_MODULES

SIM_ONLY = tuple(sorted(SIM_EXTRA_MODULES))

# a child interpreter in which the sim extra's modules cannot be imported, as after ``pip install leadscale``
BLOCKER = textwrap.dedent(f"""
    import importlib.abc, sys
    class _Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {SIM_ONLY!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None
    sys.meta_path.insert(0, _Blocked())
""")


def _run_without_sim_extra(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def _imported_modules(path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(str(node.args[0].value))
    return names


def test_scaler_imports_nothing_from_the_simulator() -> None:
    offenders = {str(path.relative_to(ROOT)): sorted(m for m in _imported_modules(path)
                                                     if m.split(".")[0] == "simulator")
                 for path in (ROOT / "scaler").rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_scaler_imports_no_sim_extra_module_at_all() -> None:
    offenders = {str(path.relative_to(ROOT)): sorted(m for m in _imported_modules(path) if m.split(".")[0] in SIM_ONLY)
                 for path in (ROOT / "scaler").rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_core_dependencies_leave_the_sim_modules_to_the_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    sim = " ".join(project["optional-dependencies"]["sim"])
    for module in SIM_ONLY:
        assert module not in core, f"{module} is a core dependency; the scaler does not need it"
        assert module in sim, f"{module} is missing from the sim extra"
    named = {re.split(r"[<>=!~\[ ]", spec, maxsplit=1)[0] for spec in project["optional-dependencies"]["sim"]}
    assert named == set(SIM_ONLY), "leadscale.cli.SIM_EXTRA_MODULES and pyproject's sim extra differ"


def test_live_path_runs_without_the_sim_extra() -> None:
    result = _run_without_sim_extra("""
        import scaler.service, scaler.evaluator, scaler.sources.prometheus, scaler.kube.client
        from scaler.metadata import parse_metadata
        config = parse_metadata({"prometheusAddress": "http://127.0.0.1:9090", "model": "m",
                                 "profile": "h100-llama3-8b"})
        assert config.capacity.prefill_tokens_per_s > 0, config
        from leadscale.cli import main
        try:
            main(["serve", "--help"])
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        print("scaler ok")
    """)
    assert result.returncode == 0, result.stderr
    assert "scaler ok" in result.stdout
    assert "--tls-cert" in result.stdout


def test_simulator_command_without_the_extra_names_what_to_install(tmp_path) -> None:
    result = _run_without_sim_extra(f"""
        import sys
        from leadscale.cli import main
        sys.exit(main(["simulate", "--duration", "30", "--replicas", "1", "--out", {str(tmp_path)!r}]))
    """)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert "pip install 'leadscale[sim]'" in result.stderr
    assert any(f"'{m}'" in result.stderr for m in SIM_ONLY), result.stderr


def _package_imports(path) -> set[str]:
    """Every ``scaler``/``simulator`` module ``path`` imports, lazily (in a function) or not."""
    found = set()
    for name in _imported_modules(path):
        if name.split(".")[0] in ("scaler", "simulator"):
            found.add(name)
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # ``from simulator import oracle`` names a module too
        if isinstance(node, ast.ImportFrom) and node.module in ("scaler", "simulator") and node.level == 0:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_import_cycles_in_the_packages() -> None:
    """A cycle, even one hidden behind a function-level import, is a design knot (autoscale <-> engine_backend)."""
    modules = {}
    for package in ("scaler", "simulator"):
        for path in (ROOT / package).rglob("*.py"):
            if "_proto" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    graph = {name: {m for m in _package_imports(path) if m in modules and m != name}
             for name, path in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            cycle = visit(name)
            assert cycle is None, " -> ".join(cycle)
