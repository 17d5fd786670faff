"""A runtime is one unit (issue 38 item 2; docs/architecture.md, "Runtimes"): every
catalogue runtime has a unit in estimate/runtimes/, and no module outside that folder
compares runtime names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpuwise.catalog.runtime_speed import RUNTIME_IDS
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.runtimes import ignored_options, runtime_unit, runtime_units
from gpuwise.workload.plans import InferencePlan

ROOT = Path(__file__).resolve().parents[1] / "gpuwise"
UNITS_DIR = ROOT / "estimate" / "runtimes"


def test_every_catalogue_runtime_has_one_unit_and_the_units_no_other():
    assert set(runtime_units()) == set(RUNTIME_IDS)
    for name, unit in runtime_units().items():
        assert unit.speed.id == name  # its time constants
        assert unit.scheduler.policy  # its scheduler


def _names_compared(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each runtime name a comparison tests against."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            found += [(node.lineno, v.value) for v in values
                      if isinstance(v, ast.Constant) and v.value in RUNTIME_IDS]
    return found


def test_no_module_outside_the_units_compares_runtime_names():
    offenders = []
    for path in ROOT.rglob("*.py"):
        if UNITS_DIR in path.parents:
            continue
        for line, name in _names_compared(ast.parse(path.read_text())):
            offenders.append(f"{path.relative_to(ROOT)}:{line} compares with {name!r}")
    assert not offenders, "ask estimate/runtimes/ instead:\n" + "\n".join(offenders)


def test_the_scan_finds_a_comparison():
    tree = ast.parse('if plan.runtime == "llama.cpp" or rt in ("vllm", "x"):\n    pass\n')
    assert [n for _, n in _names_compared(tree)] == ["llama.cpp", "vllm"]


def test_an_option_the_runtime_does_not_read_is_said_to_be_ignored():
    plan = InferencePlan(runtime="vllm", threads=8, context_alloc=4096)
    notes = ignored_options(plan)
    assert any(n.startswith("--threads applies to llama.cpp; ignored under vllm") for n in notes)
    assert not any("--ctx" in n for n in notes)  # vLLM reads --ctx (--max-model-len)
    # SGLang has its own memory rules (mem_fraction_static), no "memory as ..." note
    assert not any("memory as" in n for n in ignored_options(InferencePlan(runtime="sglang")))
    assert any("memory as transformers'" in n
               for n in ignored_options(InferencePlan(runtime="compiled")))


def test_an_unknown_runtime_gets_did_you_mean():
    with pytest.raises(GpuwiseError) as err:
        runtime_unit("vlm")
    assert "did you mean 'vllm'" in err.value.hint
