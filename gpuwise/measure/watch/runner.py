"""Run a command under watch: start it with the injection hook on its PYTHONPATH, sample it
until it exits, forward signals, and write everything to one JSONL log.

The command keeps its stdin, stdout and stderr (inherited, untouched) and its exit status;
whatever goes wrong in the watcher is logged and the command runs on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.files import own_output, write_failed
from gpuwise.measure.watch.inject._gpuwise_watch_recorder import LOG_ENV, JsonlLog
from gpuwise.measure.watch.log import WHAT, is_watch_log
from gpuwise.measure.watch.sampler import Sampler

INJECT_DIR = Path(__file__).parent / "inject"
# SIGINT from the terminal already reaches the command (same process group): see _forward.
FORWARDED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2")
                  if hasattr(signal, name))
Tick = Callable[[Sampler], None]


@dataclass(frozen=True)
class WatchedRun:
    exit_code: int  # the command's; -N when a signal N ended it (as subprocess reports it)
    log_path: Path
    wall_s: float


def child_env(log_path: Path, inject: bool, sync: bool = True) -> dict[str, str]:
    """The command's environment: the log's path, and the start-up hook unless --no-inject."""
    env = dict(os.environ)
    env[LOG_ENV] = str(log_path.resolve())
    env["GPUWISE_WATCH_INJECT"] = "1" if inject else "0"
    env["GPUWISE_WATCH_SYNC"] = "1" if sync else "0"
    if inject:
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(INJECT_DIR) + (os.pathsep + path if path else "")
    return env


def run_watched(cmd: Sequence[str], log_path: Path, *, interval_s: float = 0.2,
                inject: bool = True, sync: bool = True, tick: Tick | None = None,
                tick_s: float = 0.5, env: dict[str, str] | None = None,
                on_start: Callable[[], None] | None = None) -> WatchedRun:
    """Run `cmd` to completion under the sampler; `tick` is called every `tick_s` seconds,
    `on_start` once the log is open and the command started; `env` is added to the
    command's environment."""
    if not cmd:
        raise GpuwiseError("no command to watch", "gpuwise watch -- python train.py ...")
    log = _open_log(log_path)
    start = time.monotonic()
    try:
        child = subprocess.Popen(list(cmd), env={**child_env(log_path, inject, sync),
                                                 **(env or {})})
    except OSError as exc:
        log.close()
        raise GpuwiseError(f"cannot run {cmd[0]!r}: {exc.strerror}",
                           "check the command after `--`") from exc
    sampler = _start_sampler(log, child.pid, interval_s, list(cmd), inject)
    if on_start is not None:
        try:
            on_start()
        except Exception as exc:  # the watcher failing must not stop the job
            with contextlib.suppress(OSError):
                log.write({"kind": "note", "text": f"on start: {exc!r}"})
    with _forwarding_signals(child):
        code = _wait(child, sampler, tick, tick_s)
    if sampler is not None:
        sampler.stop()
    with contextlib.suppress(OSError):  # a full disk: the job's exit code matters more
        log.write({"kind": "end", "t": time.time(), "exit_code": code})
    log.close()
    return WatchedRun(code, log_path, time.monotonic() - start)


def _open_log(path: Path) -> JsonlLog:
    """A fresh log: a new file, or the old log of an earlier watch (never another file)."""
    hint = "choose another path with --log PATH"
    own_output(path, is_watch_log, WHAT, hint)
    try:
        path.write_bytes(b"")  # steps are appended by the command's processes
        return JsonlLog(str(path))
    except OSError as exc:
        raise write_failed(exc, path, WHAT, hint) from None


def _start_sampler(log: JsonlLog, pid: int, interval_s: float, cmd: list[str],
                   inject: bool) -> Sampler | None:
    try:
        sampler = Sampler(log, pid, interval_s)
        log.write(sampler.header(cmd, inject, source="gpuwise watch"))
        sampler.start()
        return sampler
    except Exception as exc:  # the watcher failing must not stop the job
        with contextlib.suppress(OSError):
            log.write({"kind": "note", "text": f"sampler did not start: {exc!r}"})
        return None


def _wait(child: subprocess.Popen[bytes], sampler: Sampler | None, tick: Tick | None,
          tick_s: float) -> int:
    while True:
        try:
            return child.wait(timeout=tick_s)
        except subprocess.TimeoutExpired:
            pass
        if tick is not None and sampler is not None:
            try:
                tick(sampler)
            except Exception:
                tick = None  # a broken live view goes quiet; the job goes on


@contextlib.contextmanager
def _forwarding_signals(child: subprocess.Popen[bytes]) -> Iterator[None]:
    def forward(signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and _terminal_sends_to(child.pid):
            return  # Ctrl-C at the terminal reached the command already
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _terminal_sends_to(pid: int) -> bool:
    """Whether the controlling terminal's foreground group holds the command."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgid(pid)
    except OSError:
        return False
    finally:
        os.close(fd)
