"""Every command's HTML report, by name: what `--html FILE` writes (docs/reports.md)."""

from __future__ import annotations

from gpuwise.report.html.estimate_pages import (
    check_page,
    infer_page,
    module_page,
    probe_page,
    train_page,
)
from gpuwise.report.html.output import Page
from gpuwise.report.html.plan import plan_page
from gpuwise.report.html.run_pages import (
    advise_page,
    cost_page,
    repro_page,
    serve_page,
    watch_page,
)

__all__ = ["Page", "advise_page", "check_page", "cost_page", "infer_page", "module_page",
           "plan_page", "probe_page", "repro_page", "serve_page", "train_page", "watch_page"]
