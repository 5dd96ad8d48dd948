"""The project's import structure (docs/architecture.md): no import cycle between its modules, and
packages import only packages of their own or a lower layer.

The graph is read from the source with ``ast`` (nothing is imported), counting every import
statement, also those inside functions: a lazy import still ties two modules together.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("zoo", "dws", "pipelines", "benchmarks", "cli.py")

# Lowest first. A module belongs to the package of the longest prefix that names it; it may import
# modules of its own layer and of lower layers, never of a higher one. A new package is one new entry
# (e.g. "zoo.train" sits between "zoo.fit", whose Adam it uses, and "zoo.store").
LAYERS: tuple[tuple[str, ...], ...] = (
    ("zoo", "zoo.options", "zoo.devices", "zoo.cpuinfo", "zoo.cbuild"),  # utilities (and the empty `zoo` package)
    ("zoo.sources",),  # data sets and signals
    ("zoo.fit",),  # batched SIREN fitting
    ("zoo.train",),  # batched classifier training (uses the fitting's Adam and seeding)
    ("zoo.store",),  # the weight-store format: writing, reading, statistics
    ("zoo.generate", "zoo.exchange"),  # zoo kinds and the generation run (local or Ray); import/export beside it
    ("zoo.inspect",),  # `zoo info` / `zoo show`
    ("dws.weightspace",),  # the weight-space value and its symmetry group
    ("dws.stream",),  # stores -> batches of weight spaces (normalization, augmentation)
    ("dws.ops",),  # tensor operations the model families share (linear maps as 1x1 convolutions)
    ("dws.nn", "dws", "dws.nfn", "dws.ng", "dws.scalegmn"),  # DWSNet layers and models (`dws` re-exports them);
    # NFN-NP/HNP, the neural graphs and ScaleGMN beside them
    ("dws.baselines",),  # the paper's baselines (alignment derives its training store)
    ("dws.canonical",),  # canonical forms under the symmetries, as store transforms (`zoo derive`)
    ("dws.tasks",),  # training and evaluation on stores: options, tasks, run directories, launching
    ("pipelines",),  # one command per paper result
    ("cli", "benchmarks"),  # entry points
)


def modules_under(root: Path, sources) -> dict[str, Path]:
    """``{dotted module name: file}`` of the Python files in ``sources`` (folders or files) under ``root``."""
    modules = {}
    for source in sources:
        path = root / source
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            parts = list(file.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = file
    return modules


def project_modules() -> dict[str, Path]:
    return modules_under(ROOT, SOURCES)


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The absolute module names an import statement names (with ``from a import b``: ``a.b`` too)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative: resolve against the importing module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = package[: len(package) - (node.level - 1)]
        stem = ".".join(base + ([node.module] if node.module else []))
    else:
        stem = node.module
    return [stem] + [f"{stem}.{alias.name}" for alias in node.names]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """``{module: project modules it imports}``."""

    def resolve(name: str) -> str | None:  # the longest prefix of ``name`` that is a project module
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            if ".".join(parts[:k]) in modules:
                return ".".join(parts[:k])
        return None

    graph = {}
    for module, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = _imported(node, module, path.name == "__init__.py")
                if isinstance(node, ast.ImportFrom):  # `from a import b`: module a.b if it is one, else a
                    targets = [n for n in names[1:] if n in modules] or names[:1]
                else:
                    targets = names
                edges |= {t for t in map(resolve, targets) if t is not None and t != module}
        graph[module] = edges
    return graph


def layer_of(module: str, layers=LAYERS) -> tuple[int, str]:
    """(layer index, package) of the longest declared package that is ``module`` or contains it."""
    best = None
    for index, packages in enumerate(layers):
        for package in packages:
            if module == package or module.startswith(package + "."):
                if best is None or len(package) > len(best[1]):
                    best = (index, package)
    if best is None:
        raise LookupError(f"{module} belongs to no package of LAYERS; declare its package there")
    return best


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return exc.args[1]
    return None


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    bad = []
    for module, imports in sorted(graph.items()):
        here, package = layer_of(module, layers)
        for target in sorted(imports):
            there, other = layer_of(target, layers)
            if there > here:
                bad.append(f"{module} ({package}, layer {here}) imports {target} ({other}, layer {there})")
    return bad


# ------------------------------------------------------------------------------------------ the project
def test_the_project_has_no_import_cycle():
    cycle = find_cycle(import_graph(project_modules()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_belongs_to_a_declared_layer():
    for module in project_modules():
        layer_of(module)  # raises for an undeclared package


def test_no_package_imports_a_higher_layer():
    assert upward_imports(import_graph(project_modules())) == []


def test_the_cli_and_the_train_options_load_no_torch():
    """``zoo --help`` stays fast: the CLI reads its train choices and defaults from
    ``dws.tasks.options`` without importing PyTorch (the commands import it when they run)."""
    code = "import sys, cli, dws.tasks.options; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------- the checks catch what they should
def _graph_of(root: Path, files: dict[str, str]) -> dict[str, set[str]]:
    """The import graph of a small project made of ``files`` (path: source) under ``root``."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return import_graph(modules_under(root, [p.name for p in root.iterdir()]))


def test_a_cycle_through_a_lazy_import_is_found(tmp_path):
    """As in dws/tasks before issue 16: run.py imported distributed.py inside a function."""
    run = "from .trainer import train\n\ndef go():\n    from .distributed import spread\n"
    graph = _graph_of(tmp_path, {"pkg/__init__.py": "", "pkg/run.py": run, "pkg/trainer.py": "import os\n",
                                 "pkg/distributed.py": "from .run import go\n"})
    assert graph["pkg.run"] == {"pkg.trainer", "pkg.distributed"}
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {"pkg.run", "pkg.distributed"}
    del graph["pkg.distributed"]
    assert find_cycle(graph) is None


def test_an_upward_import_is_found(tmp_path):
    graph = _graph_of(tmp_path, {"low/__init__.py": "", "low/a.py": "import high.b\n", "low/c.py": "",
                                 "high/__init__.py": "", "high/b.py": "from low import c\nfrom low.a import x\n"})
    assert graph["high.b"] == {"low.c", "low.a"}
    layers = (("low",), ("high",))
    assert upward_imports(graph, layers) == ["low.a (low, layer 0) imports high.b (high, layer 1)"]
    assert upward_imports(graph, (("low", "high"),)) == []  # one layer: both ways allowed
    with pytest.raises(LookupError, match="declare"):
        layer_of("elsewhere.x", layers)
