"""Write the Grafana dashboard of `gpuwise watch --prometheus` (deploy/grafana/).

The dashboard is data; this is its source, so that a panel is a line to change rather than
forty lines of JSON. It uses only the metrics the exporter serves
(gpuwise/estimate/watch/metric_families.py; tests/test_watch_prometheus.py checks that, and that the
stored file is what this writes).

    .venv/bin/python tools/write_watch_dashboard.py            # or: ... OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TARGET = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "gpuwise-watch.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job", host=~"$host"'
RED_AT_1 = {"mode": "absolute", "steps": [{"color": "green", "value": None},
                                          {"color": "red", "value": 1}]}
LAST = {"calcs": ["lastNotNull"], "fields": "", "values": False}


def q(expr: str, legend: str = "", instant: bool = False, table: bool = False) -> dict[str, Any]:
    """One query of a panel."""
    out: dict[str, Any] = {"expr": expr, "legendFormat": legend}
    if instant:
        out |= {"instant": True, "range": False}
    if table:
        out["format"] = "table"
    return out


class Layout:
    """Panels placed left to right in rows of 24 columns."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.y = 0

    def row(self, title: str) -> None:
        self.panels.append({"type": "row", "title": title, "id": len(self.panels) + 1,
                            "collapsed": False, "panels": [],
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}})
        self.y += 1

    def line(self, height: int, *panels: dict[str, Any]) -> None:
        """Panels side by side (each with its width `w`), then the next line."""
        x = 0
        for panel in panels:
            panel["id"] = len(self.panels) + 1
            panel["gridPos"] = {"h": height, "w": panel.pop("w"), "x": x, "y": self.y}
            x += panel["gridPos"]["w"]
            self.panels.append(panel)
        assert x <= 24, [p["title"] for p in panels]
        self.y += height


def panel(kind: str, title: str, w: int, queries: list[dict[str, Any]], unit: str | None = None,
          desc: str = "", options: dict[str, Any] | None = None,
          defaults: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    field: dict[str, Any] = {"defaults": dict(defaults or {}), "overrides": []}
    if unit:
        field["defaults"]["unit"] = unit
    return {"type": kind, "title": title, "w": w, "datasource": DS, "description": desc,
            "targets": [{"datasource": DS, "refId": chr(65 + i), **t} for i, t in enumerate(queries)],
            "fieldConfig": field, "options": options or {}, **extra}


def stacked(max_one: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"custom": {"stacking": {"mode": "normal", "group": "A"},
                                      "fillOpacity": 60}}
    return out | {"max": 1} if max_one else out


def panels() -> list[dict[str, Any]]:
    g = Layout()
    g.row("Verdict")
    g.line(5,
        panel("stat", "Verdict now", 8, [q(f"gpuwise_watch_verdict{{{SEL}}} == 1",
                                         "{{job}} {{host}}: {{verdict}}", instant=True)],
              desc="What limits the loop over the exporter's recent window "
                   "(gpuwise_watch_window_seconds): the same verdict as gpuwise watch's report.",
              options={"textMode": "name", "colorMode": "background", "graphMode": "none",
                       "reduceOptions": LAST},
              defaults={"color": {"mode": "fixed", "fixedColor": "orange"}}),
        panel("stat", "Findings", 6, [q(f"gpuwise_watch_finding{{{SEL}}}", "{{host}} {{finding}}",
                                      instant=True)],
              desc="1: memory creep (over the whole run) or a straggler rank (recent window).",
              options={"colorMode": "background", "graphMode": "none",
                       "textMode": "value_and_name", "reduceOptions": LAST},
              defaults={"thresholds": RED_AT_1}),
        panel("table", "Evidence (measured) and thresholds", 10,
              [q(f"gpuwise_watch_evidence{{{SEL}}}", instant=True, table=True),
               q(f"gpuwise_watch_evidence_threshold{{{SEL}}}", instant=True, table=True)],
              desc="The numbers each current finding's rule read, and the threshold it was "
                   "judged against.",
              transformations=[{"id": "merge", "options": {}}, {"id": "organize", "options": {
                  "excludeByName": {"Time": True, "__name__": True, "instance": True},
                  "renameByName": {"Value #A": "value", "Value #B": "threshold"}}}]),
    )
    g.line(5, panel("state-timeline", "Verdict over time", 24,
                    [q(f"gpuwise_watch_verdict{{{SEL}}} == 1", "{{job}} {{host}}: {{verdict}}")],
                    desc="Input-bound for 10 minutes fires GpuwiseJobInputBound "
                         "(deploy/prometheus/gpuwise-alerts.yml).",
                    options={"showValue": "never", "mergeValues": True}))

    g.row("Step time")
    g.line(8,
        panel("timeseries", "Step time per rank (recent window)", 8, [
            q(f'gpuwise_watch_step_seconds{{{SEL}, quantile="0.5"}}', "rank {{rank}} p50 ({{host}})"),
            q(f'gpuwise_watch_step_seconds{{{SEL}, quantile="0.9"}}', "rank {{rank}} p90 ({{host}})"),
            q(f"rate(gpuwise_watch_step_seconds_sum{{{SEL}}}[$__rate_interval]) / "
              f"rate(gpuwise_watch_step_seconds_count{{{SEL}}}[$__rate_interval])",
              "rank {{rank}} mean ({{host}})")], unit="s"),
        panel("timeseries", "Where step time goes", 8,
              [q(f"avg by (job, phase) (gpuwise_watch_phase_share_ratio{{{SEL}}})", "{{phase}}")],
              unit="percentunit", defaults=stacked(max_one=True),
              desc="Share of step time per phase, averaged over ranks; data + h2d at 20% or "
                   "more is input-bound."),
        panel("timeseries", "Forward, backward, optimizer per step", 8,
              [q(f'gpuwise_watch_phase_step_seconds{{{SEL}, phase=~"forward|backward|optimizer|other"}}',
                 "rank {{rank}} {{phase}}")], unit="s",
              desc="Under `gpuwise watch` with no code change, forward is not timed apart: it "
                   "is in 'other'."),
    )
    g.line(6, panel("timeseries", "Phase time per second, since the start (counters)", 24,
                    [q(f"avg by (job, phase) (rate(gpuwise_watch_phase_seconds_total{{{SEL}}}"
                       "[$__rate_interval]))", "{{job}} {{phase}}")],
                    unit="percentunit", defaults=stacked(),
                    desc="From the phase counters over Grafana's interval, averaged over ranks: "
                         "unlike the shares above, any time range."))

    g.row("Devices")
    g.line(8,
        panel("timeseries", "GPU busy and SM activity", 8, [
            q(f"gpuwise_watch_gpu_utilization_ratio{{{SEL}}}", "{{host}} GPU {{device}} busy"),
            q(f"gpuwise_watch_gpu_sm_active_ratio{{{SEL}}}", "{{host}} GPU {{device}} SM active")],
              unit="percentunit", defaults={"max": 1, "min": 0}),
        panel("timeseries", "Host CPU", 8, [
            q(f"gpuwise_watch_host_cpu_utilization_ratio{{{SEL}}}", "{{host}} CPU busy"),
            q(f"gpuwise_watch_host_iowait_ratio{{{SEL}}}", "{{host}} iowait")],
              unit="percentunit", defaults={"min": 0}),
        panel("timeseries", "Throughput", 8, [
            q(f"sum by (job) (rate(gpuwise_watch_samples_total{{{SEL}}}[$__rate_interval]))",
              "{{job}} samples/s"),
            q(f"sum by (job) (gpuwise_watch_samples_per_second{{{SEL}}})",
              "{{job}} samples/s (recent window)"),
            q(f"sum by (job, rank) (rate(gpuwise_watch_steps_total{{{SEL}}}[$__rate_interval]))",
              "rank {{rank}} steps/s")], unit="short"),
    )

    g.row("Memory")
    g.line(8,
        panel("timeseries", "GPU memory", 8, [
            q(f"gpuwise_watch_gpu_memory_used_bytes{{{SEL}}}", "{{host}} GPU {{device}} used"),
            q(f"gpuwise_watch_gpu_memory_total_bytes{{{SEL}}}", "{{host}} GPU {{device}} capacity"),
            q(f"gpuwise_watch_device_memory_allocated_bytes{{{SEL}}}",
              "rank {{rank}} allocated by tensors")], unit="bytes"),
        panel("timeseries", "Host memory", 8, [
            q(f"gpuwise_watch_rss_bytes{{{SEL}}}", "{{host}} job's processes"),
            q(f"gpuwise_watch_host_memory_total_bytes{{{SEL}}}", "{{host}} capacity"),
            q(f"gpuwise_watch_process_rss_bytes{{{SEL}}}", "rank {{rank}} process")],
              unit="bytes"),
        panel("timeseries", "Memory growth (creep slope)", 8,
              [q(f"gpuwise_watch_memory_growth_bytes_per_second{{{SEL}}}", "{{host}} {{memory}}")],
              unit="Bps", desc="Least-squares growth after warm-up over the whole run; the "
                               "finding memory_creep says when it counts as creep."),
    )

    g.row("Power and energy")
    g.line(8,
        panel("timeseries", "Power", 8, [
            q(f"gpuwise_watch_gpu_power_watts{{{SEL}}}", "{{host}} GPU {{device}}"),
            q(f"gpuwise_watch_power_watts{{{SEL}}}", "{{host}} {{source}} (window mean)")],
              unit="watt"),
        panel("stat", "Energy since the job started", 8,
              [q(f"sum by (job, source) (gpuwise_watch_energy_joules_total{{{SEL}}})",
                 "{{job}} {{source}}", instant=True)], unit="joule",
              options={"graphMode": "none", "reduceOptions": LAST}),
        panel("timeseries", "Energy per step (estimated)", 8,
              [q(f"gpuwise_watch_step_energy_joules{{{SEL}}}", "{{host}}")], unit="joule"),
    )

    g.row("Ranks")
    g.line(8,
        panel("timeseries", "Work before the gradient sync, per rank", 10,
              [q(f"gpuwise_watch_before_sync_seconds{{{SEL}}}", "{{host}} rank {{rank}}")],
              unit="s", desc="Median of step - backward - optimizer: the all-reduce evens step "
                             "times out, so a slow rank shows here."),
        panel("state-timeline", "Stragglers", 7,
              [q(f"gpuwise_watch_straggler{{{SEL}}}", "{{host}} rank {{rank}}")],
              options={"showValue": "never", "mergeValues": True},
              defaults={"thresholds": RED_AT_1, "color": {"mode": "thresholds"}}),
        panel("timeseries", "Spread and wait", 7, [
            q(f"gpuwise_watch_rank_spread_ratio{{{SEL}}}", "{{host}} step-time spread"),
            q(f"gpuwise_watch_straggler_wait_seconds{{{SEL}}}", "{{host}} others' wait per step")],
              unit="short"),
    )

    g.row("The exporter")
    g.line(6,
        panel("timeseries", "Exporter CPU (share of one core)", 12,
              [q(f"rate(gpuwise_watch_exporter_cpu_seconds_total{{{SEL}}}[$__rate_interval])",
                 "{{host}} {{instance}}")], unit="percentunit",
              desc="What computing these metrics costs, in the process that serves them."),
        panel("table", "Jobs", 12, [
            q(f"gpuwise_watch_job_info{{{SEL}}} * on (job, host, instance) group_left () "
              f"gpuwise_watch_start_time_seconds{{{SEL}}} * 1000", instant=True, table=True),
            q(f"gpuwise_watch_window_seconds{{{SEL}}}", instant=True, table=True)],
              desc="Each watched job: host, GPUs, gpuwise version, start time, and the window "
                   "its gauges and verdict cover.",
              transformations=[{"id": "merge", "options": {}}, {"id": "organize", "options": {
                  "excludeByName": {"Time": True, "__name__": True},
                  "renameByName": {"Value #A": "started", "Value #B": "window (s)"}}}]),
    )
    g.panels[-1]["fieldConfig"]["overrides"] = [{
        "matcher": {"id": "byName", "options": "started"},
        "properties": [{"id": "unit", "value": "dateTimeAsIso"}]}]
    g.line(5, panel("table", "GPUs", 24, [q(f"gpuwise_watch_gpu_info{{{SEL}}}", instant=True,
                                            table=True)],
                    desc="The GPUs each job was watched on (NVML's index and name).",
                    transformations=[{"id": "organize", "options": {"excludeByName": {
                        "Time": True, "__name__": True, "Value": True}}}]))
    return g.panels


def variable(name: str, query: str) -> dict[str, Any]:
    return {"name": name, "label": name, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": name}, "definition": query, "multi": True,
            "includeAll": True, "allValue": ".*", "current": {}, "refresh": 2, "sort": 1,
            "options": []}


def dashboard() -> dict[str, Any]:
    return {
        "title": "gpuwise watch", "uid": "gpuwise-watch",
        "description": "Training jobs under `gpuwise watch --prometheus`: verdict, step time, "
                       "devices, memory, energy, ranks (docs/watch.md).",
        "tags": ["gpuwise", "training", "gpu"], "editable": True, "graphTooltip": 1,
        "schemaVersion": 39, "version": 1, "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s", "timezone": "browser", "annotations": {"list": []}, "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "options": []},
            variable("job", "label_values(gpuwise_watch_job_info, job)"),
            variable("host", 'label_values(gpuwise_watch_job_info{job=~"$job"}, host)'),
        ]},
        "panels": panels(),
    }


def text() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else TARGET
    out.write_text(text())
    print(out)
