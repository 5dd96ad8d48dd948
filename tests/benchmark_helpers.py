"""The benchmark scripts as modules, for the tests that call their functions (``benchmarks/`` is not a
package: each script runs as ``python benchmarks/NAME.py``)."""

import importlib.util
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str = "weight_models"):
    """``benchmarks/NAME.py``, loaded under its own module name (not run: its ``main`` is not called)."""
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
