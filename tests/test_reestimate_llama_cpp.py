"""docs/speed.md's re-estimated llama.cpp figure is what benchmarks/reestimate_llama_cpp.py
gives from the saved probe and timings (a time-model change that moves it fails here until
the docs say so)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_figure_is_the_scripts():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "reestimate_llama_cpp.py")],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    last = out.strip().splitlines()[-1]
    assert last.startswith("48 cases: median |error|")
    assert last in (ROOT / "docs" / "speed.md").read_text()
