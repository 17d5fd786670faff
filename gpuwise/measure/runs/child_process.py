"""Run a measurement job in a fresh Python process: the job as JSON on stdin, the result as one
JSON line on stdout, so that runs do not pollute each other's allocator state, caches or
high-water marks.

The parent starts the child (`python -m <child module>`) with the host allocator the job names:
as users start a process (glibc's defaults: a real run's memory and time), glibc pinned so that
the resident set tracks live tensors (`LIVE_TENSORS_ENV`: module runs, and the "live tensors"
reading beside a real run), or another allocator preloaded (see `memory_run`'s docstring). The child keeps stdout for its one result line and sends everything
the libraries print to stderr, whose last lines the parent quotes when the child fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from gpuwise.catalog.allocators import allocator_choice

# glibc pinned: every block of 64 KiB or more mapped on its own and unmapped when freed, the
# heap's top given back at once (catalog/data/allocators.toml [choice-glibc-mmap64k]).
LIVE_TENSORS_ENV = allocator_choice("glibc-mmap64k").env_vars
CHILD_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
}
_STDERR_LINES = 10
_ERROR_CHARS = 400


def run_child(job: dict, timeout_s: float, allocator_env: bool = True,
              child: str = "gpuwise.measure.runs.memory_run",
              malloc_env: dict[str, str] | None = None) -> dict:
    """Run one job in a fresh process (`python -m child`) and return its result record.

    `allocator_env` sets the malloc variables that make the resident set track live tensors
    (`LIVE_TENSORS_ENV`); otherwise glibc's tuning variables the parent has are left out, and
    the allocator is as users start it, or as `malloc_env` sets it (LD_PRELOAD included).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(CHILD_ENV)
    if allocator_env:
        env.update(LIVE_TENSORS_ENV)
    env.update(malloc_env or {})
    # The child must import this very package, installed or not.
    package_root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    what = f"real {job['kind']} run of {job['config'].get('model_type')} on {job['device']}"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", child],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = (
            exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        )
        raise RuntimeError(f"{what} took longer than {timeout_s:g} s{_tail(stderr)}") from None
    result = last_json_line(proc.stdout)
    if proc.returncode != 0 or result is None or "error" in result:
        reason = result["error"] if result and "error" in result else f"exit code {proc.returncode}"
        raise RuntimeError(f"{what} failed: {reason}{_tail(proc.stderr)}")
    return result


def last_json_line(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    return None


def _tail(stderr: str | None) -> str:
    lines = [line for line in (stderr or "").splitlines() if line.strip()][-_STDERR_LINES:]
    return "\n  child stderr (last lines):\n    " + "\n    ".join(lines) if lines else ""


def child_main(run_job: Callable[[dict], dict], check: Callable[..., object] | None = None) -> int:
    """The child process: the job from stdin, `run_job`'s result as one JSON line on stdout.
    `check(**result)` must succeed for a job that measures memory (not time): the parent
    builds its record from the result, so a result it could not build fails here."""
    # Keep stdout for the one result line: anything the libraries print goes to stderr.
    result_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        job = json.loads(sys.stdin.read())
        result = run_job(job)
        if check is not None and job.get("measure") != "time":
            check(**result)
        payload, code = json.dumps(result), 0
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent as text
        import traceback

        traceback.print_exc()
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        if len(message) > _ERROR_CHARS:
            message = message[: _ERROR_CHARS - 3] + "..."
        payload, code = json.dumps({"error": message}), 1
    result_out.write(payload + "\n")
    result_out.flush()
    return code
