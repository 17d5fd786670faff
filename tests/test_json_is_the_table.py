"""`--json` holds the numbers the terminal shows (issue 38 item 5): over random plans, every
figure of check's table, infer's memory and time lines and serve's latency table is the JSON's
value in the terminal's format. Both are rendered from one typed answer; a renderer that
computed or changed a figure would fail here."""

from __future__ import annotations

import io
import json
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from gpuwise.app.check import check
from gpuwise.app.deployment import Deployment, Workload, build_plan
from gpuwise.app.infer import infer
from gpuwise.app.serve import Load, ReplicaOptions, Slo, serve
from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.errors import GpuwiseError
from gpuwise.report.estimate_views import check_view, infer_view
from gpuwise.report.serve_view import serve_view
from gpuwise.report.terminal import format_seconds
from gpuwise.units import format_bytes
from gpuwise.workload import from_config
from gpuwise.workload.requests import Lengths

MODELS = ("llama-3.1-8b", "qwen2.5-0.5b", "mixtral-8x7b")
DEVICES = ("rtx-4090", "h100-sxm", "a10g", "cpu-cloud-32vcpu")
RUNTIMES = ("transformers", "compiled", "vllm", "sglang", "llama.cpp")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _text(view: object) -> str:
    out = io.StringIO()
    Console(file=out, width=400, color_system=None).print(view)
    return out.getvalue()


def _json(obj: object) -> dict:
    return json.loads(json.dumps(obj, default=str))


def _plan(name: str, runtime: str, prompt: int):
    model = resolve_model(name)
    return model, from_config(model.config), build_plan(
        model, Deployment(runtime=runtime), Workload(1, prompt, 64)).plan


@SETTINGS
@given(st.sampled_from(MODELS), st.sampled_from(DEVICES), st.sampled_from(RUNTIMES),
       st.sampled_from((128, 2048)))
def test_checks_table_shows_the_jsons_rows(name, device, runtime, prompt):
    model, arch, plan = _plan(name, runtime, prompt)
    try:
        answer = check(model, arch, find_hardware(device), plan)
    except GpuwiseError:
        return
    obj, view = check_view(answer)
    lines = _text(view).splitlines()
    for row in _json(obj)["precisions"]:
        line = next(x for x in lines if x.startswith(f"│ {row['weights']} "))
        for key in ("weight_bytes", "total_bytes", "headroom_bytes"):
            assert format_bytes(row[key]) in line, (key, line)
        seconds = (row.get("decode") or {}).get("s_per_token")
        if seconds is not None:
            assert format_seconds(seconds) in line


@SETTINGS
@given(st.sampled_from(MODELS), st.sampled_from(DEVICES), st.sampled_from(RUNTIMES),
       st.sampled_from((128, 2048)))
def test_infers_lines_show_the_jsons_memory_and_time(name, device, runtime, prompt):
    model, arch, plan = _plan(name, runtime, prompt)
    try:
        answer = infer(model, arch, find_hardware(device), plan)
    except GpuwiseError:
        return
    obj, view = infer_view(answer)
    text, record = _text(view), _json(obj)
    assert format_bytes(record["memory"]["total_bytes"]) in text
    for part, value in record["memory"]["breakdown"].items():
        assert not value or (part in text and format_bytes(value) in text), part  # 0: not shown
    if answer.time is not None:
        assert f"prefill {format_seconds(record['time']['prefill_s'])}" in text
        assert f"decode {format_seconds(record['time']['decode_s_per_token'])}" in text


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(("llama-3.1-8b", "qwen2.5-0.5b")), st.sampled_from(("h100-sxm", "a10g")),
       st.sampled_from(("vllm", "sglang")), st.sampled_from((0.5, 4.0)))
def test_serves_table_shows_the_jsons_percentiles(name, device, runtime, rate):
    model, arch, plan = _plan(name, runtime, 256)
    load = Load(Lengths(256, 64), rate=rate, requests=60)
    answer = serve(model, arch, find_hardware(device), replace(plan), ReplicaOptions(), load, Slo())
    obj, view = serve_view(answer)
    text, record = _text(view), _json(obj)
    for key, label in (("ttft_s", "time to first token"), ("tpot_s", "time per output token")):
        line = next(x for x in text.splitlines() if label in x and "│" in x)
        for p in ("p50", "p90", "p99"):
            assert format_seconds(record[key][p]) in line, (key, p, line)
    assert format_seconds(record["no_load"]["tpot_s"]) in text
