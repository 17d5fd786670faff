"""`gpuwise repro`'s runner: the plan, child environments, metric collection, the results
file, the energy meter, failing commands and CLI errors, the program API, and real studies
of a tiny training loop on this CPU (tests/repro_train.py)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from fakes import FakeGpu, fake_nvml

from gpuwise.cli import main
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.repro.analysis import analyze
from gpuwise.measure.repro.collect import (
    last_json_metrics,
    parse_metric_patterns,
    read_api_report,
    regex_metrics,
)
from gpuwise.measure.repro.energy import EnergyMeter
from gpuwise.measure.repro.plan import (
    RunSpec,
    child_command,
    child_env,
    parse_conditions,
    plan_runs,
    thread_choices,
)
from gpuwise.measure.repro.runner import Study, condition_runs, run_study
from gpuwise.measure.repro.store import ResultsFile, completed

TRAIN = str(Path(__file__).with_name("repro_train.py"))
SMALL = ("--steps", "20", "--batch", "2048")  # about a second of training
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch")


# --- plan, collection, store, energy ------------------------------------------------------


def test_plan_is_index_major_with_seeds_and_threads() -> None:
    plan = plan_runs(("same-seed", "seeds", "threads"), 2, 7, [1, 2, 3])
    assert [(s.condition, s.index, s.seed, s.threads) for s in plan] == [
        ("same-seed", 0, 7, None), ("seeds", 0, 8, None), ("threads", 0, 7, 1),
        ("same-seed", 1, 7, None), ("seeds", 1, 9, None), ("threads", 1, 7, 2)]
    assert thread_choices(2) == [1, 2, 3, 4] and thread_choices(64)[-1] == 16


def test_child_env_and_command() -> None:
    spec = RunSpec("deterministic", 0, 5, None, True)
    env = child_env(spec, "/tmp/x.jsonl", {"PATH": "/bin"}, device="1")
    assert env["GPUWISE_SEED"] == "5" and env["PYTHONHASHSEED"] == "5"
    assert env["GPUWISE_DETERMINISTIC"] == "1" and env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["GPUWISE_REPRO_OUT"] == "/tmp/x.jsonl"
    threads = child_env(RunSpec("threads", 1, 5, 3, False), "o", {})
    assert threads["OMP_NUM_THREADS"] == threads["GPUWISE_THREADS"] == "3"
    assert child_command(["python", "t.py"], spec, "--seed") == ["python", "t.py", "--seed", "5"]


def test_bad_conditions_and_metrics() -> None:
    with pytest.raises(GpuwiseError, match="unknown condition") as err:
        parse_conditions("same-seed,seed")
    assert "seeds" in err.value.hint
    with pytest.raises(GpuwiseError, match="NAME=REGEX"):
        parse_metric_patterns(["loss"])


def test_metrics_from_output_and_api(tmp_path: Path) -> None:
    out = 'start\n{"loss": 0.5, "ok": true, "name": "x"}\n{"loss": 0.25, "step": 3}\nbye\n'
    assert last_json_metrics(out) == {"loss": 0.25, "step": 3.0}
    pats = parse_metric_patterns([r"val=val loss ([0-9.]+)"])
    assert regex_metrics("val loss 1.5\nval loss 1.25\n", pats) == {"val": 1.25}
    api = tmp_path / "api.jsonl"
    api.write_text('{"kind": "seed", "seed": 1, "deterministic": true, "threads": null}\n'
                   '{"kind": "step", "step": 0, "hash": "ab"}\n'
                   '{"kind": "metric", "name": "m", "value": "nan"}\n'
                   '{"kind": "params_hash", "hash": "ff"}\n{"kind": "met')
    rep = read_api_report(api)
    assert rep.params_hash == "ff" and rep.steps == [(0, "ab")] and rep.deterministic_applied
    assert math.isnan(rep.metrics["m"])


def test_results_file_refuses_another_study(tmp_path: Path) -> None:
    store = ResultsFile(tmp_path / "r.jsonl")
    assert store.open_study({"command": ["a"], "base_seed": 0}) == []
    store.append_run({"condition": "seeds", "index": 0, "returncode": 0})
    store.append_run({"condition": "seeds", "index": 1, "returncode": 1})
    with open(store.path, "a") as f:
        f.write('{"kind": "run", "cond')  # killed mid-write
    old = store.open_study({"command": ["a"], "base_seed": 0})
    assert list(completed(old)) == [("seeds", 0)]
    with pytest.raises(GpuwiseError, match="another study"):
        store.open_study({"command": ["b"], "base_seed": 0})
    assert store.open_study({"command": ["b"], "base_seed": 0}, fresh=True) == []


def test_energy_meter_rapl_wraps_and_nvml(tmp_path: Path) -> None:
    pkg = tmp_path / "intel-rapl:0"
    (tmp_path / "intel-rapl:0:0").mkdir(parents=True)  # a subdomain: not counted twice
    pkg.mkdir()
    (pkg / "max_energy_range_uj").write_text("1000000\n")
    (pkg / "energy_uj").write_text("900000\n")
    nvml = fake_nvml(FakeGpu(energy_mj=5000))
    meter = EnergyMeter(tmp_path, nvml)
    before = meter.read()
    (pkg / "energy_uj").write_text("100000\n")  # wrapped: +0.2 J
    nvml.lib.gpus[0].energy_mj = 7500  # +2.5 J
    assert meter.delta(before, meter.read()) == pytest.approx(2.7)
    assert meter.note() == "measured: intel-rapl:0, gpu0"
    bare = EnergyMeter(tmp_path / "none", fake_nvml(fail={"nvmlInit": "Driver Not Loaded"}))
    assert bare.note() == f"NA: CPU: no RAPL here ({tmp_path / 'none'} absent); GPU: Driver Not Loaded"


# --- the runner and the CLI on commands that fail -------------------------------------------


def test_failing_command_stops_the_study(tmp_path: Path) -> None:
    cmd = (sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(3)")
    study = Study(cmd, ("same-seed",), 3, tmp_path / "r.jsonl")
    with pytest.raises(GpuwiseError, match=r"exit 3\): boom"):
        run_study(study)
    silent = Study((sys.executable, "-c", "print('hi')"), ("same-seed",), 2, tmp_path / "s.jsonl")
    with pytest.raises(GpuwiseError, match="no metric"):
        run_study(silent)


def test_cli_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["repro"])
    assert exc.value.code == 2 and "no command" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["repro", "--detect", "x%", "--", "python", "t.py"])
    assert "not a number" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["repro", "--power", "80", "--", "python", "t.py"])
    assert "between 0 and 1" in capsys.readouterr().err


# --- real studies of a tiny training loop ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.torch
@needs_torch
def test_real_study_separates_the_sources(tmp_path: Path) -> None:
    """Same seed & threads: bit-identical; threads and seeds: a spread with an interval."""
    cmd = (sys.executable, TRAIN, *SMALL, "--seed-source", "flag")
    # Two runs each keep the test short; run 0 of `threads` uses 1 thread, run 1 two.
    study = Study(cmd, ("same-seed", "deterministic", "seeds", "threads"), 2,
                  tmp_path / "r.jsonl", seed_flag="--seed", parallel=2, threads=(1, 2))
    grouped = condition_runs(run_study(study), study.conditions)
    a = analyze(grouped, ["same-seed", "deterministic"], {"*": 0.001})
    c = a.conditions
    assert c["same-seed"].bit_identical and c["deterministic"].bit_identical
    assert c["same-seed"].first_divergent_step is None and c["same-seed"].step_hashes_compared
    assert all(grouped[1].deterministic_applied)
    assert c["seeds"].bit_identical is False and c["seeds"].metrics["train_loss"].sd
    # One thread and two threads sum the batch-norm statistics in a different order.
    assert c["threads"].bit_identical is False and c["threads"].first_divergent_step is not None
    for metric in ("train_loss", "acc"):
        assert a.shares[metric]["same-seed"].exactly_zero
    share = a.shares["train_loss"]["threads"]
    assert share.ratio is not None and 0 < share.low < share.ratio < share.high  # type: ignore[operator]
    assert share.ratio < 1e-3  # reduction order moves the loss far less than the seed does
    assert a.deterministic_time_ratio is not None and a.findings == []
    assert all(d.runs_needed and d.runs_needed >= 2 for d in a.detect)


@pytest.mark.slow
@pytest.mark.torch
@needs_torch
def test_cli_reports_a_program_that_ignores_the_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "r.jsonl"
    main(["repro", "--runs", "2", "--conditions", "seeds", "--json", "--results", str(results),
          "--", sys.executable, TRAIN, *SMALL, "--seed-source", "fixed"])
    record = json.loads(capsys.readouterr().out)
    codes = [f["code"] for f in record["analysis"]["findings"]]
    assert codes == ["seed-ignored"]
    assert record["analysis"]["conditions"]["seeds"]["bit_identical"] is True
    assert record["study"]["results"] == str(results)


@pytest.mark.slow
@pytest.mark.torch
@needs_torch
def test_interrupted_study_resumes_and_finds_unseeded_randomness(tmp_path: Path) -> None:
    counts = tmp_path / "count.txt"
    cmd = (sys.executable, TRAIN, *SMALL, "--seed-source", "none", "--count-file", str(counts))
    study = Study(cmd, ("same-seed",), 3, tmp_path / "r.jsonl")

    def interrupt(record: dict[str, object], done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_study(study, interrupt)
    first = [json.loads(line) for line in study.results.read_text().splitlines()]
    assert [r["kind"] for r in first] == ["study", "run"]
    started = len(counts.read_text().splitlines())
    records = run_study(study)
    assert len(counts.read_text().splitlines()) - started == 2  # only the two missing runs
    assert sorted(r["index"] for r in records) == [0, 1, 2]
    assert records[0]["wall_s"] == first[1]["wall_s"]  # the saved run is kept, not redone
    a = analyze(condition_runs(records, ("same-seed",)), ["same-seed"])
    assert [f.code for f in a.findings] == ["unseeded-randomness"]


@needs_torch
@pytest.mark.torch
def test_api_reports_only_under_a_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    import torch

    import gpuwise

    monkeypatch.delenv("GPUWISE_REPRO_OUT", raising=False)
    monkeypatch.delenv("GPUWISE_DETERMINISTIC", raising=False)
    monkeypatch.delenv("GPUWISE_THREADS", raising=False)
    monkeypatch.setenv("GPUWISE_SEED", "11")
    assert gpuwise.seed_everything() == 11
    first = (random.random(), torch.rand(1).item())
    gpuwise.seed_everything()
    assert (random.random(), torch.rand(1).item()) == first
    gpuwise.report_metric("loss", 1.0)  # no study: nothing is written, nothing fails
    out = tmp_path / "api.jsonl"
    monkeypatch.setenv("GPUWISE_REPRO_OUT", str(out))
    model = torch.nn.Linear(3, 2)
    h = gpuwise.report_params_hash(model)
    assert gpuwise.step_hash(0, torch.ones(2)) != gpuwise.step_hash(0, torch.ones(2) * 1.0000001)
    with torch.no_grad():
        model.weight[0, 0] += 1e-7  # one bit of one weight changes the hash
    assert gpuwise.report_params_hash(model) != h
    gpuwise.report_metric("loss", float("nan"))
    rep = read_api_report(out)
    assert rep.params_hash is not None and len(rep.steps) == 2 and math.isnan(rep.metrics["loss"])


def test_statistics_and_api_import_nothing_heavy(heavy_imports) -> None:
    code = ("import gpuwise, gpuwise.measure.repro.program_api, gpuwise.estimate.repro.analysis\n"
            "import gpuwise.cli.repro")
    assert heavy_imports(code, ("torch", "numpy", "rich")) == []


def test_parallel_slots_get_their_own_device(tmp_path: Path) -> None:
    code = "import os, json; print(json.dumps({'dev': int(os.environ['CUDA_VISIBLE_DEVICES'])}))"
    study = Study((sys.executable, "-c", code), ("seeds",), 4, tmp_path / "r.jsonl",
                  parallel=2, devices=("0", "1"))
    done: list[int] = []
    records = run_study(study, lambda rec, n, total: done.append(n))
    assert done == [1, 2, 3, 4]
    assert all(r["metrics"]["dev"] == int(r["device"]) for r in records)
    assert {r["device"] for r in records} <= {"0", "1"}
    assert all(r["energy_note"].startswith("NA: runs in parallel") for r in records)
