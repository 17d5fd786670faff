"""Run gpuwise's command line in-process: its exit code and what it printed."""

from __future__ import annotations

import pytest

from gpuwise.cli import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = 0
    try:
        main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
