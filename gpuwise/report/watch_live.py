"""The live line of `gpuwise watch` on a terminal: the bottom row, kept out of the way.

The command writes to the same terminal, so the line cannot simply be redrawn in place
(rich's Live would mix with, and erase, the command's output). Instead the terminal's
scrolling region is set to every row but the last, as apt does for its progress bar: the
command's output scrolls above, the line stays below, and it is all undone at the end.
"""

from __future__ import annotations

import collections
import os
import shutil
import statistics
import time
from typing import IO, Any

from rich.console import Console
from rich.text import Text

from gpuwise.units import format_bytes

SAVE, RESTORE = "\0337", "\0338"


class LiveLine:
    """Feed it the log's new records and the latest sample; it redraws the bottom row."""

    def __init__(self, stream: IO[str], recent: int = 20) -> None:
        self.stream = stream
        self.started = time.monotonic()
        self.steps: collections.deque[dict[str, Any]] = collections.deque(maxlen=recent)
        self.count = 0
        self.rows = 0

    def start(self) -> None:
        self.rows = _size(self.stream).lines
        if self.rows > 2:  # room for the line: scroll once, then fence the last row off
            self.stream.write(f"\n{SAVE}\033[1;{self.rows - 1}r{RESTORE}\033[1A")
            self.stream.flush()

    def update(self, records: list[dict[str, Any]], sample: dict[str, Any] | None) -> None:
        for rec in records:
            if rec.get("kind") == "step":
                self.steps.append(rec)
                self.count += 1
        size = _size(self.stream)
        if size.lines != self.rows:
            self.stop()
            self.start()  # the terminal was resized
        if self.rows <= 2:
            return
        console = Console(file=self.stream, width=size.columns, force_terminal=True)
        with console.capture() as captured:
            console.print(status_text(self, sample), end="", overflow="crop", no_wrap=True)
        self.stream.write(f"{SAVE}\033[{self.rows};1H\033[2K{captured.get()}{RESTORE}")
        self.stream.flush()

    def stop(self) -> None:
        if self.rows > 2:
            self.stream.write(f"{SAVE}\033[1;{self.rows}r\033[{self.rows};1H\033[2K{RESTORE}")
            self.stream.flush()


def _size(stream: IO[str]) -> os.terminal_size:
    """The size of the terminal the line is drawn on (stdout may be redirected)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return shutil.get_terminal_size()
    return size if size.lines else shutil.get_terminal_size()  # a pty with no size set


def status_text(live: LiveLine, sample: dict[str, Any] | None) -> Text:
    """`watch 1m05s | 120 steps 41.2 ms | data 63% | GPU 31% 212 W | CPU 180% | 3.1 GiB`."""
    elapsed = int(time.monotonic() - live.started)
    text = Text(f"watch {elapsed // 60}m{elapsed % 60:02d}s", style="bold")
    if live.steps:
        step = statistics.median(s["step_s"] for s in live.steps)
        data = sum(s.get("data_s", 0) + s.get("h2d_s", 0) for s in live.steps)
        share = data / max(sum(s["step_s"] for s in live.steps), 1e-12)
        text.append(f" | {live.count} steps {1e3 * step:.1f} ms | ")
        text.append(f"data {share:.0%}", style="red" if share >= 0.2 else "green")
    else:
        text.append(" | waiting for the first step")
    if sample:
        for gpu in sample.get("gpus") or []:
            util, power = gpu.get("util_percent"), gpu.get("power_w")
            text.append(f" | GPU{gpu.get('index')} {'NA' if util is None else f'{util}%'}")
            if power is not None:
                text.append(f" {power:.0f} W")
        cores = sample.get("per_core") or []
        text.append(f" | CPU {sum(cores):.0f}%/{100 * len(cores)}%")
        if sample.get("rss_bytes") is not None:
            text.append(f" | RSS {format_bytes(sample['rss_bytes'])}")
    return text
