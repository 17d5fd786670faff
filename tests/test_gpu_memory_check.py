"""The GPU memory check (benchmarks/gpu_memory_check.py, issue 24) without a GPU: the largest
batch search driven by a fake try, nvidia-smi's output read, the device matched from the GPU
name, and `compare` on a hand-written record with the estimates really computed; `measure`
end to end with its child process and nvidia-smi replaced."""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.estimate import InferencePlan, TrainingPlan
from gpuwise.estimate.memory import fits
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.estimate.runtimes import estimate_inference
from gpuwise.workload import from_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_memory_check as check  # noqa: E402
import gpu_memory_child as child  # noqa: E402
from batch_search import is_out_of_memory, largest_batch  # noqa: E402
from gpu_memory_child import (  # noqa: E402
    MIB,
    parse_compute_apps,
    parse_gpu_query,
    process_memory,
)

H100_NAME, H100_MIB = "NVIDIA H100 80GB HBM3", 81559  # as nvidia-smi names and sizes it
H100 = find_hardware("h100-sxm")
INFER = InferencePlan(batch=2, prompt_tokens=512, new_tokens=32, weights="bf16")
TRAIN = TrainingPlan(batch=1, seq=2048, dtype="mixed-bf16", optimizer="adamw")


def _threshold_try(largest: int, calls: list[int] | None = None):
    """A try that runs every batch up to `largest` and runs out of memory above it."""

    def run(batch: int) -> dict:
        if calls is not None:
            calls.append(batch)
        return {"outcome": "ok" if batch <= largest else "oom"}

    return run


# ---------------------------------------------------------------- the largest batch


@pytest.mark.parametrize("largest", [0, 1, 2, 7, 9, 43, 100, 1023])
@pytest.mark.parametrize("start", [1, 9, 40, 500])
def test_the_search_finds_the_threshold_exactly(largest: int, start: int) -> None:
    state = largest_batch(_threshold_try(largest), start, budget_s=1e9)
    assert (state["largest_ok"], state["smallest_failed"]) == (largest, largest + 1)
    assert state["stopped"] == "exact"
    assert [t["batch"] for t in state["tries"]][0] == start


def test_an_exact_estimate_takes_two_tries() -> None:
    calls: list[int] = []
    state = largest_batch(_threshold_try(43, calls), 43, budget_s=1e9)
    assert calls == [43, 44] and state["largest_ok"] == 43


def test_the_step_doubles_away_from_the_start_then_bisects() -> None:
    calls: list[int] = []
    largest_batch(_threshold_try(20, calls), 10, budget_s=1e9)
    assert calls == [10, 11, 13, 17, 25, 21, 19, 20]
    calls.clear()
    largest_batch(_threshold_try(3, calls), 10, budget_s=1e9)
    assert calls == [10, 9, 7, 3, 5, 4]


def test_a_search_out_of_time_keeps_its_bracket() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    def slow_try(batch: int) -> dict:
        now[0] += 10  # each try takes 10 s of the fake clock
        return {"outcome": "ok" if batch <= 12 else "oom"}

    saved: list[int] = []
    state = largest_batch(slow_try, 10, budget_s=25, clock=clock,
                          on_try=lambda s: saved.append(len(s["tries"])))
    assert [t["batch"] for t in state["tries"]] == [10, 11, 13]
    assert (state["largest_ok"], state["smallest_failed"], state["stopped"]) == (11, 13, "budget")
    assert saved == [1, 2, 3]  # the caller saw every try as it came


def test_an_error_that_is_not_out_of_memory_stops_the_search() -> None:
    state = largest_batch(lambda b: {"outcome": "ok" if b < 5 else "error"}, 4, budget_s=1e9)
    assert state["stopped"] == "error" and state["largest_ok"] == 4
    assert state["smallest_failed"] is None


def test_a_search_stops_at_the_cap() -> None:
    state = largest_batch(_threshold_try(10**6), 60, budget_s=1e9, cap=64)
    assert (state["largest_ok"], state["stopped"]) == (64, "cap")


@pytest.mark.parametrize("message, oom", [
    ("real inference run of llama on cuda failed: OutOfMemoryError: CUDA out of memory. "
     "Tried to allocate 2.00 GiB", True),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
     True),
    ("real training run of llama on cuda took longer than 150 s", False),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", False),
])
def test_out_of_memory_is_told_from_other_failures(message: str, oom: bool) -> None:
    assert is_out_of_memory(message) is oom


# ---------------------------------------------------------------- nvidia-smi


def test_compute_apps_rows_are_read_in_mib() -> None:
    rows = parse_compute_apps("4242, 17000\n77, [N/A]\n\nNo running processes found\n")
    assert rows == [(4242, 17000 * MIB), (77, None)]


def test_the_process_row_is_found_by_pid_or_as_the_only_one() -> None:
    rows = [(4242, 17000 * MIB), (77, 500 * MIB)]
    assert process_memory(rows, 4242).used_bytes == 17000 * MIB
    assert "this pid" in process_memory(rows, 4242).how
    only = process_memory([(99999, 1234 * MIB)], 4242)  # a container: the host's pid
    assert only.used_bytes == 1234 * MIB and "only process" in only.how
    assert process_memory(rows, 5).used_bytes is None
    assert process_memory([], 5).used_bytes is None


def test_the_gpu_query_keeps_the_name_and_sizes_in_bytes() -> None:
    gpu = parse_gpu_query(f"{H100_NAME}, {H100_MIB}, 3, 570.86.15\n")
    assert gpu == {"gpu": H100_NAME, "gpu_memory_bytes": H100_MIB * MIB,
                   "gpu_used_bytes": 3 * MIB, "driver": "570.86.15"}
    comma = parse_gpu_query("Vendor GPU, rev 2, 1024, 0, 1.0")  # the name split off from the right
    assert comma is not None and comma["gpu"] == "Vendor GPU, rev 2"
    assert parse_gpu_query("") is None
    assert parse_gpu_query("NVIDIA-SMI has failed because it couldn't communicate") is None


# ---------------------------------------------------------------- the device


@pytest.mark.parametrize("name, mib, device", [
    (H100_NAME, H100_MIB, "h100-sxm"), ("NVIDIA H100 PCIe", 81559, "h100-pcie"),
    ("NVIDIA H200", 143771, "h200-sxm"),
])
def test_the_device_is_matched_from_the_gpu_name(name: str, mib: int, device: str) -> None:
    assert check.device_for({"gpu": name, "gpu_memory_bytes": mib * MIB}).id == device


def test_a_named_device_wins_and_an_unknown_gpu_is_refused() -> None:
    env = {"gpu": H100_NAME, "gpu_memory_bytes": H100_MIB * MIB}
    assert check.device_for(env, "h200").id == "h200-sxm"
    with pytest.raises(ValueError, match="--device"):
        check.device_for({"gpu": "Frobnicator 9000", "gpu_memory_bytes": 0})


# ---------------------------------------------------------------- compare


def _result(reserved: int, allocated: int, smi: int | None, at_end: int) -> dict:
    return {"model_bytes": reserved, "peak_bytes": reserved + 700 * MIB,
            "max_memory_reserved_bytes": reserved, "max_memory_allocated_bytes": allocated,
            "memory_reserved_at_end_bytes": at_end, "smi_used_bytes": smi,
            "smi_how": "nvidia-smi row of this pid", "cuda_total_bytes": 79 * 2**30}


def _row(name: str, plan, **rest) -> dict:
    return {"model": name, "plan": asdict(plan), "kind": type(plan).__name__, **rest}


def _arch(name: str):
    return from_config(resolve_model(name).config, name)


def _measured(tmp_path: Path, train_largest: int) -> Path:
    cases = [_row("qwen2.5-0.5b", INFER, result=_result(2 * 2**30, 2**30, 3 * 2**30, 2**31 - 2**28)),
             _row("llama-3.2-1b", TRAIN, result=_result(30 * 2**30, 25 * 2**30, None, 30 * 2**30)),
             _row("llama-3.2-1b", replace(TRAIN, finetune="qlora"), skipped="no bitsandbytes")]
    searches = [_row("llama-3.2-1b", TRAIN, largest_ok=train_largest,
                     smallest_failed=train_largest + 1, stopped="exact", tries=[{}, {}]),
                _row("llama-3.2-1b", TRAIN, largest_ok=5, smallest_failed=9, stopped="budget",
                     tries=[{}])]
    record = {"environment": {"gpu": H100_NAME, "gpu_memory_bytes": H100_MIB * MIB},
              "cases": cases, "searches": searches}
    path = tmp_path / "gpu_memory.json"
    path.write_text(json.dumps(record))
    return path


def test_compare_sets_the_estimates_against_each_reading(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    record = check.compare(_measured(tmp_path, 7), out=out)
    assert json.loads(out.read_text())["device"] == record["device"] == "h100-sxm"
    infer, train = record["cases"]
    est = estimate_inference(_arch("qwen2.5-0.5b"), INFER, H100)
    assert infer["reserved_error"] == pytest.approx(est.model_bytes / (2 * 2**30) - 1)
    assert infer["allocated_error"] == pytest.approx(est.allocated_bytes / 2**30 - 1)
    assert infer["smi_error"] == pytest.approx(est.total_bytes / (3 * 2**30) - 1)
    assert infer["estimated_allocated_bytes"] == est.allocated_bytes < est.model_bytes
    # nvidia-smi less the pool still reserved at the end (not the peak's)
    assert infer["measured_context_bytes"] == 2**30 + 2**28
    assert infer["estimated_context_bytes"] == est.breakdown["overhead"] > 0
    est = estimate_training(_arch("llama-3.2-1b"), TRAIN, H100)
    assert train["reserved_error"] == pytest.approx(est.model_bytes / (30 * 2**30) - 1)
    assert train["smi_error"] is None  # no nvidia-smi reading: left out, not counted as 0
    reserved = [abs(infer["reserved_error"]), abs(train["reserved_error"])]
    summary = record["summary"]
    assert summary["reserved"]["median_abs_error"] == pytest.approx(statistics.median(reserved))
    assert summary["reserved"]["worst_abs_error"] == pytest.approx(max(reserved))
    assert summary["smi"]["count"] == 1
    assert [r["why"] for r in record["not_run"]] == ["no bitsandbytes"]


def test_compare_checks_the_largest_batch_and_the_verdicts_around_it(tmp_path: Path) -> None:
    arch = _arch("llama-3.2-1b")
    estimated = fits.max_training_batch(arch, TRAIN, H100)
    assert estimated > 3
    exact, bracket = check.compare(_measured(tmp_path, estimated))["searches"]
    assert exact["estimated_largest_batch"] == estimated and exact["error"] == 0
    assert exact["verdict_at_largest"] in ("yes", "tight")
    assert exact["verdict_above"] == "no" and exact["verdicts_ok"]
    assert exact["above_batch"] == estimated + 1
    assert (bracket["exact"], bracket["error"], bracket["above_batch"]) == (False, None, 9)
    assert bracket["estimate_in_bracket"] == (5 <= estimated < 9)
    lower = check.compare(_measured(tmp_path, estimated - 3))["searches"][0]
    assert lower["error"] == pytest.approx(estimated / (estimated - 3) - 1)
    above = estimate_training(arch, replace(TRAIN, batch=estimated - 2), H100).verdict
    assert lower["verdict_above"] == above
    assert lower["verdicts_ok"] == (above == "tight")


# ---------------------------------------------------------------- measure, GPU faked


def test_measure_writes_what_compare_reads(tmp_path: Path, monkeypatch) -> None:
    """The child process and nvidia-smi replaced: batches up to the estimator's own largest
    run, larger ones run out of memory; every case's record is the child's result."""
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.setattr(child, "nvidia_smi", lambda args: f"{H100_NAME}, {H100_MIB}, 0, 570.1\n")
    monkeypatch.setattr(check, "bitsandbytes_problem", lambda: "bitsandbytes is not installed")
    largest = fits.max_inference_batch(_arch(check.SEARCHES[0][0]), check.SEARCHES[0][1], H100)
    jobs: list[dict] = []

    def fake_child(job: dict, timeout_s: float, allocator_env: bool, child: str) -> dict:
        jobs.append(job)
        assert child == check.CHILD and not allocator_env
        if job["once"] and job["batch"] > largest:
            raise RuntimeError("real inference run failed: OutOfMemoryError: CUDA out of memory")
        return _result(10 * 2**30, 9 * 2**30, 11 * 2**30, 10 * 2**30)

    monkeypatch.setattr(check, "run_child", fake_child)
    check.measure(tmp_path, quick=True, budget_s=600)
    measured = json.loads((tmp_path / "gpu_memory.json").read_text())
    assert measured["environment"]["gpu"] == H100_NAME
    assert [j["once"] for j in jobs[:2]] == [False, False]
    assert [j["batch"] for j in jobs[2:]] == [largest, largest + 1]
    search = measured["searches"][0]
    assert (search["largest_ok"], search["stopped"]) == (largest, "exact")
    record = check.compare(tmp_path / "gpu_memory.json")
    assert len(record["cases"]) == 2 and record["searches"][0]["error"] == 0


def test_a_refused_job_or_a_failed_run_is_recorded_not_raised(monkeypatch) -> None:
    def refuse(name: str, plan, once: bool) -> dict:
        raise RuntimeError("LoRA validation needs peft (peft is not installed)")

    monkeypatch.setattr(check, "_job", refuse)
    assert "needs peft" in check._measure_case("llama-3.2-1b", TRAIN, None)["error"]
    assert check._try_batch("llama-3.2-1b", TRAIN, 4)["outcome"] == "error"
    qlora = replace(TRAIN, finetune="qlora")
    assert check._measure_case("llama-3.2-1b", qlora, "bitsandbytes is not installed") == {
        "skipped": "QLoRA needs bitsandbytes: bitsandbytes is not installed"}
