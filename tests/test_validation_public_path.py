"""Validations go through the public path (issue 37, item 4): every benchmarks/validate_*.py
takes its estimates from a command (benchmarks/public_cli.py) or the public Python API
(`gpuwise.from_module`, ...), never from the estimators, the rates, the fitters or a private
name, so what they check is what users run. Read from each script's syntax tree: its imports,
and `gpuwise.X` attributes not in the public API."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import gpuwise

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
VALIDATIONS = sorted(BENCHMARKS.glob("validate_*.py"))

# Scripts of others not converted yet: their owners remove their entry when they are.
BEING_CONVERTED = {
}
# Imports a converted script still makes, each with why the public path cannot give it yet.
STILL_NEEDED = {
    ("validate_published_memory.py", "gpuwise.estimate.memory.serving_runtimes.vllm_pool"):
        "vLLM V0 entries: `infer --runtime vllm` has no per-GPU memory under --tp nor vLLM "
        "V0's CUDA graphs outside the budget",
    ("validate_published_memory.py", "gpuwise.workload.from_config"):
        "the architecture of those vLLM entries",
    ("validate_published_memory.py", "gpuwise.workload.Architecture"): "a type hint of it",
}

# Modules a validation may not import from: the estimators, the views and the command line
# (commands run through public_cli), and the probe's rates, runs and store (the probe is run
# and loaded as users' is: `gpuwise probe`, then `--on local`).
DENIED_MODULES = ("gpuwise.estimate", "gpuwise.report", "gpuwise.cli",
                  "gpuwise.measure.probe.rates_source", "gpuwise.measure.probe.machine",
                  "gpuwise.measure.probe.store", "gpuwise.measure.probe.trusted")
# Of the use-case and workload layers, only measurement helpers and the plans (data).
ALLOWED_FROM = {
    "gpuwise.app.validate": {"plan_kwargs", "machine_vs_probe", "MEMORY_PASSES", "LIVE_ALLOCATOR"},
    "gpuwise.workload.plans": {"InferencePlan", "TrainingPlan"},
}
GUARDED_PACKAGES = ("gpuwise.app", "gpuwise.workload")
DENIED_NAMES = {"rates_from_spec", "rates_for", "profile_rates", "rates_from_measurements",
                "rates_from_timings", "DeviceRates", "Profile", "probe_machine",
                "probe_llama_cpp", "save_profile", "load_profile", "local_profile"}
ESTIMATOR = re.compile(r"^estimate_|(^|_)fit(s|ted|ter|ters)?($|_)")


def _under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def why_not(module: str, name: str | None) -> str | None:
    """Why importing `name` from `module` (or the module itself) bypasses the public path;
    None where it does not."""
    if not _under(module, ("gpuwise",)):
        return None
    parts = module.split(".")
    if any(p.startswith("_") for p in parts) or (name or "").startswith("_"):
        return "a private name"
    if any(ESTIMATOR.search(p) for p in parts[1:]):
        return "a fitter's module"
    if _under(module, DENIED_MODULES):
        return "the estimators, views, command line or probe internals"
    if name is not None and (name in DENIED_NAMES or ESTIMATOR.search(name)):
        return "rates, a fitter or an estimator"
    if _under(module, GUARDED_PACKAGES) and name not in ALLOWED_FROM.get(module, set()):
        return "the use-case or workload layer (only measurement helpers and plans)"
    return None


def gpuwise_imports(tree: ast.AST) -> list[tuple[str, str | None, int]]:
    """(module, name or None for `import module`, line) of every gpuwise import, and of every
    `gpuwise.X` attribute outside the public API."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.module, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "gpuwise" and node.attr not in gpuwise.__all__):
            found.append(("gpuwise." + node.attr, None, node.lineno))
    return found


def bypasses(path: Path) -> list[str]:
    """Each import of the script that bypasses the public path, with why."""
    out = []
    for module, name, line in gpuwise_imports(ast.parse(path.read_text(), str(path))):
        full = f"{module}.{name}" if name else module
        reason = why_not(module, name)
        if reason and (path.name, full) not in STILL_NEEDED:
            out.append(f"{path.name}:{line}: {full}: {reason}")
    return out


@pytest.mark.parametrize("path", VALIDATIONS, ids=lambda p: p.name)
def test_validation_estimates_through_the_public_path(path: Path) -> None:
    if path.name in BEING_CONVERTED:
        pytest.skip(f"{path.name}: {BEING_CONVERTED[path.name]}")
    assert not bypasses(path)
    imported = {m for m, _, _ in gpuwise_imports(ast.parse(path.read_text()))}
    assert imported & {"public_cli", "gpuwise"} or any(m.startswith("validate_") for m in imported)


def test_the_lists_name_only_scripts_that_exist() -> None:
    names = {p.name for p in VALIDATIONS}
    assert set(BEING_CONVERTED) <= names
    assert {script for script, _ in STILL_NEEDED} <= names


@pytest.mark.parametrize("source, caught", [
    ("from gpuwise.estimate.speed.device_rates import rates_from_spec", True),
    ("from gpuwise.measure.probe.rates_source import rates_for", True),
    ("from gpuwise.measure.llama_cpp.fit import llama_arch", True),
    ("from gpuwise.measure.probe.run import _private", True),
    ("from gpuwise.app.infer import infer", True),
    ("from gpuwise.workload import from_config", True),
    ("import gpuwise.estimate.memory.inference", True),
    ("import gpuwise\ngpuwise.estimate", True),
    ("from gpuwise.measure.runs import time_run", False),
    ("from gpuwise.catalog import resolve_model", False),
    ("from gpuwise.app.validate import plan_kwargs", False),
    ("import gpuwise\ngpuwise.from_module", False),
    ("from public_cli import gpuwise_json", False),
])
def test_the_check_catches_what_bypasses(tmp_path: Path, source: str, caught: bool) -> None:
    path = tmp_path / "validate_x.py"
    path.write_text(source + "\n")
    assert bool(bypasses(path)) is caught
