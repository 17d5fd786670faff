"""Time estimates from catalogue specs and default efficiencies vs published GPU measurements
(../shared/validation/published.json, or the path given). Nothing is fitted to these entries.

Every estimate is what `gpuwise infer MODEL --on DEVICE ... --json` answers (the decode time,
and the device rates of its record), as users run it.

Run:  .venv/bin/python benchmarks/validate_published.py [path/to/published.json]
Target (issue 3): median absolute error <= 15%.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from public_cli import gpuwise_json

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "validation" / "published.json"
HARDWARE = {"A100-SXM4-80GB": "a100-sxm-80gb", "A100-SXM": "a100-sxm-80gb",
            "H100-SXM": "h100-sxm", "MI300X": "mi300x"}


def _hardware(text: str) -> str:
    for key, hw in HARDWARE.items():
        if key in text:
            return hw
    raise KeyError(text)


def _weights(text: str) -> str:
    return text.split()[0]


def infer(model: str, device: str, *options: str) -> dict:
    """`gpuwise infer MODEL --on DEVICE OPTIONS --json`: the answer's time record."""
    return gpuwise_json("infer", model, "--on", device, *options)["time"]


def device_rates(device: str) -> dict:
    """The datasheet rates with default efficiencies that `infer --on DEVICE` estimates from."""
    return infer("gpt2", device, "--new-tokens", "1")["device_rates"]


def decode_rows(entries: list[dict]) -> list[dict]:
    rows = []
    for e in entries:
        tp = e.get("tensor_parallel", 1)
        t = infer(e["model"].lower(), _hardware(e["hardware"]), "--batch", str(e["batch"]),
                  "--prompt", str(e.get("prompt_tokens", 5)), "--new-tokens", "200",
                  "--weights", _weights(e["weights"]), "--runtime", "compiled", "--tp", str(tp))
        est = t["tokens_per_s"]
        rows.append({"what": f"decode {e['model']} {e['weights']} tp{tp}",
                     "estimated": est, "published": e["tokens_per_s"], "unit": "tok/s",
                     "error": est / e["tokens_per_s"] - 1, "bound": t["bound"]["decode"]})
    return rows


def gemm_rows(entries: list[dict]) -> list[dict]:
    rows = []
    for e in entries:
        rates = device_rates(_hardware(e["hardware"]))
        assert rates["matmul_size"] == 8192  # the published GEMMs' size
        est = rates["matmul_flops_per_s"]["bf16"] / 1e12
        rows.append({"what": f"bf16 matmul {e['hardware']}", "estimated": est,
                     "published": e["achieved_TFLOPS"], "unit": "TFLOP/s",
                     "error": est / e["achieved_TFLOPS"] - 1})
    return rows


def bandwidth_rows(entries: list[dict]) -> list[dict]:
    rows = []
    for e in entries:
        if "A100" in e["hardware"]:
            est = device_rates("a100-sxm-80gb")["memory_bytes_per_s"] / 1e9
            rows.append({"what": "HBM bandwidth A100-SXM4-80GB", "unit": "GB/s",
                         "estimated": est, "published": 1700.0, "error": est / 1700.0 - 1})
        elif "NVLink" in e["hardware"]:
            est = device_rates("h100-sxm")["interconnect_bytes_per_s"] * 2 / 1e9
            rows.append({"what": "NVLink4 peer-to-peer (bidirectional)", "unit": "GB/s",
                         "estimated": est, "published": e["measured_GB_per_s_bidirectional"],
                         "error": est / e["measured_GB_per_s_bidirectional"] - 1})
    return rows


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    data = json.loads(path.read_text())
    rows = (decode_rows(data["decode"]) + gemm_rows(data["gemm"])
            + bandwidth_rows(data["bandwidth"]))
    print(f"{'entry':52s} {'estimated':>10s} {'published':>10s} {'unit':8s} {'error':>7s}")
    for r in rows:
        print(
            f"{r['what']:52s} {r['estimated']:10.1f} {r['published']:10.1f} {r['unit']:8s} "
            f"{100 * r['error']:+6.1f}%"
        )
    errors = [abs(r["error"]) for r in rows]
    print(
        f"median |error| {100 * statistics.median(errors):.1f}% over {len(rows)} entries; "
        f"worst {100 * max(errors):.1f}%"
    )


if __name__ == "__main__":
    main()
