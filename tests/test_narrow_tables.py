"""Readable where people read it (issue 39, item 6): at 80 columns each advise option is one
line with its whole name, and the columns left out are named under the table; at 200 every
column is there."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from gpuwise.cli.common import app

ADVISE = ["advise", "qwen2.5-7b", "--no-local", "--on", "rtx-3090,v100-sxm2-32gb,l40s",
          "--requests-per-day", "100000", "--prompt", "512", "--new-tokens", "256",
          "--latency-ms", "50", "--ttft-ms", "1000"]


def _run(columns: int, *extra: str) -> str:
    out = CliRunner().invoke(app, [*ADVISE, *extra], env={"COLUMNS": str(columns)})
    assert out.exit_code == 0, out.output
    return out.output


def test_advise_rows_are_one_line_each_at_80_columns():
    options = json.loads(_run(200, "--json"))["options"]
    text = _run(80)
    assert all(len(line) <= 80 for line in text.splitlines())
    rows = [line for line in text.splitlines() if re.match(r"^\dx ", line)]
    assert len(rows) == min(len(options), 15)  # one line an option, none wrapped
    for row in rows:  # the whole device name, the mode and the runtime on the row
        assert re.match(r"^\dx (rtx-3090|v100-sxm2-32gb|l40s) \S+ \(vllm\) "
                        r"(owned|on-demand|reserved)\s", row), row
    assert "$/Mtok, kWh/mo, kW: --json" in " ".join(text.split())


def test_advise_keeps_every_column_at_200():
    text = _run(200)
    header = next(line for line in text.splitlines() if line.startswith("option"))
    for col in ("p90 ms/tok", "p90 TTFT", "busy", "$/month", "$/Mtok", "kWh/mo", "kW"):
        assert col in header
