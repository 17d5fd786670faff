"""What `--html FILE` costs, measured side by side in one run.

1. In process, cold (as every command runs: a fresh interpreter pays plotly's compression
   once): building, rendering and writing the `infer` report of a plan with its per-op table
   (llama-3.1-8b on an H100: roofline of prefill and decode, memory, speed, the op table),
   split into the page's figures (with the imports of the report modules) and rendering (the
   inlined plotly, gzip + base64) with the write; and the file's size. Target: under 1 s, under 5 MB.
2. The same command as users run it, in fresh processes, interleaved: `gpuwise infer ...
   --ops --json` plain and with `--html`, REPEAT times each; the medians and their difference.
3. The plain path: the modules `import gpuwise.cli` and a plain `infer --json` load (none of
   plotly or gpuwise.report.html may be among them).

Run:  .venv/bin/python benchmarks/html_report_speed.py [--repeat 5]
The latest result: benchmarks/results/html_report_speed.json (docs/reports.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULT = REPO / "benchmarks" / "results" / "html_report_speed.json"
ARGS = ["infer", "llama-3.1-8b", "--on", "h100", "--ops", "--json"]

IN_PROCESS = """
import json, sys, time
t0 = time.perf_counter()
from gpuwise.app.infer import infer
from gpuwise.app.lookup import hardware_named, model_named
from gpuwise.app.roofs import roofs_for
from gpuwise.workload.plans import InferencePlan
resolved, arch = model_named("llama-3.1-8b")
answer = infer(resolved, arch, hardware_named("h100"), InferencePlan())
t1 = time.perf_counter()
from gpuwise.report.html import pages
from gpuwise.report.html.output import write_page
page = pages.infer_page(answer, roofs_for(answer.hardware))
t2 = time.perf_counter()
size = write_page(sys.argv[1], page)
t3 = time.perf_counter()
print(json.dumps({"estimate_s": t1 - t0, "figures_s": t2 - t1, "render_and_write_s": t3 - t2,
                  "report_s": t3 - t1, "bytes": size, "figures": page.figure_count,
                  "ops_rows": sum(len(s.table) - 1 for s in page.sections if s.table)}))
"""

PLAIN_MODULES = """
import sys
from gpuwise.cli import main
try:
    main(["infer", "llama-3.1-8b", "--on", "h100", "--json"])
except SystemExit:
    pass
print("\\n" + repr(sorted(m for m in sys.modules if m.startswith(("plotly", "gpuwise.report.html")))))
"""


def _cold_report(work: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", IN_PROCESS, str(work / "cold.html")],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _command_s(extra: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "from gpuwise.cli import main; main()", *ARGS, *extra], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cold = [_cold_report(work) for _ in range(opts.repeat)]
        plain, with_html = [], []
        for i in range(opts.repeat):  # interleaved: the machine's load hits both alike
            plain.append(_command_s([]))
            with_html.append(_command_s(["--html", str(work / f"r{i}.html")]))
    modules = subprocess.run([sys.executable, "-c", PLAIN_MODULES], capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[-1]
    report_s = statistics.median(c["report_s"] for c in cold)
    result = {
        "command": "benchmarks/html_report_speed.py --repeat " + str(opts.repeat),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "report_s_median": report_s,
        "figures_s_median": statistics.median(c["figures_s"] for c in cold),
        "render_and_write_s_median": statistics.median(c["render_and_write_s"] for c in cold),
        "bytes": cold[0]["bytes"], "figures": cold[0]["figures"], "ops_rows": cold[0]["ops_rows"],
        "plain_command_s_median": statistics.median(plain),
        "html_command_s_median": statistics.median(with_html),
        "html_adds_s": statistics.median(with_html) - statistics.median(plain),
        "plain_path_plotting_modules": modules,
    }
    print(f"infer report with {result['ops_rows']} op rows, {result['figures']} figures: "
          f"{report_s:.3f} s cold (figures {result['figures_s_median']:.3f} s, render and write "
          f"{result['render_and_write_s_median']:.3f} s), {result['bytes'] / 2**20:.2f} MiB")
    print(f"gpuwise {' '.join(ARGS)}: {result['plain_command_s_median']:.2f} s plain, "
          f"{result['html_command_s_median']:.2f} s with --html (+{result['html_adds_s']:.2f} s)")
    print(f"plotting modules on the plain path: {modules}")
    RESULT.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
