"""A report page and where it goes: `Page` (what `render_page` takes) and `write_page`, which
writes only to a new file, an empty one, or a gpuwise HTML report (gpuwise.files)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwise.files import own_output, replace_atomically
from gpuwise.report.html.page import Section, is_report, render_page

WHAT = "HTML report"
HINT = "name a new file, e.g. --html report.html (gpuwise replaces only its own reports)"


@dataclass(frozen=True)
class Page:
    """Everything one report shows; `data` is the command's JSON record (the page carries it)."""

    title: str
    sections: tuple[Section, ...]
    data: dict[str, Any] = field(default_factory=dict)
    subtitle: str = ""

    def render(self) -> bytes:
        return render_page(self.title, self.sections, self.data, self.subtitle)


def check_output(path: str | os.PathLike[str]) -> Path:
    """`path` when a report may be written there (checked before the work, not after)."""
    return own_output(path, is_report, WHAT, HINT)


def write_page(path: str | os.PathLike[str], page: Page) -> int:
    """Render `page` and write it to `path` atomically; the bytes written."""
    target = check_output(path)
    body = page.render()
    replace_atomically(target, body, WHAT, HINT)
    return len(body)
