"""`--html FILE`: the figures hold the numbers the JSON holds, every figure has its one-line
caption with its source, the file is written only where gpuwise may write, it stays small,
and the plain table path imports no plotting code (docs/reports.md).

Drawing the pages in a browser: tests/test_html_browser.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("plotly", reason="needs the html extra: pip install 'gpuwise[html]'")

import html_inputs as hi  # noqa: E402  (tests/ is on sys.path under pytest)
from test_cli import run  # noqa: E402

from gpuwise.app.roofs import catalogue_roof, roofs_for  # noqa: E402
from gpuwise.app.train import batch_sweep  # noqa: E402
from gpuwise.errors import GpuwiseError  # noqa: E402
from gpuwise.report.cost_view import advice_view  # noqa: E402
from gpuwise.report.estimate_views import check_view, infer_view  # noqa: E402
from gpuwise.report.html import pages  # noqa: E402
from gpuwise.report.html.output import Page, write_page  # noqa: E402
from gpuwise.report.html.page import FIRST_LINE, Figure  # noqa: E402
from gpuwise.report.html.probe_roofs import measured_roof  # noqa: E402
from gpuwise.report.html.style import GIB  # noqa: E402
from gpuwise.report.html.watch_timeline import MAX_POINTS, bucketed  # noqa: E402
from gpuwise.report.serve_view import serve_record  # noqa: E402

MAX_BYTES = 5 * 2**20


def figures(page: Page) -> list[Figure]:
    return [f for s in page.sections for f in s.figures]


def titled(page: Page, start: str) -> dict[str, Any]:
    """The figure whose title starts with `start`."""
    for f in figures(page):
        title = (f.figure["layout"].get("title") or {}).get("text", "")
        if title.startswith(start):
            return f.figure
    raise AssertionError(f"no figure titled {start!r} in {page.title}")


def named(fig: dict[str, Any], start: str) -> dict[str, Any]:
    return next(t for t in fig["data"] if t.get("name", "").startswith(start))


def page_data(path: Path) -> dict[str, Any]:
    text = path.read_text()
    found = re.search(r'<script id="gpuwise-data" type="application/json">(.*?)</script>', text, re.S)
    assert found, "the page carries its JSON"
    return json.loads(found.group(1))


@pytest.fixture(scope="module")
def all_pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Page]:
    tmp = tmp_path_factory.mktemp("inputs")
    infer = hi.infer_answer()
    train = hi.train_answer()
    probe = hi.probe_answer(tmp)
    return {
        "check": pages.check_page(hi.check_answer()),
        "infer": pages.infer_page(infer, roofs_for(infer.hardware)),
        "train": pages.train_page(train, roofs_for(train.hardware), batch_sweep(train)),
        "serve": pages.serve_page(hi.serve_answer(sweep=True)),
        "watch": pages.watch_page(hi.watch_answer(tmp)),
        "repro": pages.repro_page(hi.repro_answer(tmp)),
        "probe": pages.probe_page(probe, catalogue_roof(probe.profile.spec_id)),
    }


# -- every figure: a caption of one line that says where its numbers came from -------------


def test_every_figure_has_a_one_line_caption_with_its_source(all_pages: dict[str, Page]) -> None:
    for name, page in all_pages.items():
        assert figures(page), name
        for f in figures(page):
            assert "\n" not in f.caption and len(f.caption) < 400, (name, f.caption)
            source = f.caption.partition("Source: ")[2]
            assert re.search(r"\b(spec|measured|estimated)\b", source), (name, f.caption)


def test_no_label_is_written_over_a_log_axis_at_the_wrong_place(all_pages: dict[str, Page]) -> None:
    """plotly reads an annotation's position on a log axis as log10: a label at y=500 (ms)
    would stretch the axis to 10^500."""
    for page in all_pages.values():
        for f in figures(page):
            layout = f.figure["layout"]
            for ann in layout.get("annotations", []):
                axis = layout.get("yaxis" + ann.get("yref", "y")[1:].replace(" domain", ""), {})
                if axis.get("type") == "log" and ann.get("yref", "").startswith("y"):
                    assert abs(ann["y"]) < 30, ann


# -- the numbers are the JSON's ---------------------------------------------------------------


def test_check_memory_bars_are_the_precision_rows() -> None:
    answer = hi.check_answer()
    rows = check_view(answer)[0]["precisions"]
    fig = titled(pages.check_page(answer), "Memory by weight precision")
    weights = named(fig, "weights")
    assert weights["x"] == [round(r["breakdown"]["weights"] / GIB, 4) for r in rows]
    assert len(weights["y"]) == len(rows)
    components = {k for r in rows for k, v in r["breakdown"].items() if v}
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    assert len(bars) == len(components)
    capacity = named(fig, "capacity")
    assert f"{rows[0]['capacity_bytes'] / GIB:,.2f} GiB" in capacity["name"]
    assert all("margin_bytes" in r and "verdict" in r for r in rows)  # the tight zone's data


def test_infer_roofline_points_are_the_ops_of_the_json() -> None:
    answer = hi.infer_answer()
    rec = infer_view(answer, True)[0]
    page = pages.infer_page(answer, roofs_for(answer.hardware))
    fig = titled(page, "Roofline of")
    assert fig["layout"]["xaxis"]["type"] == fig["layout"]["yaxis"]["type"] == "log"
    for phase in ("prefill", "decode"):
        trace = named(fig, f"{phase} ops")
        ops = [o for o in rec["ops"][phase] if o["flops"] > 0 and o["bytes"] > 0 and o["seconds"] > 0]
        assert trace["x"] == [o["flops"] / o["bytes"] for o in ops]
        assert trace["y"] == [o["flops"] / o["seconds"] for o in ops]
        assert all(o["op"] in text for o, text in zip(ops, trace["text"], strict=True))
    roof = named(fig, "spec roof")
    assert max(roof["y"]) == answer.hardware.peak_tflops["bf16"] * 1e12
    assert len(fig["data"]) == 3  # one roof (no probe of an H100 here), two phases
    speed = titled(page, "Decode throughput")
    curve = rec["time"]["throughput_by_batch"]
    assert speed["data"][0]["y"] == [p["tokens_per_s"] for p in curve]
    assert speed["data"][1]["y"] == [p["decode_s_per_token"] * 1e3 for p in curve]


def test_page_data_is_what_json_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "infer.html"
    code, out, err = run(["infer", "llama-3.1-8b", "--on", "h100", "--ops", "--json",
                          "--html", str(out_file)], capsys)
    assert code == 0, err
    assert page_data(out_file) == json.loads(out)


def test_train_sweep_has_the_plan_and_stops_past_what_fits() -> None:
    answer = hi.train_answer()
    sweep = batch_sweep(answer)
    assert answer.plan.batch in [p.batch for p in sweep]
    assert [p.memory.fits for p in sweep] == sorted((p.memory.fits for p in sweep), reverse=True)
    plan_point = next(p for p in sweep if p.batch == answer.plan.batch)
    assert plan_point.memory.total_bytes == answer.memory.total_bytes
    assert answer.time is not None and plan_point.step_s == answer.time.step_s
    page = pages.train_page(answer, roofs_for(answer.hardware), sweep)
    speed = titled(page, "Training throughput")
    assert speed["data"][0]["x"] == [p.batch for p in sweep if p.memory.fits]
    assert {t["name"].split()[0] for t in titled(page, "Roofline")["data"][1:]} == {
        "forward", "backward", "optimizer"}


def test_serve_curve_is_the_sweep_with_targets_and_knee() -> None:
    answer = hi.serve_answer(sweep=True)
    rec = serve_record(answer)
    fig = titled(pages.serve_page(answer), "Latency and throughput")
    assert named(fig, "TTFT p90")["y"] == [p["ttft_s"]["p90"] * 1e3 for p in rec["curve"]]
    assert named(fig, "TPOT p90")["x"] == [p["rate"] for p in rec["curve"]]
    assert named(fig, "output tokens/s")["y"] == [p["output_tokens_per_s"] for p in rec["curve"]]
    knee = named(fig, "knee")
    assert f"{rec['max_rate_meeting_slo']:.3g}" in knee["name"]
    targets = [s for s in fig["layout"]["shapes"] if s.get("xref") == "x domain"]
    assert {s["y0"] for s in targets} == {500.0, 30.0}


def test_serve_without_sweep_shows_what_there_is() -> None:
    page = pages.serve_page(hi.serve_answer(sweep=False))
    assert [(f.figure["layout"]["title"]["text"].split()[0]) for f in figures(page)] == ["Latency", "KV"]


def test_advise_bars_are_the_options_and_break_even_marked() -> None:
    from gpuwise.app.cost import advise_options
    from gpuwise.cli.cost import ASSUMPTIONS, WORKLOAD

    kw = {p.name: p.default for p in (*WORKLOAD, *ASSUMPTIONS)}
    kw.update(model="llama-3.1-8b", requests_per_day=100_000.0, show_all=False, local=False,
              show_assumptions=False, as_json=True)
    answer = advise_options(kw)
    rec = advice_view(answer, False)[0]
    page = pages.advise_page(answer, False)
    fig = figures(page)[0].figure
    shown = rec["options"][:15]
    monthly = [t for t in fig["data"] if t.get("xaxis") == "x"]
    assert sorted(x for t in monthly for x in t["x"]) == sorted(o["usd_per_month"] for o in shown)
    per_mtok = [t for t in fig["data"] if t.get("xaxis") == "x2"]
    assert sorted(x for t in per_mtok for x in t["x"]) == sorted(o["usd_per_million_tokens"] for o in shown)
    even = titled(page, "Rent or buy")
    first = next(o for o in shown if o["break_even_utilisation"] is not None)
    assert named(even, "buy-vs-rent")["x"][0] == pytest.approx(min(first["break_even_utilisation"], 1.05) * 100)


def test_watch_timeline_has_each_reading_per_gpu_and_the_verdict_marked(tmp_path: Path) -> None:
    answer = hi.watch_answer(tmp_path)
    fig = figures(pages.watch_page(answer))[0].figure
    names = [t["name"] for t in fig["data"]]
    for expected in ("GPU 0 busy %", "GPU 1 SM active %", "rank 1 data wait %", "GPU 0 memory GiB",
                     "GPU 1 power W"):
        assert expected in names
    assert fig["layout"]["grid"]["rows"] == 4
    assert any(t["name"].startswith("rss trend") for t in fig["data"])  # the creep's line
    assert any("input-bound at 20%" in a["text"] for a in fig["layout"]["annotations"])
    assert any(a["text"].startswith("verdict: input-bound") for a in fig["layout"]["annotations"])
    steps = [s for s in answer.log.steps if s.rank == 1]
    wait = named(fig, "rank 1 data wait")
    assert wait["y"][0] == round(100 * steps[0].data_s / steps[0].step_s, 4)


def test_long_series_are_bucketed_to_a_readable_size() -> None:
    xs = [float(i) for i in range(10_000)]
    x, y = bucketed(xs, [1.0] * 5_000 + [None] * 5_000)
    assert len(x) <= MAX_POINTS and y[0] == 1.0 and y[-1] is None


def test_repro_spread_is_every_run_and_shares_have_their_intervals(tmp_path: Path) -> None:
    answer = hi.repro_answer(tmp_path)
    page = pages.repro_page(answer)
    loss = titled(page, "loss:")
    by_condition = {c.name: c.metrics["loss"] for c in answer.runs}
    assert {t["name"].split()[0]: t["y"] for t in loss["data"]} == by_condition
    shares = titled(page, "Arithmetic share")
    same = answer.analysis.shares["loss"]["same-seed"]
    trace = named(shares, "seed fixed: same-seed")
    assert trace["x"] == [same.ratio]
    assert trace["error_x"]["array"] == [same.high - same.ratio]
    notes = " ".join(n for s in page.sections for n in s.notes)
    assert "accuracy, seed fixed in same-seed: exactly 0" in notes
    assert page.data["runs"][0]["metrics"]["loss"] == by_condition["same-seed"]


def test_probe_roofs_are_the_profile_and_the_catalogue(tmp_path: Path) -> None:
    answer = hi.probe_answer(tmp_path)
    rec = json.loads(answer.profile.to_json())
    roof = measured_roof(rec)
    assert roof is not None
    assert roof.bandwidth_bytes_per_s == answer.profile.bandwidth_gbs("triad") * 1e9
    assert roof.peak_flops["bf16"] == answer.profile.best_flops_per_s("bf16")
    spec = catalogue_roof(answer.profile.spec_id)
    assert spec is not None and spec.source == "spec"
    page = pages.probe_page(answer, spec)
    fig = titled(page, "Roofline of")
    assert {t["name"].split(":")[0] for t in fig["data"] if t["mode"] == "lines"} == {
        "fp32 spec", "fp32 measured", "bf16 spec", "bf16 measured"}


# -- the file -----------------------------------------------------------------------------------


def test_pages_stay_small_and_start_with_their_mark(all_pages: dict[str, Page], tmp_path: Path) -> None:
    for name, page in all_pages.items():
        size = write_page(tmp_path / f"{name}.html", page)
        assert size < MAX_BYTES, (name, size)
        assert (tmp_path / f"{name}.html").read_bytes().startswith(FIRST_LINE.encode() + b"\n")


def test_a_users_file_is_refused_and_left_as_it_was(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "notes.html"
    mine.write_text("<html>my own page</html>\n")
    code, out, err = run(["check", "llama-3.1-8b", "--on", "h100", "--html", str(mine)], capsys)
    assert code == 2 and "is not a gpuwise HTML report" in err and not out  # before any work
    assert mine.read_text() == "<html>my own page</html>\n"


def test_its_own_report_is_replaced_and_the_table_still_prints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "sub" / "report.html"
    for _ in range(2):
        code, out, err = run(["check", "llama-3.1-8b", "--on", "h100", "--html", str(report)], capsys)
        assert code == 0, err
        assert "bf16" in out  # the table as without --html
    assert report.read_text().startswith(FIRST_LINE)
    assert not [p for p in report.parent.iterdir() if p.name != "report.html"]  # no temp file left


def test_without_plotly_html_is_refused_with_the_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotly" else real(name, *a))
    code, out, err = run(["check", "llama-3.1-8b", "--on", "h100", "--html", str(tmp_path / "r.html")], capsys)
    assert code == 2 and "plotly" in err and "pip install 'gpuwise[html]'" in err
    assert not (tmp_path / "r.html").exists()


def test_the_page_writer_says_the_fix_when_plotly_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuwise.report.html import page as page_module

    page_module._plotly_gzip_b64.cache_clear()
    monkeypatch.setattr(page_module.resources, "files", lambda name: (_ for _ in ()).throw(ModuleNotFoundError(name)))
    try:
        with pytest.raises(GpuwiseError) as exc:
            page_module.render_page("t", [])
        assert exc.value.hint == "pip install 'gpuwise[html]'"
    finally:
        monkeypatch.undo()
        page_module._plotly_gzip_b64.cache_clear()


def test_watch_report_takes_html_after_the_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = hi.watch_log(tmp_path / "job.jsonl")
    out_file = tmp_path / "watch.html"
    code, out, err = run(["watch", "--report", str(log), "--json", "--html", str(out_file)], capsys)
    assert code == 0, err
    assert page_data(out_file)["verdict"] == json.loads(out)["verdict"]


def test_every_command_of_the_issue_takes_html(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("infer", "train", "check", "module", "serve", "advise", "cost", "watch",
                    "repro", "probe"):
        code, out, _ = run([command, "--help"], capsys)
        assert code == 0 and "--html FILE" in out, command


# -- the plain path stays light ------------------------------------------------------------------


def test_the_plain_path_imports_no_plotting_code() -> None:
    code = ("import sys\nfrom gpuwise.cli import main\n"
            "try:\n    main(['check', 'llama-3.1-8b', '--on', 'h100', '--json'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('plotly', 'gpuwise.report.html'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
