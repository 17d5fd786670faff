"""Renders `gpuwise claims`' answer: the JSON record (every measurement with where it came
from, every verdict with its rule and what it was judged on) and the terminal table (claim,
measurement, verdict with the runtime and rates it was judged on beneath it). Computes
nothing: the numbers come from app/claims."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuwise.app.claims import ClaimResult, ClaimsAnswer, JudgedOn

VERDICT_STYLE = {True: "green", False: "yellow", None: "dim"}


def claim_record(r: ClaimResult) -> dict[str, Any]:
    return {"id": r.id, "title": r.title, "claim": r.claim, "experiment": r.experiment,
            "verdict": {"holds": r.verdict.holds, "text": r.verdict.text,
                        "reason": r.verdict.reason, "rule": r.verdict.rule},
            "judged_on": judged_on_record(r.judged_on),
            "summary": r.summary,
            "measurements": [dataclasses.asdict(m) for m in r.measurements],
            "table": [list(row) for row in r.table], "notes": list(r.notes),
            "series": r.series, "seconds": round(r.seconds, 2)}


def judged_on_record(j: JudgedOn | None) -> dict[str, Any] | None:
    """The runtimes (by phase) and the rates a verdict was judged on, and the line saying so."""
    if j is None:
        return None
    return {"text": j.text,
            "runtimes": [{**dataclasses.asdict(u), "phases": list(u.phases), "text": u.text}
                         for u in j.runtimes],
            "rates": dataclasses.asdict(j.rates)}


def verdict_cell(r: ClaimResult) -> Text:
    """The verdict, and beneath it what it was judged on."""
    cell = Text(r.verdict.text, style=VERDICT_STYLE[r.verdict.holds])
    if r.judged_on is not None:
        cell.append(f"\non: {r.judged_on.text}", style="dim")
    return cell


def claims_record(a: ClaimsAnswer) -> dict[str, Any]:
    return {"machine": a.machine, "quick": a.quick, "wall_s": round(a.wall_s, 2),
            "command": a.command, "claims": [claim_record(r) for r in a.results]}


def machine_line(a: ClaimsAnswer) -> str:
    m = a.machine
    gpus = ", ".join(m.get("gpus") or []) or "no GPU"
    return (f"{m.get('cpu')}, {m.get('cores')} cores, {m.get('ram')} RAM, {gpus}; "
            f"{'--quick, ' if a.quick else ''}{a.wall_s:.0f} s")


def claims_view(a: ClaimsAnswer) -> tuple[dict[str, Any], Any]:
    table = Table(title=f"The explainer's claims on this machine ({machine_line(a)})",
                  title_justify="left", show_lines=True)
    table.add_column("claim", ratio=2)
    table.add_column("measured here", ratio=3)
    table.add_column("verdict", ratio=4)
    for r in a.results:
        table.add_row(r.title, r.summary, verdict_cell(r))
    footer = Text("every number with its source: --json; the experiments, plots and each "
                  "verdict's rule: --html FILE (docs/claims.md)", style="dim")
    return claims_record(a), Group(table, footer)
