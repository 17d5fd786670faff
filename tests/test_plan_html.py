"""`gpuwise plan --html FILE`: the page holds the record `--json` prints, its two frontier
plots draw that record's points, it computes nothing (report/ renders only), and it is
refused before any work where plotly is missing or the file is a user's."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_run import run_cli as run

ARGS = ["plan", "qwen2.5-1.5b", "--on", "t4,l4", "--runtime", "vllm", "--concurrency", "8",
        "--tpot-ms", "50", "--ttft-ms", "300"]
# what computes a plan's figures: none may run while its page is built
COMPUTE = ("simulate", "steady_run", "closed_loop_run", "trace_share_run", "knee", "search",
           "size_serving_simulated", "prepare_serving", "price_options", "speed_frontier",
           "cost_frontier")
PAGE = Path(__file__).resolve().parents[1] / "gpuwise" / "report" / "html" / "plan.py"


def _script(text: str, element: str) -> Any:
    found = re.search(rf'<script id="{element}" type="application/json">(.*?)</script>', text,
                      re.S)
    assert found, element
    return json.loads(found.group(1))


def _titled(figures: list[dict[str, Any]], start: str) -> dict[str, Any]:
    return next(f for f in figures if f["layout"]["title"]["text"].startswith(start))


def _trace(fig: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in fig["data"] if t.get("name") == name)


def test_the_page_draws_the_frontiers_of_the_json(tmp_path: Path, capsys) -> None:
    pytest.importorskip("plotly", reason="needs the html extra")
    page = tmp_path / "plan.html"
    code, out, err = run([*ARGS, "--json", "--html", str(page)], capsys)
    assert code == 0, err
    assert f"wrote {page}" in err
    rec = json.loads(out)
    text = page.read_text()
    assert _script(text, "gpuwise-data") == json.loads(json.dumps(rec))  # the record, as is
    figures = _script(text, "gpuwise-figures")
    speed = _titled(figures, "Tokens a second a device")
    front = _trace(speed, "frontier")
    assert rec["speed_frontier"]
    assert front["x"] == [p["knee_tokens_per_s_per_user"] for p in rec["speed_frontier"]]
    assert front["y"] == [p["knee_tokens_per_s_per_device"] for p in rec["speed_frontier"]]
    drawn = sorted(label for t in speed["data"] if t.get("name") not in ("frontier", "the choice")
                   for label in t.get("text", []))
    assert drawn == sorted(p["label"] for p in rec["speed_points"])
    cost = _titled(figures, "Dollars per million tokens")
    front = _trace(cost, "frontier")
    assert front["x"] == pytest.approx([p["p90_tpot_s"] * 1e3 for p in rec["cost_frontier"]])
    assert front["y"] == [p["usd_per_million_tokens"] for p in rec["cost_frontier"]]
    star = _trace(cost, "the choice")
    assert star["y"] == [rec["choice"]["usd_per_million_tokens"]]
    assert rec["command"] in text and "Runners-up" in text
    for row in rec["runners_up"]:
        assert row["label"] in text


def test_the_page_computes_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    """The page module imports no estimate or app function (the answer's type only), and
    building the page runs no simulation: every number is the record's."""
    tree = ast.parse(PAGE.read_text())
    imported = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                for a in n.names}
    for module, name in imported:
        assert not (module or "").startswith("gpuwise.estimate"), (module, name)
        if (module or "").startswith("gpuwise.app"):
            assert name == "PlanAnswer", (module, name)
    pytest.importorskip("plotly", reason="needs the html extra")
    import gpuwise.cli.plan as cli_plan

    real_write = cli_plan.write_html
    built: list[Any] = []

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("the page computed")

    def write_without_computing(path: Any, build: Any) -> None:
        for name, mod in list(sys.modules.items()):  # from here on, nothing may simulate
            if name.startswith("gpuwise.") and mod is not None:
                for fn in COMPUTE:
                    if hasattr(mod, fn):
                        monkeypatch.setattr(mod, fn, refuse)
        real_write(path, lambda pages: built.append(build(pages)) or built[-1])

    monkeypatch.setattr(cli_plan, "write_html", write_without_computing)
    code, _, err = run([*ARGS, "--json", "--html", str(tmp_path / "p.html")], capsys)
    assert code == 0, err
    figures = [f for s in built[0].sections for f in s.figures]
    assert len(figures) == 2
    for fig in figures:
        assert "\n" not in fig.caption and "Source: estimated" in fig.caption


def test_without_plotly_html_is_refused_before_the_search(tmp_path: Path, capsys,
                                                           monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "plotly" else real(name, *a))
    code, out, err = run([*ARGS, "--html", str(tmp_path / "p.html")], capsys)
    assert code == 2 and not out and err.startswith("error: --html needs plotly")
    assert "pip install 'gpuwise[html]'" in err and not (tmp_path / "p.html").exists()


def test_a_users_file_is_left_as_it_was(tmp_path: Path, capsys) -> None:
    pytest.importorskip("plotly", reason="needs the html extra")
    mine = tmp_path / "notes.html"
    mine.write_text("<html>my notes</html>")
    code, out, err = run([*ARGS, "--html", str(mine)], capsys)
    assert code == 2 and not out and err.startswith("error:")
    assert mine.read_text() == "<html>my notes</html>"


def test_help_lists_the_loads_and_html(capsys) -> None:
    code, out, _ = run(["plan", "--help"], capsys)
    assert code == 0
    for flag in ("--concurrency", "--trace", "--html FILE", "--rate", "--requests-per-day"):
        assert flag in out, flag
