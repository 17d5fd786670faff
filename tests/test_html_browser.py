"""Every kind of HTML report as a person sees it: opened in headless Chromium, every figure
drawn with its traces and something in them, no error in the console, and a screenshot of
each kept under the test's temporary directory (look at them: a plot nobody can read is a
defect). Skipped, with the reason, only where no Chromium is installed (.ci/run installs
Debian's `chromium`)."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="needs the html extra: pip install 'gpuwise[html]'")

import html_inputs as hi  # noqa: E402  (tests/ is on sys.path under pytest)
from browser import NO_CHROMIUM, BrowserResult, chromium_path, render_in_chromium  # noqa: E402

from gpuwise.app.roofs import catalogue_roof, roofs_for  # noqa: E402
from gpuwise.app.train import batch_sweep  # noqa: E402
from gpuwise.report.html import pages  # noqa: E402
from gpuwise.report.html.output import Page, write_page  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(chromium_path() is None, reason=NO_CHROMIUM)]


def _advise() -> Page:
    from gpuwise.app.cost import advise_options, cost_option
    from gpuwise.cli.cost import ASSUMPTIONS, WORKLOAD

    kw = {p.name: p.default for p in (*WORKLOAD, *ASSUMPTIONS)}
    kw.update(model="llama-3.1-8b", requests_per_day=100_000.0, show_all=False, local=False,
              show_assumptions=False, as_json=True)
    advise = pages.advise_page(advise_options(kw), False)
    kw.update(on="h100", owned=False, rent=False, reserved=False, price=None, rate=None)
    return advise, pages.cost_page(cost_option(kw))


def _module() -> Page:
    from gpuwise.app.module import module_from_factory

    est, labels = module_from_factory("module_zoo:small_cnn", ["8x3x64x64"], None, training=True,
                                      dtype=None, optimizer="adamw", on="h100")
    return pages.module_page(est, labels, roofs_for(est.hardware))


def build_pages(tmp: Path) -> dict[str, Page]:
    infer = hi.infer_answer()
    train = hi.train_answer()
    probe = hi.probe_answer(tmp)
    advise, cost = _advise()
    built = {
        "check": pages.check_page(hi.check_answer()),
        "infer": pages.infer_page(infer, roofs_for(infer.hardware)),
        "train": pages.train_page(train, roofs_for(train.hardware), batch_sweep(train)),
        "serve-sweep": pages.serve_page(hi.serve_answer(sweep=True)),
        "serve": pages.serve_page(hi.serve_answer(sweep=False)),
        "advise": advise,
        "cost": cost,
        "watch": pages.watch_page(hi.watch_answer(tmp)),
        "repro": pages.repro_page(hi.repro_answer(tmp)),
        "probe": pages.probe_page(probe, catalogue_roof(probe.profile.spec_id)),
    }
    if importlib.util.find_spec("torch") is not None:
        built["module"] = _module()
    return built


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Page, BrowserResult]]:
    """Each page written and opened once (four browsers at a time)."""
    tmp = tmp_path_factory.mktemp("html-reports")
    built = build_pages(tmp)
    for name, page in built.items():
        write_page(tmp / f"{name}.html", page)

    def open_one(name: str) -> tuple[str, BrowserResult]:
        return name, render_in_chromium(tmp / f"{name}.html", tmp / "screenshots" / f"{name}.png")

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(pool.map(open_one, built))
    return {name: (built[name], results[name]) for name in built}


KINDS = ["check", "infer", "train", "serve-sweep", "serve", "advise", "cost", "watch", "repro",
         "probe", "module"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_plot_draws_its_traces_without_errors(
        kind: str, drawn: dict[str, tuple[Page, BrowserResult]]) -> None:
    if kind not in drawn:
        pytest.skip("the module report needs torch: pip install 'gpuwise[torch]'")
    page, result = drawn[kind]
    assert result.console_errors == (), result.console_errors
    assert result.error is None, result.error
    figures = [f for s in page.sections for f in s.figures]
    assert result.drawn == len(figures) == len(result.plots) > 0
    expected = [len(f.figure["data"]) for f in figures]
    assert list(result.traces) == expected, (kind, result.traces, expected)
    for plot in result.plots:
        assert plot.width > 300 and plot.height > 150, plot
        assert plot.marks > 0, plot  # something is drawn: points, lines, bars or boxes
    assert result.screenshot is not None and result.screenshot.stat().st_size > 20_000


def test_a_page_that_fails_to_draw_is_seen(tmp_path: Path) -> None:
    """The harness itself: an error in the page reaches `console_errors`."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><head></head><body><script>nope();</script></body></html>")
    result = render_in_chromium(page, tmp_path / "broken.png")
    assert result.drawn is None
    assert any("nope" in e for e in result.console_errors)
