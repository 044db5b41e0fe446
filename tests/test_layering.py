"""Import layering: the operator module is no toolbox, and the product imports no dev tools.

Every import in the product's source is read with ``ast`` (module level and inside functions
alike), so an import that only runs at task time is caught as well.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from helpers import ROOT

INCLUDE = ROOT / "include"
PACKAGE = INCLUDE / "replayable"

OPERATORS = "replayable.airflow.operators"
# Only DAG files reach the operator module, through the package's lazy exports; a helper a
# product module needs lives with the concept it belongs to (ADR 0090).
OPERATOR_IMPORTERS = {
    "replayable": "exports IdempotentStageOperator to DAG files, loaded lazily",
    "replayable.airflow.dag_factory": "pipeline_dag builds a DAG of stage operators",
}

# The development tooling lives in devtools/, outside the package the wheel ships: it
# assumes a source checkout and imports the dev-only pgserver. No product module imports it.
DEV_TOOLS = ("devtools", "pgserver")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(path: Path, module: str) -> Iterator[str]:
    """Every module name ``path`` imports, relative imports resolved, with each name imported."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base
            # `from replayable import operators` imports the module through its package.
            yield from (f"{base}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value


def _imports(path: Path, module: str, target: str) -> bool:
    return any(name == target or name.startswith(f"{target}.") for name in _imported(path, module))


def _package_modules() -> dict[str, Path]:
    return {_module_name(path, INCLUDE): path for path in sorted(PACKAGE.rglob("*.py"))}


def _product_modules() -> dict[str, Path]:
    """The package (dev tools aside), the DAG files and the plugin: what a deployment runs."""
    modules = dict(_package_modules())
    for folder in ("dags", "plugins"):
        for path in sorted((ROOT / folder).glob("*.py")):
            modules[f"{folder}/{path.name}"] = path
    return modules


def test_the_walk_sees_the_package_and_its_imports():
    """The walk itself finds modules and resolves imports, so an empty result means clean."""
    modules = _package_modules()
    expected = {"replayable", OPERATORS, "replayable.airflow.hooks", "replayable.web.app"}
    assert expected <= set(modules)
    tasks = "replayable.airflow.tasks.common"
    assert _imports(modules[tasks], tasks, "replayable.db")
    assert _imports(modules["replayable"], "replayable", OPERATORS)


def test_only_the_dag_facing_exports_import_the_operator_module():
    importers = {
        name
        for name, path in _package_modules().items()
        if name != OPERATORS and _imports(path, name, OPERATORS)
    }
    offenders = sorted(importers - OPERATOR_IMPORTERS.keys())
    assert not offenders, (
        f"{offenders} import from {OPERATORS}: move the helper to the module that owns its "
        "concept (hooks read connections, context.py reads the task context; ADR 0090)"
    )
    assert importers == OPERATOR_IMPORTERS.keys(), "an allowed importer no longer imports it"


def test_no_product_module_imports_the_dev_tools():
    found = {
        (name, tool)
        for name, path in _product_modules().items()
        for tool in DEV_TOOLS
        if _imports(path, name, tool)
    }
    assert not found, f"product modules import dev tooling: {sorted(found)}"


def test_the_dev_tools_live_outside_the_package():
    assert not (PACKAGE / "devenv.py").exists()
    assert not (PACKAGE / "provider").exists()
    assert (ROOT / "devtools" / "devenv" / "__init__.py").exists()


# The Airflow-free core is a folder rule: every module outside the Airflow face
# (replayable/airflow/) and the UI (replayable/web/) loads without Airflow, in a fresh
# interpreter: the CLI starts fast, and the core runs (and is tested) without Airflow's import
# cost or context. The read side (search/, cli/) reads a connection through a hook only when
# it needs one. make lint checks the same as import contracts (pyproject.toml, ADR 0155).
AIRFLOW_FACES = ("replayable.airflow", "replayable.web")


def _airflow_free() -> list[str]:
    return [
        name
        for name in _package_modules()
        if name != "replayable"
        and not any(name == face or name.startswith(f"{face}.") for face in AIRFLOW_FACES)
    ]


def test_every_module_outside_the_airflow_face_loads_without_airflow():
    probe = (
        "import importlib, json, sys\n"
        "found = {}\n"
        f"for name in {_airflow_free()!r}:\n"
        "    importlib.import_module(name)\n"
        "    if 'airflow' in sys.modules:\n"
        "        found[name] = True\n"
        "        break\n"
        "print(json.dumps(found))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(INCLUDE)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout) == {}, f"the first of these to load Airflow: {done.stdout}"
