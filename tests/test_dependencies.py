"""Dependency hygiene: every import in the project's code (zoo/, dws/, pipelines/, cli.py, read with
``ast``) names the standard library, the project itself or a package pyproject.toml declares; a
package declared only by an optional extra is imported lazily (inside a function) or under
``try/except ImportError``, and such a guard's own error names the package; the lock (constraints.txt)
pins every declared package, within its range, and torch's CPU build only."""

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "zoo", ROOT / "dws", ROOT / "pipelines", ROOT / "cli.py"]
FIRST_PARTY = {"zoo", "dws", "pipelines", "cli"}
IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
REQUIRED = [Requirement(r) for r in PROJECT["dependencies"]]
OPTIONAL = {extra: [Requirement(r) for r in reqs] for extra, reqs in PROJECT.get("optional-dependencies", {}).items()}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


REQUIRED_NAMES = {_norm(r.name) for r in REQUIRED}
EXTRAS_OF = {}  # distribution -> the extras declaring it
for _extra, _reqs in OPTIONAL.items():
    for _r in _reqs:
        EXTRAS_OF.setdefault(_norm(_r.name), []).append(_extra)


def _source_files():
    for source in SOURCES:
        yield from sorted(source.rglob("*.py")) if source.is_dir() else [source]


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in IMPORT_ERRORS or isinstance(t, ast.Attribute) and t.attr in IMPORT_ERRORS
               for t in types)


def _imports(path: Path):
    """(top-level module, line, where, guarding try) for every absolute import in ``path``; where is
    'module' (runs on import), 'lazy' (inside a function), 'guarded' (try/except ImportError at
    module level) or 'typing' (under ``if TYPE_CHECKING``)."""
    found = []

    def visit(node, where, guard):
        for child in ast.iter_child_nodes(node):
            child_where, child_guard = where, guard
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                child_where = "lazy"
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for part in child.body:
                    visit_one(part, "typing", guard)
                for part in child.orelse:
                    visit_one(part, where, guard)
                continue
            elif isinstance(child, ast.Try) and where == "module" and any(map(_catches_import_error, child.handlers)):
                for part in child.body:
                    visit_one(part, "guarded", child)
                for part in [*child.handlers, *child.orelse, *child.finalbody]:
                    visit_one(part, where, guard)
                continue
            visit_one(child, child_where, child_guard)

    def visit_one(node, where, guard):
        if isinstance(node, ast.Import):
            found.extend((alias.name.split(".")[0], node.lineno, where, guard) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno, where, guard))
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
              and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("import_module", "__import__")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and not node.args[0].value.startswith(".")):
            found.append((node.args[0].value.split(".")[0], node.lineno, "lazy" if where == "module" else where, guard))
        visit(node, where, guard)

    visit(ast.parse(path.read_text(), filename=str(path)), "module", None)
    return found


PACKAGES = importlib.metadata.packages_distributions()


def _distributions(module: str) -> list[str]:
    """The distributions providing import name ``module`` (the declared one first); a module that
    nothing installed provides counts as the distribution of its own name."""
    dists = [_norm(d) for d in PACKAGES.get(module, [])] or [_norm(module)]
    return sorted(dists, key=lambda d: (d not in REQUIRED_NAMES and d not in EXTRAS_OF, d))


def _third_party_imports():
    for path in _source_files():
        for module, line, where, guard in _imports(path):
            if module in sys.stdlib_module_names or module in FIRST_PARTY:
                continue
            yield path.relative_to(ROOT), module, line, where, guard


def test_the_reader_sees_every_kind_of_import():
    imports = {(m, w) for _, m, _, w, _ in _third_party_imports()}
    assert ("torch", "module") in imports  # plain top-level imports are read
    assert any(w == "lazy" for _, w in imports)  # and function-level ones
    assert len({m for m, _ in imports}) >= 10


def test_every_import_is_declared_in_pyproject():
    undeclared = []
    for path, module, line, _, _ in _third_party_imports():
        dist = _distributions(module)[0]
        if dist not in REQUIRED_NAMES and dist not in EXTRAS_OF:
            undeclared.append(f"{path}:{line}: import {module} (distribution {dist})")
    assert not undeclared, ("imports of packages pyproject.toml does not declare (add them to [project] "
                            "dependencies, or to an extra and import them lazily):\n" + "\n".join(undeclared))


def test_optional_packages_are_imported_lazily_or_guarded():
    eager = []
    for path, module, line, where, _ in _third_party_imports():
        dist = _distributions(module)[0]
        if dist in EXTRAS_OF and dist not in REQUIRED_NAMES and where == "module":
            eager.append(f"{path}:{line}: import {module} (only in extra {EXTRAS_OF[dist]}) runs on import")
    assert not eager, ("a package of an optional extra imported at module level: import it inside the function "
                       "that needs it, or under try/except ImportError:\n" + "\n".join(eager))


def test_an_import_guards_own_error_names_the_package():
    """A guard either falls back (e.g. ``triton = None``) or raises an error that names the package."""
    silent = []
    for path, module, line, where, guard in _third_party_imports():
        if where != "guarded":
            continue
        for handler in guard.handlers:
            for node in ast.walk(handler):
                if isinstance(node, ast.Raise) and node.exc is not None:
                    text = " ".join(str(c.value) for c in ast.walk(node.exc) if isinstance(c, ast.Constant))
                    if not any(name.lower() in text.lower() for name in {module, *_distributions(module)}):
                        silent.append(f"{path}:{node.lineno}: the error raised when {module} is missing does not name it")
    assert not silent, "\n".join(silent)


def _guarded_modules():
    modules = {}
    for path, module, _, where, _ in _third_party_imports():
        if where == "guarded":
            dotted = ".".join(path.with_suffix("").parts)
            modules.setdefault(dotted.removesuffix(".__init__"), set()).add(module)
    return sorted(modules.items())


@pytest.mark.parametrize("module, missing", _guarded_modules(), ids=lambda v: v if isinstance(v, str) else "+".join(sorted(v)))
def test_a_module_with_guarded_imports_imports_without_those_packages(module, missing):
    """Each optional package blocked (``sys.modules[name] = None`` makes its import raise ImportError),
    the module still imports."""
    code = f"import sys\nfor name in {sorted(missing)!r}: sys.modules[name] = None\nimport {module}\n"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{module} fails to import without {sorted(missing)}:\n{run.stderr[-2000:]}"


# ---- the lock ----------------------------------------------------------------------------------

LOCK = ROOT / "constraints.txt"


def _lock_pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if match:
            pins[_norm(match.group(1))] = match.group(2)
    return pins


def test_the_lock_pins_every_declared_package_within_its_range():
    pins = _lock_pins()
    env = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "python_version": "3.11", "implementation_name": "cpython"}
    problems = []
    for extra, reqs in [("", REQUIRED), *OPTIONAL.items()]:
        for req in reqs:
            if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
                continue
            name = _norm(req.name)
            if name not in pins:
                problems.append(f"{req} (extra {extra!r}) is not in constraints.txt: run `make lock`")
            elif not req.specifier.contains(Version(pins[name]), prereleases=True):
                problems.append(f"constraints.txt pins {name}=={pins[name]}, outside {req}: run `make lock`")
    assert not problems, "\n".join(problems)


def test_the_lock_pins_torchs_cpu_build_and_no_cuda_package():
    pins = _lock_pins()
    assert pins["torch"].endswith("+cpu"), pins["torch"]
    assert len(pins) > 50  # every transitive package, not a few top-level pins
    cuda = sorted(name for name in pins if name.startswith(("nvidia-", "cuda-")))
    assert not cuda, f"CUDA packages in the lock (torch's CUDA build?): {cuda}"
    assert "make lock" in LOCK.read_text().splitlines()[1]  # the header says how to regenerate it


def test_make_demo_installs_the_project_without_the_dev_extra():
    """``make demo`` installs what the demo runs, not the dev extra (pytest, moto, s3fs, boto3, triton:
    the packages that made pip's resolver backtrack for minutes); ``make test`` installs the dev extra."""
    makefile = (ROOT / "Makefile").read_text()
    demo_prerequisite = re.search(r"^demo: (\S+)", makefile, re.M).group(1)
    test_prerequisite = re.search(r"^test: (\S+)", makefile, re.M).group(1)

    def recipe(target: str) -> str:
        return re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)

    assert "-e ." in recipe(demo_prerequisite) and "[dev]" not in recipe(demo_prerequisite)
    assert '-e ".[dev]"' in recipe(test_prerequisite)
    assert "-c constraints.txt" in recipe(demo_prerequisite) and "-c constraints.txt" in recipe(test_prerequisite)
