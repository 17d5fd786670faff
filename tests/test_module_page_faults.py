"""What `gpuwise.from_module` answers of the host allocator's page faults (what
benchmarks/validate_modules.py compares through the public API): the bytes faulted in per
pass, and the seconds of the estimate they are (none without a time estimate)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import module_zoo  # noqa: E402  (tests/ is on sys.path under pytest)

import gpuwise  # noqa: E402
from gpuwise.estimate.traced_module import heap_faults  # noqa: E402


def test_page_fault_bytes_are_the_traced_heaps_replayed():
    est = gpuwise.from_module(module_zoo.small_cnn(), (8, 3, 32, 32), training=True,
                              optimizer="sgd", on="h100-sxm")
    assert est.page_fault_bytes == sum(heap_faults(est.traced, "sgd").values())
    assert est.page_fault_bytes >= 0


def test_page_fault_seconds_are_the_fault_rows_of_the_time():
    est = gpuwise.from_module(module_zoo.small_cnn(), (8, 3, 32, 32), on="h100-sxm")
    rows = [t for t in est.time.forward.ops if t.op.kind == "faults"]
    assert est.page_fault_s == sum(t.seconds for t in rows)  # none charged on a GPU: 0
    assert est.page_fault_s <= est.seconds
