"""The house keeps its shape: the import graph of the product's packages has no cycle, no module
imports from a layer above its own, no job imports another job, only the lake package imports
deltalake on the Spark side, the broker never imports pyspark, and no module imports a private
(``_``) name of another. See docs/architecture.md."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("schemas", "broker_model", "jobs")

# Layers from the ground up: a module may import from its own layer and the layers below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("schemas",),
    ("broker_model.common",),
    ("broker_model.store",),
    ("broker_model.broker",),
    ("broker_model.client",),
    ("broker_model.endpoint",),
    ("broker_model.tools",),
    ("broker_model",),
    ("jobs.lake",),
    ("jobs.rules", "jobs.runs", "jobs.cli", "jobs.extract", "jobs.log_chains", "jobs.hours"),
    (
        "jobs.rebuild_consume_queue",
        "jobs.consumer_offsets",
        "jobs.resolve_transactions",
        "jobs.dlq",
        "jobs.replay",
        "jobs.compact_commitlog",
        "jobs.report",
        "jobs.reset_offsets",
    ),
    ("jobs.nightly", "jobs.shell"),
    ("jobs",),
)
JOBS = LAYERS[-3]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports_of(path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported name, line) of every import in ``path``, function-level ones included: a lazy
    import hides a cycle from the interpreter, not from this test. ``from package import module``
    names the module; ``from package import name`` names the package."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield (submodule if submodule in modules else node.module), node.lineno


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the longest prefix naming ``module``'s layer."""
    best, rank = -1, -1
    for index, members in enumerate(LAYERS):
        for member in members:
            if (module == member or module.startswith(member + ".")) and len(member) > best:
                best, rank = len(member), index
    assert rank >= 0, f"module {module} is in no layer: add it to LAYERS"
    return rank


def job_of(module: str) -> str | None:
    return next((job for job in JOBS if module == job or module.startswith(job + ".")), None)


def graph() -> dict[str, set[str]]:
    modules = product_modules()
    return {
        name: {imported for imported, _ in imports_of(path, modules) if imported in modules}
        for name, path in modules.items()
    }


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``edges`` (its modules, the first repeated at the end), None without."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)) is not None:
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(edges):
        if module not in state and (found := visit(module)) is not None:
            return found
    return None


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in edges.items()
        for target in targets
        if layer_of(target) > layer_of(module)
    ]


def borrowed_jobs(edges: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} imports {target}"
        for module, targets in edges.items()
        for target in targets
        if job_of(module) and job_of(target) and job_of(module) != job_of(target)
    ]


def test_the_import_graph_has_no_cycle() -> None:
    assert find_cycle(graph()) is None


def test_no_module_imports_from_a_higher_layer() -> None:
    assert upward_imports(graph()) == []


def test_no_job_imports_another_job() -> None:
    assert borrowed_jobs(graph()) == []


def private_imports(paths: dict[str, Path]) -> list[str]:
    """Every ``from <product module> import _name`` in ``paths`` (module name -> file): a name another
    module uses is public, so it carries no underscore."""
    found = []
    for name, path in sorted(paths.items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                found += [
                    f"{name}:{node.lineno} imports {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_")
                ]
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    users = {**product_modules(), **{f"tests.{p.stem}": p for p in (ROOT / "tests").glob("*.py")}}
    users.update({f"benchmarks.{p.stem}": p for p in (ROOT / "benchmarks").glob("*.py")})
    assert private_imports(users) == []


def test_the_checks_find_what_they_look_for() -> None:
    """Hand-built graphs: a lazy cycle between broker and schedule (as the broker once had), an
    upward import from the catalog, and a job borrowing from another."""
    cycle = {
        "broker_model.broker.controller": {"broker_model.broker.schedule"},
        "broker_model.broker.schedule": {"broker_model.broker.controller"},
    }
    assert find_cycle(cycle) == [
        "broker_model.broker.controller",
        "broker_model.broker.schedule",
        "broker_model.broker.controller",
    ]
    assert upward_imports({"schemas.catalog": {"broker_model.common.errors"}}) != []
    assert upward_imports({"jobs.replay.job": {"jobs.lake.facade"}}) == []
    assert borrowed_jobs({"jobs.dlq.inspect": {"jobs.consumer_offsets"}}) == [
        "jobs.dlq.inspect imports jobs.consumer_offsets"
    ]
    assert borrowed_jobs({"jobs.dlq.inspect": {"jobs.dlq.transforms"}}) == []


def test_the_private_import_check_finds_one(tmp_path: Path) -> None:
    module = tmp_path / "user.py"
    module.write_text("from jobs.replay.config import _now, build_config\nfrom os import _exit\n")
    assert private_imports({"user": module}) == ["user:1 imports jobs.replay.config._now"]


def test_only_the_lake_package_imports_deltalake_on_the_spark_side() -> None:
    modules = product_modules()
    outside = [
        f"{name}:{line} imports {imported}"
        for name, path in modules.items()
        if name.startswith("jobs") and not name.startswith("jobs.lake")
        for imported, line in imports_of(path, modules)
        if imported.split(".")[0] in ("deltalake", "delta")
    ]
    assert outside == []


def test_the_broker_never_imports_pyspark_or_the_jobs() -> None:
    modules = product_modules()
    found = [
        f"{name}:{line} imports {imported}"
        for name, path in modules.items()
        if name.startswith(("broker_model", "schemas")) and name != "schemas.catalog"
        for imported, line in imports_of(path, modules)
        if imported.split(".")[0] in ("pyspark", "jobs")
    ]
    assert found == []


def test_the_distribution_holds_every_package() -> None:
    """``pip install .`` (a wheel, not an editable install) ships every package of the product:
    the setuptools package list of pyproject.toml finds each directory with an ``__init__.py``."""
    import tomllib

    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = set(find_packages(str(ROOT), include=config["include"]))
    expected = {module_name(init) for package in PACKAGES for init in (ROOT / package).rglob("__init__.py")}
    assert expected <= found and not any(name.startswith(("tests", "benchmarks")) for name in found)
