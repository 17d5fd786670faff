"""Typed to the edge (issue 38): every command's answer is a dataclass; serve's result, its
sweep and the advise/cost answers have typed fields (no `Any`, no `dict[str, Any]`); the JSON,
terminal and HTML renderers make their output from the answer and leave it as it was."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.util
import inspect
import json
import pkgutil
import re
import typing
from pathlib import Path
from typing import Any

import html_inputs as hi  # tests/ is on sys.path under pytest
import pytest
from rich.console import Console

import gpuwise.app
from gpuwise.app.cost import AdviceAnswer, CostAnswer, Header, advise_options, cost_option
from gpuwise.app.serve import ServeAnswer
from gpuwise.estimate.cost.advise import Advice, Option
from gpuwise.estimate.cost.prices import OptionCost, Usage
from gpuwise.estimate.cost.sizing import Sizing
from gpuwise.estimate.serve.metrics import Energy, Percentiles, ServeSummary, SteadyState
from gpuwise.estimate.serve.sweep import Sweep, SweepPoint
from gpuwise.report.cost_view import advice_view, cost_view
from gpuwise.report.html import pages
from gpuwise.report.serve_view import SUMMARY_KEYS, SWEEP_KEYS, serve_record, serve_view

TYPED = (ServeAnswer, ServeSummary, Percentiles, Energy, SteadyState, Sweep, SweepPoint,
         AdviceAnswer, CostAnswer, Header, Advice, Option, Sizing, OptionCost, Usage)

# `gpuwise serve --json`'s keys, in their order (a user-facing format: change it on purpose)
SERVE_KEYS = ("model", "hardware", "plan", "runtime", "tp", "replicas", "rates", "source_kind",
              "load", "slo", "no_load", *SUMMARY_KEYS, "kv_cache_tokens", *SWEEP_KEYS)
PERCENTILE_KEYS = ["mean", "p50", "p90", "p99"]
ENERGY_KEYS = ["joules", "per_1000_requests_j", "per_million_tokens_j", "per_output_token_j",
               "average_w", "busy_w", "memory_w", "idle_w", "compute_bound_share"]
STEADY_KEYS = ["seconds", "output_tokens_per_s", "average_batch", "whole_run"]


def _loose(hint: Any) -> bool:
    """Whether `Any` is anywhere in a type hint (dict[str, Any], tuple[Any, ...], Any)."""
    return hint is Any or any(_loose(arg) for arg in typing.get_args(hint))


def _answer_classes() -> list[type]:
    found = []
    for info in pkgutil.walk_packages(gpuwise.app.__path__, "gpuwise.app."):
        module = importlib.import_module(info.name)
        found += [c for name, c in inspect.getmembers(module, inspect.isclass)
                  if name.endswith("Answer") and c.__module__ == module.__name__]
    return found


def test_every_commands_answer_is_a_frozen_dataclass():
    classes = _answer_classes()
    assert {c.__name__ for c in classes} >= {"ServeAnswer", "AdviceAnswer", "CostAnswer",
                                             "CheckAnswer", "InferAnswer", "TrainAnswer"}
    for cls in classes:
        assert dataclasses.is_dataclass(cls), cls
        assert cls.__dataclass_params__.frozen, cls  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", TYPED, ids=lambda c: c.__name__)
def test_serve_and_advise_answers_have_typed_fields(cls):
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    hints = typing.get_type_hints(cls)
    loose = [f.name for f in dataclasses.fields(cls) if _loose(hints[f.name])]
    assert not loose, f"{cls.__name__} fields typed Any: {loose}"


@pytest.fixture(scope="module")
def serve_answer() -> ServeAnswer:
    return hi.serve_answer(sweep=True)


def test_serve_json_has_its_documented_keys(serve_answer):
    rec = serve_record(serve_answer)
    assert tuple(rec) == SERVE_KEYS
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert list(rec[key]) == PERCENTILE_KEYS
    assert list(rec["energy"]) == ENERGY_KEYS  # H100: its TDP gives a power model
    assert list(rec["steady_state"]) == [*STEADY_KEYS, "per_output_token_j"]
    assert all(isinstance(pair, list) and len(pair) == 2 for pair in json.loads(
        json.dumps(rec["kv_timeline"])))
    point_keys = ["rate", *(k for k in SUMMARY_KEYS if k not in ("kv_timeline", "energy"))]
    for point in rec["curve"]:
        assert list(point) == point_keys  # a sweep's run: no power model, no timeline
        assert list(point["steady_state"]) == STEADY_KEYS
    assert rec["max_rate_meeting_slo"] == serve_answer.sweep.max_rate_meeting_slo


def test_every_key_docs_serve_md_names_is_in_the_json(serve_answer):
    text = (Path(__file__).resolve().parent.parent / "docs" / "serve.md").read_text()
    said = text.split("## What it reports")[1].split("\n## ")[0]  # with "The knee (--sweep)"
    documented = set(re.findall(r"`([a-z][a-z0-9_]*)`", said))
    assert {"ttft_s", "kv_timeline", "steady_state", "curve", "max_rate_meeting_slo"} <= documented
    rec = serve_record(serve_answer)
    keys = set(rec) | {k for v in rec.values() if isinstance(v, dict) for k in v}  # nested too
    assert documented <= keys


def test_serve_json_is_made_from_the_typed_answer(serve_answer):
    rec, s = serve_record(serve_answer), serve_answer.result
    assert rec["ttft_s"] == dataclasses.asdict(s.ttft_s)
    assert rec["output_tokens_per_s"] == s.output_tokens_per_s
    assert rec["kv_cache_tokens"] == serve_answer.kv_cache_tokens
    assert [p["rate"] for p in rec["curve"]] == [p.rate for p in serve_answer.sweep.curve]


def _terminal(view: tuple[Any, Any]) -> tuple[str, str]:
    console = Console(record=True, width=120, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(view[1])
    console.file.close()
    return json.dumps(view[0], default=str), console.export_text()


def _unchanged(answer: Any, render: typing.Callable[[], Any]) -> None:
    """Rendering twice gives the same output and leaves the answer equal to a copy made first."""
    before = copy.deepcopy(answer)
    first, second = render(), render()
    assert first == second
    assert answer == before


def test_rendering_a_serve_answer_leaves_it_as_it_was(serve_answer):
    _unchanged(serve_answer, lambda: json.dumps(serve_record(serve_answer), default=str))
    _unchanged(serve_answer, lambda: _terminal(serve_view(serve_answer)))
    _unchanged(serve_answer, lambda: _html(pages.serve_page(serve_answer)))


def _html(page: pages.Page) -> tuple[str, str]:
    """The page's figures and record (its bytes carry the minute it was made)."""
    if importlib.util.find_spec("plotly") is not None:  # the html extra: the page's script
        page.render()
    figures = [f.figure for s in page.sections for f in s.figures]
    return json.dumps(figures, default=str), json.dumps(page.data, default=str)


def _cost_kw(**given: Any) -> dict[str, Any]:
    from gpuwise.cli.cost import ASSUMPTIONS, WORKLOAD

    kw = {p.name: p.default for p in (*WORKLOAD, *ASSUMPTIONS)}
    kw.update(model="llama-3.1-8b", requests_per_day=20_000.0, show_all=False, local=False,
              show_assumptions=False, as_json=True, price=None, rate=None, local_price=None,
              local_power_w=None, max_kw=None, owned=False, rent=False, reserved=False)
    kw.update(given)
    return kw


def test_rendering_advice_and_cost_leaves_them_as_they_were(monkeypatch):
    import gpuwise.app.cost as app_cost

    every = app_cost.candidates  # a few of them: a GPU, a smaller one, a CPU
    monkeypatch.setattr(app_cost, "candidates", lambda *args: [
        c for c in every(*args) if c.hw.id in ("h100-sxm", "l40s", "cpu-2s-xeon-8480")])
    advice = advise_options(_cost_kw(api_price_per_mtok="0.5,1.5"))
    assert {o.kind for o in advice.advice.options} == {"gpu", "cpu", "api"}
    assert isinstance(advice.header, Header) and advice.header.workload_kind == "inference"
    _unchanged(advice, lambda: _terminal(advice_view(advice, False, True)))
    _unchanged(advice, lambda: _html(pages.advise_page(advice, False)))
    cost = cost_option(_cost_kw(on="h100", rent=True))
    assert cost.header.title.endswith(", on-demand") and "on h100" in cost.header.title
    _unchanged(cost, lambda: _terminal(cost_view(cost, True)))
    _unchanged(cost, lambda: _html(pages.cost_page(cost)))
    rec = advice_view(advice, False)[0]
    assert list(rec)[:6] == ["model", "workload", "workload_kind", "target", "title",
                             "workload_text"]
    assert rec["workload"] == dict(vars(advice.header.workload))
