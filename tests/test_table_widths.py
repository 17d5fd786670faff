"""Readable where people read it (issue 39, item 6), for every command that prints a table
(advise: tests/test_narrow_tables.py): at 80 columns no line is wider and no device or model
name is cut or wrapped (rich's "…", or a name over two lines), the columns left out are named
under the table; at 200 every column is there; each table says what its columns mean under
it; a file a command writes is named on stderr (stdout stays --json); and the words beside a
number say what the number is."""

from __future__ import annotations

import io
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import html_inputs as hi  # tests/ is on sys.path under pytest
import pytest
from rich.console import Console
from typer.testing import CliRunner

from gpuwise.app.claims import (
    ClaimResult,
    ClaimsAnswer,
    Verdict,
    bandwidth_decode,
    energy,
    memory_fits,
    pipeline,
)
from gpuwise.app.local import this_machine
from gpuwise.app.repro import Placement, ReproAnswer, new_study
from gpuwise.catalog.hardware import load_hardware
from gpuwise.catalog.models import load_models
from gpuwise.cli.common import app
from gpuwise.estimate.repro.analysis import ConditionRuns, analyze
from gpuwise.measure.hardware.gpus import GpuInfo
from gpuwise.report.estimate_views import local_view
from gpuwise.report.repro_view import repro_view
from gpuwise.units import format_bytes, format_tokens

NARROW, WIDE = 80, 200


def _invoke(columns: int, *args: str) -> tuple[str, str]:
    """(stdout, stderr) of `gpuwise ARGS` on a terminal of `columns`."""
    out = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
    assert out.exit_code == 0, out.output
    return out.stdout, out.stderr


def _text(view: object, columns: int) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=columns, color_system=None).print(view)
    return buffer.getvalue()


def _readable(text: str, names: list[str], columns: int = NARROW) -> list[str]:
    """The lines, each at most `columns` wide, none cut with "…", each name whole on a line."""
    lines = text.splitlines()
    assert lines
    too_wide = [line for line in lines if len(line) > columns]
    assert not too_wide, too_wide
    assert "…" not in text, [line for line in lines if "…" in line]
    for name in names:
        assert any(name in line for line in lines), f"{name!r} is not whole on any line"
    return lines


def _header(lines: list[str], first: str) -> str:
    """A table's header, its lines joined (rich wraps a header cell over lines)."""
    start = next(i for i, line in enumerate(lines) if first in line and "┃" in line)
    end = start
    while end + 1 < len(lines) and "┃" in lines[end + 1]:
        end += 1
    while start > 0 and "┃" in lines[start - 1]:
        start -= 1
    cells = zip(*(line.split("┃") for line in lines[start:end + 1]), strict=True)
    return " | ".join(" ".join(w.strip() for w in cell if w.strip()) for cell in cells)


def _joined(text: str) -> str:
    return " ".join(text.split())


# -- gpuwise (the main job) ------------------------------------------------------------------


def test_main_job_rows_are_one_line_with_the_whole_model_name():
    record = json.loads(_invoke(WIDE, "--json")[0])
    text = _invoke(NARROW)[0]
    lines = _readable(text, [record["hardware"]["name"]])
    for row in record["models"]:  # a line a (model, precision), its memory and context on it
        limit = row["model_max_context"]
        context = (f"{format_tokens(limit)} (model limit)" if limit and row["max_context"] >= limit
                   else format_tokens(row["max_context"]) if row["max_context"] else "-")
        assert any(line.startswith(f"│ {row['model']} ") and f" {row['weights']} " in line
                   and format_bytes(row["total_bytes"]) in line and f" {context} │" in line
                   for line in lines), (row, context)
    assert "max context: the longest prompt + new tokens that fit at batch 1" in _joined(text)
    wide = _invoke(WIDE)[0].splitlines()
    assert "params" in _header(wide, "model")


def test_each_kind_of_gpu_has_its_own_line():
    answer = this_machine()
    gpu = GpuInfo(0, "NVIDIA H100 80GB HBM3", 80 * 2**30, None, None, "nvidia-ml-py")
    other = replace(gpu, index=8, name="NVIDIA A100-SXM4-80GB")
    machine = replace(answer.machine, gpus=(*(replace(gpu, index=i) for i in range(8)), other))
    _, view = local_view(replace(answer, machine=machine))
    lines = _readable(_text(view, NARROW), [gpu.name, other.name])
    assert lines[2] == "GPU:  8 x NVIDIA H100 80GB HBM3 (80.00 GiB each, via nvidia-ml-py)"
    assert lines[3] == "      NVIDIA A100-SXM4-80GB (80.00 GiB, via nvidia-ml-py)"


# -- check -----------------------------------------------------------------------------------

CHECK = ["check", "llama-3.1-70b", "--on", "rtx-3090", "--runtime", "llama.cpp"]


def test_check_at_80_keeps_each_precision_on_one_line_and_says_what_is_left_out():
    record = json.loads(_invoke(WIDE, *CHECK, "--json")[0])
    text = _invoke(NARROW, *CHECK)[0]
    lines = _readable(text, ["llama-3.1-70b", record["hardware"]["name"]])
    assert lines[1].startswith(f"on {record['hardware']['name']} (")
    for row in record["precisions"]:
        line = next(x for x in lines if x.startswith(f"│ {row['weights']} "))
        assert format_bytes(row["total_bytes"]) in line
        assert format_bytes(row["weight_bytes"]) not in line  # left out at 80: said below
        layers = row["device_layers"]  # llama.cpp fits it by keeping some layers on the device
        assert f"yes, {layers['on_device']}/{layers['of']} layers" in line
    said = _joined(text)
    assert "weight memory, headroom: --json, or a terminal of" in said
    assert "yes, N/M layers: the runtime keeps N of the M layers on the device" in said


def test_check_at_200_has_every_column():
    record = json.loads(_invoke(WIDE, *CHECK, "--json")[0])
    lines = _invoke(WIDE, *CHECK)[0].splitlines()
    header = _header(lines, "weights")
    for col in ("weights", "weight memory", "total", "fits", "headroom", "max context (batch 1)",
                "decode"):
        assert col in header, header
    row = record["precisions"][0]
    line = next(x for x in lines if x.startswith(f"│ {row['weights']} "))
    assert format_bytes(row["weight_bytes"]) in line and format_bytes(row["headroom_bytes"]) in line
    assert "--json, or a terminal of" not in _joined("\n".join(lines))


def test_the_longest_device_name_starts_its_own_line():
    name = max((h.name for h in load_hardware()), key=len)
    device = next(h.id for h in load_hardware() if h.name == name)
    text = _invoke(NARROW, "check", "qwen2.5-0.5b", "--on", device)[0]
    assert _readable(text, [name])[1].startswith(f"on {name}")
    text = _invoke(NARROW, "serve", "qwen2.5-0.5b", "--on", device, "--runtime", "llama.cpp",
                   "--rate", "0.5", "--requests", "20")[0]
    assert f"on {name}" in _readable(text, [name])


# -- infer, train: the memory table and the operations ------------------------------------------


@pytest.mark.parametrize("args", [
    ["infer", "qwen2.5-0.5b", "--on", "rtx-3090", "--ops"],
    ["train", "gpt2", "--on", "a100-80gb", "--ops"],
])
def test_operations_keep_their_names_at_80_and_every_column_at_200(args):
    record = json.loads(_invoke(WIDE, *args, "--json")[0])
    text = _invoke(NARROW, *args)[0]
    lines = _readable(text, [record["hardware"]["name"], record["model"]["name"]])
    names = {op["op"] for phase in record["ops"].values() for op in phase}
    for name in names:  # each operation's name whole at the start of a row
        assert any(re.match(rf" {re.escape(name)} +│", line) for line in lines), name
    said = _joined(text)
    assert "GFLOP, MB moved: --json, or a terminal of" in said
    assert "FLOP/B: FLOPs a byte moved" in said and "share: of the total" in said
    header = _header(_invoke(WIDE, *args)[0].splitlines(), "FLOP/B")
    for col in ("op", "kind", "x", "GFLOP", "MB moved", "FLOP/B", "time", "share", "bound"):
        assert col in header.split(" | "), header


# -- serve -----------------------------------------------------------------------------------

SERVE = ["serve", "llama-3.1-8b", "--on", "l4", "--rate", "2", "--requests", "50", "--sweep",
         "--tpot-ms", "100", "--gpus", "2"]


def test_serve_at_80_names_its_device_whole_and_says_whose_figures_are_shown():
    record = json.loads(_invoke(WIDE, *SERVE, "--json")[0])
    text = _invoke(NARROW, *SERVE)[0]
    lines = _readable(text, [record["hardware"]["name"], "llama-3.1-8b"])
    assert lines[2] == "on NVIDIA L4 24GB, 2 devices: 2 replicas of one device each"
    for point in record["curve"]:  # a line a rate
        assert any(line.startswith("│") and f" {point['rate']:.3g} │" in line for line in lines)
    said = _joined(text)
    # the words beside the throughput say whose it is: the fleet's rate over one replica's
    # requests and time (each replica serves its share of the stream)
    found = re.search(r"([\d.,]+) requests/s over ([\d.,]+) s \(([\d,]+) requests a replica, "
                      r"of (\d+)\)", said)
    assert found, said
    rate, seconds, each, replicas = (float(g.replace(",", "")) for g in found.groups())
    assert rate * seconds == pytest.approx(each * replicas, rel=0.02)
    assert "one replica's, of 2: its requests/s and output tok/s" in said
    knee = record["max_rate_meeting_slo"]
    assert f"of requests: {knee:.3g} requests/s for the 2 replicas" in said
    assert max(p["rate"] for p in record["curve"]) < knee  # the curve's rates are a replica's
    assert "W on average a replica" in said and "KV cache (a replica's)" in said
    assert "p50, p90, p99: percentiles over the requests" in said
    assert "met: the share of requests within the targets" in said


def test_serve_at_200_has_every_column_of_the_sweep():
    header = _header(_invoke(WIDE, *SERVE)[0].splitlines(), "requests/s")
    for col in ("requests/s", "TTFT p90", "TPOT p90", "output tok/s", "met", "saturated"):
        assert col in header.split(" | "), header


def test_a_sweep_without_targets_says_no_targets_and_a_floor_where_every_rate_kept_up():
    args = ["serve", "qwen2.5-0.5b", "--on", "l40s", "--rate", "5", "--requests", "50", "--sweep"]
    record = json.loads(_invoke(WIDE, *args, "--json")[0])
    text = _invoke(NARROW, *args)[0]
    lines = _readable(text, ["NVIDIA L40S 48GB"])
    assert "met" not in _header(lines, "requests/s").split(" | ")  # nothing to meet
    said = _joined(text)
    assert "meeting the targets" not in said
    last = record["curve"][-1]
    assert not last["saturated"] and record["max_rate_meeting_slo"] == last["rate"]
    assert (f"highest rate not saturated (no latency targets given): at least "
            f"{last['rate']:.3g} requests/s (the highest rate tried)") in said


# -- cost (advise's table) ---------------------------------------------------------------------


def test_cost_option_is_one_line_at_80_and_has_every_column_at_200():
    args = ["cost", "qwen2.5-0.5b", "--on", "h100", "--requests-per-day", "10000"]
    text = _invoke(NARROW, *args)[0]
    lines = _readable(text, ["qwen2.5-0.5b"])
    assert any(re.match(r"^1x h100-sxm bf16 \(vllm\) owned\s+│", line) for line in lines)
    assert "$/Mtok, kWh/mo, kW: --json" in _joined(text)
    header = next(line for line in _invoke(WIDE, *args)[0].splitlines()
                  if line.startswith("option"))
    for col in ("meets", "p90 ms/tok", "p90 TTFT", "busy", "$/month", "$/Mtok", "kWh/mo", "kW"):
        assert col in header


# -- the catalogues ----------------------------------------------------------------------------


def test_catalogues_say_what_their_columns_mean_and_wide_says_where_its_columns_went():
    for command, meaning, left in (("hardware", "GB/s: memory bandwidth", "(name, fp8, TDP W, "
                                    "link, list $): --json, or a terminal of"),
                                   ("models", "active: the weights a token uses",
                                    "(hub id, family, attention): --json, or a terminal of")):
        plain = _invoke(NARROW, command)[0]
        _readable(plain, [])
        assert meaning in _joined(plain) and "--wide's columns" not in plain
        wide = _invoke(NARROW, command, "--wide")[0]
        _readable(wide, [])
        assert meaning in _joined(wide) and f"--wide's columns {left}" in _joined(wide)


def test_wide_catalogues_at_200_have_every_column_and_every_name_whole():
    lines = _readable(_invoke(WIDE, "hardware", "--wide")[0], [h.name for h in load_hardware()],
                      WIDE)
    header = _header(lines, "id").split(" | ")
    for col in ("id aliases (also taken by --on)", "name", "GiB", "GB/s", "bf16 TFLOP/s", "fp8", "TDP W", "$/h cloud", "link",
                "list $"):
        assert col in header, header
    lines = _readable(_invoke(WIDE, "models", "--wide")[0], [m.hf_id for m in load_models()],
                      WIDE)
    for col in ("hub id", "family", "params", "active", "attention"):
        assert col in _header(lines, "id").split(" | ")


# -- probe, validate: their views on recorded readings ------------------------------------------


def test_probe_names_its_device_and_its_saved_profile(tmp_path, monkeypatch):
    import gpuwise.app.probe as probe_app

    answer = hi.probe_answer(tmp_path)
    monkeypatch.setattr(probe_app, "probe", lambda *a, **k: answer)
    text = _invoke(NARROW, "probe")[0]
    lines = _readable(text, [answer.profile.device])
    assert lines[0].startswith(f"Probe of {answer.profile.device} (")
    said = _joined(text)
    assert "of spec: the reading over the catalogue's figure for this device" in said
    assert "caches cold" not in said  # a GPU's factor is set to 1, not measured: no reading
    out, err = _invoke(NARROW, "probe", "--json")
    assert json.loads(out)["saved_to"] == str(answer.saved_to)
    assert f"wrote {answer.saved_to} (the probe profile" in err


def test_validate_says_what_its_error_is(monkeypatch):
    import gpuwise.app.validate as validate_app

    result = {"estimated_model_bytes": 300 * 2**20, "measured_model_bytes": 320 * 2**20,
              "error": -0.0625, "estimated_overhead_bytes": 400 * 2**20,
              "measured_baseline_bytes": 410 * 2**20, "estimated_total_bytes": 700 * 2**20,
              "measured_peak_bytes": 730 * 2**20, "allocator": "glibc",
              "time": {"decode_s_per_token": {"estimated": 0.01, "measured": 0.012,
                                              "error": -1 / 6}},
              "time_source": "measured", "time_rates": "this machine's probe"}
    monkeypatch.setattr(validate_app, "validate", lambda *a, **k: result)
    text = _invoke(NARROW, "validate", "infer", "gpt2", "--prompt", "16", "--new-tokens", "2")[0]
    lines = _readable(text, [])
    assert "error: estimated over measured, less 1" in _joined(text)
    assert any(line.startswith("│ decode s per token") and "-16.7%" in line for line in lines)


# -- repro -------------------------------------------------------------------------------------

GPUS, CPUS = "2x NVIDIA A100-SXM4-80GB", "AMD EPYC 7763 64-Core Processor, 8 threads"


def _placed_answer(tmp_path: Path) -> ReproAnswer:
    def placed(name: str, values: list[float]) -> ConditionRuns:
        n = len(values)
        return ConditionRuns(name, {"loss": values}, ["a"] * n, [[] for _ in values],
                             [1.0] * n, [None] * n, failed=1,
                             hardware={"loss": [GPUS, GPUS, CPUS, CPUS]})

    runs = [placed("deterministic", [0.5, 0.5, 0.6, 0.6]), placed("seeds", [0.5, 0.52, 0.49, 0.51])]
    study = new_study(("python", "train.py"), "deterministic,seeds", runs=4,
                      results=tmp_path / "repro.jsonl")
    where = [Placement(GPUS, ["node-a", "node-b"], 4), Placement(CPUS, ["node-c"], 4)]
    return ReproAnswer(study, analyze(runs), ["energy not measured here"], tuple(runs), where)


def test_repro_keeps_condition_and_hardware_names_whole(tmp_path):
    answer = _placed_answer(tmp_path)
    text = _text(repro_view(answer)[1], NARROW)
    lines = _readable(text, [GPUS, CPUS, "deterministic", "bit-", "identical"])
    assert f"  {GPUS}: 4 run(s) on 2 node(s) (node-a, node-b)" in lines
    for condition in ("deterministic", "seeds"):  # its name at the start of its rows
        assert sum(line.startswith(f"│ {condition} ") for line in lines) >= 2, condition
    said = _joined(text)
    assert "runs per hardware, F: --json, or a terminal of" in said
    assert "first diverging step NA: the runs hashed no steps" in said
    wide = _text(repro_view(answer)[1], WIDE)
    lines = _readable(wide, [f"{GPUS}: 2", f"{CPUS}: 2"], WIDE)
    for col in ("metric", "condition", "runs per hardware", "between- hardware share", "F",
                "p", "note"):
        assert col in _header(lines, "runs per hardware").split(" | ")


def test_repro_names_its_results_file_beside_json(tmp_path, monkeypatch):
    import gpuwise.app.repro as repro_app

    answer = hi.repro_answer(tmp_path)
    monkeypatch.setattr(repro_app, "repro", lambda *a, **k: answer)
    results = tmp_path / "runs.jsonl"
    args = ["repro", "--runs", "2", "--results", str(results), "--", "python", "train.py"]
    text = _invoke(NARROW, *args)[0]
    _readable(text, ["same-seed", "deterministic", "threads", "seeds"])
    out, err = _invoke(NARROW, *args[:5], "--json", *args[5:])
    assert json.loads(out)["analysis"] and f"wrote {results} (each run's result" in err


# -- watch -------------------------------------------------------------------------------------


def test_watch_report_at_80_says_what_busy_means(tmp_path):
    log = hi.watch_log(tmp_path / "job.jsonl")
    text = _invoke(NARROW, "watch", "--report", str(log))[0]
    lines = _readable(text, [])
    said = _joined(text)
    assert "GPU busy: the share of time a kernel ran (NVML), not how much of the GPU it used" in said
    assert "per step: the mean over the timed steps; share: of their time" in said
    assert "before sync: all but backward and the optimizer" in said
    assert any(line.startswith("│ GPU busy ") for line in lines)


def test_watch_names_its_log_on_stderr_and_keeps_json_on_stdout(tmp_path):
    log = tmp_path / "run.jsonl"
    out, err = _invoke(NARROW, "watch", "--json", "--no-inject", "--log", str(log), "--",
                       sys.executable, "-c", "pass")
    assert json.loads(out.strip().splitlines()[-1])["source"] == "measured"
    assert f"wrote {log} (the watch log" in err and log.exists()


# -- --html FILE -------------------------------------------------------------------------------


def test_html_file_is_named_on_stderr_and_json_stays_on_stdout(tmp_path):
    pytest.importorskip("plotly", reason="needs the html extra: pip install 'gpuwise[html]'")
    page = tmp_path / "check.html"
    out, err = _invoke(NARROW, "check", "gpt2", "--on", "h100", "--json", "--html", str(page))
    assert json.loads(out)["precisions"] and page.exists()
    assert f"wrote {page} (HTML report, " in err


# -- claims (its view belongs to gpuwise/report/claims_view.py) ---------------------------------


def _claims_answer() -> ClaimsAnswer:
    def result(module, summary: str, holds: bool, reason: str) -> ClaimResult:
        return ClaimResult(id=module.ID, title=module.TITLE, claim=module.CLAIM,
                           experiment="an experiment", verdict=Verdict(holds, reason, "a rule"),
                           summary=summary)

    results = (result(memory_fits, "21/39 fit at bf16, 33/39 at int4 (79.65 GiB)", True, ""),
               result(bandwidth_decode, "decode 1.02-1.31x bytes/bandwidth (3,641 GB/s read)",
                      True, ""),
               result(pipeline, "busy 30% -> 95% with 4 workers", True, ""),
               result(energy, "41.3 J a training step, 0.52 J a token (measured)", False,
                      "a token costs 0.9x the step's joules a GFLOP, under the 2x of the rule"))
    machine = {"cpu": "AMD EPYC 7763 64-Core Processor", "cores": 128, "arch": "x86_64",
               "ram_bytes": 2**40, "ram": "1.00 TiB", "gpus": ["NVIDIA H100 80GB HBM3"] * 8,
               "gpu_note": ""}
    return ClaimsAnswer(machine, True, results, 52.0, "gpuwise claims --quick")


@pytest.mark.xfail(strict=True, reason="claims' table title runs the machine's CPU and GPU "
                   "names into one line that wraps inside a name at 80 columns "
                   "(gpuwise/report/claims_view.py, another owner's)")
def test_claims_at_80_keep_the_machine_names_whole(monkeypatch):
    import gpuwise.app.claims as claims_app

    monkeypatch.setattr(claims_app, "run_claims", lambda *a, **k: _claims_answer())
    text = _invoke(NARROW, "claims", "--quick")[0]
    title = text.split("┏")[0].splitlines()
    for line in title[:-1]:  # a GPU's name is cut where a line of the title ends inside it
        assert not re.search(r"NVIDIA( H100( 80GB)?)?$", line.rstrip()), title


def test_claims_at_80_keep_within_80_columns(monkeypatch):
    import gpuwise.app.claims as claims_app

    monkeypatch.setattr(claims_app, "run_claims", lambda *a, **k: _claims_answer())
    text = _invoke(NARROW, "claims", "--quick")[0]
    lines = _readable(text, ["AMD EPYC 7763 64-Core Processor"])
    for title in ("Memory decides what", "Bandwidth decides", "A GPU at 30% has a"):
        assert any(line.startswith(f"│ {title}") for line in lines)
