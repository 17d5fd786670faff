"""Every section a file cites still exists, and the docs stay reference pages.

Code and data cite the docs by page and section: `docs/speed.md, "llama.cpp on this CPU"`
(also `docs/X.md "Title"`, `docs/X.md ("Title"`, single quotes, `'A' and 'B'`, a title broken
over comment or docstring lines, or split across Python string literals). The reference pages
point at the evidence beside the results the same way: `Evidence:
benchmarks/results/evidence/speed.md, "..."`. Each cited page must exist and have a heading
whose title is the cited one (or starts with it followed by ` (` or `:`, as in
`## Schedulers (`catalog/data/schedulers.toml`)`).

Reference pages stay short (docs/architecture.md, "Docs and evidence"): every docs/*.md and
every evidence page is at most MAX_LINES lines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("gpuwise", "tests", "benchmarks", "tools", "docs")
SUFFIXES = {".py", ".toml", ".md", ".sh", ".c", ".yml", ".yaml", ".json"}
SKIPPED = ("benchmarks/results", "benchmarks/data")  # records of runs and sources, not citations
MAX_LINES = 400

PAGE = re.compile(r"(?P<page>(?:docs|benchmarks/results/evidence)/[a-z_]+\.md)")
# After the page: `, "Title"`, ` "Title"`, ` ("Title"`; then more titles as `and "Title"`.
QUOTED = r"""(?:"(?P<dq>[^"]{1,200})"|'(?P<sq>(?:[^']|'(?=[a-z])){1,200})')"""  # `'s` inside '...'
TITLE = re.compile(r"(?:,\s*|\s*\(\s*|\s+)" + QUOTED)
MORE = re.compile(r"\s+and\s+" + QUOTED)


def flattened(text: str) -> str:
    """The text with escaped quotes plain, split string literals joined, and lines joined
    (comment markers and indentation dropped), so that a citation reads as one line."""
    text = text.replace('\\"', '"')
    text = re.sub(r'"[ \t]*\n[ \t]*"', "", text)  # "...docs/x.md, "\n    "\"Title\")"
    return re.sub(r"[ \t]*\n[ \t]*(?:#+[ \t]*|//[ \t]*|\*[ \t]+)?", " ", text)


def citations(text: str) -> list[tuple[str, str]]:
    """(page, section title) for every quoted section citation in `text`."""
    found = []
    flat = flattened(text)
    for match in PAGE.finditer(flat):
        title = TITLE.match(flat, match.end())
        while title:
            found.append((match["page"], title["dq"] or title["sq"]))
            title = MORE.match(flat, title.end())
    return found


def headings(page: Path) -> list[str]:
    """The titles of a Markdown page's headings (outside fenced blocks)."""
    titles, fenced = [], False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.+?)\s*#*\s*$", line)):
            titles.append(m.group(1))
    return titles


def has_heading(page: Path, title: str) -> bool:
    return any(h == title or h.startswith((title + " (", title + ":")) for h in headings(page))


def cited_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if (
                path.is_file()
                and path.suffix in SUFFIXES
                and not rel.startswith(SKIPPED)
                and "__pycache__" not in rel
                and path != Path(__file__)
            ):
                files.append(path)
    files += sorted((ROOT / "benchmarks/results/evidence").glob("*.md"))
    return files


def broken_citations(files: list[Path]) -> list[str]:
    broken = []
    for path in files:
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for page, title in citations(path.read_text(errors="replace")):
            target = ROOT / page
            if not target.is_file():
                broken.append(f"{name}: {page} does not exist")
            elif not has_heading(target, title):
                broken.append(f'{name}: {page} has no heading "{title}"')
    return broken


def test_the_parser_reads_every_form_of_citation():
    text = """
    (docs/speed.md, "How far to trust a
    time")  # docs/memory.md, 'On a CPU' and 'Why two processes of one run differ'
    # docs/speed.md, 'Fixed costs: the eager runtime's dispatch'
    # efficiency (docs/speed.md ("Rates
    # from the datasheet") and docs/memory.md "On a CPU".
    "reinstall (docs/speed.md, "
    "\\"llama.cpp on this CPU\\")"
    see docs/serve.md for more; Evidence: benchmarks/results/evidence/speed.md, "What a profile shows".
    """
    assert citations(text) == [
        ("docs/speed.md", "How far to trust a time"),
        ("docs/memory.md", "On a CPU"),
        ("docs/memory.md", "Why two processes of one run differ"),
        ("docs/speed.md", "Fixed costs: the eager runtime's dispatch"),
        ("docs/speed.md", "Rates from the datasheet"),
        ("docs/memory.md", "On a CPU"),
        ("docs/speed.md", "llama.cpp on this CPU"),
        ("benchmarks/results/evidence/speed.md", "What a profile shows"),
    ]


def test_a_bogus_citation_is_caught(tmp_path: Path):
    fake = tmp_path / "fake.py"
    fake.write_text(
        '"""As docs/speed.md, "No such section" says; docs/nopage.md, "The probe"."""\n'
    )
    assert broken_citations([fake]) == [
        f'{fake}: docs/speed.md has no heading "No such section"',
        f"{fake}: docs/nopage.md does not exist",
    ]


def test_every_cited_section_exists():
    broken = broken_citations(cited_files())
    assert not broken, "citations of sections that do not exist:\n" + "\n".join(broken)


def test_the_files_cite_sections():
    """The scan finds the citations it is meant to check (a broken parser finds none)."""
    cited = {c for path in cited_files() for c in citations(path.read_text(errors="replace"))}
    assert len(cited) >= 20
    assert ("docs/speed.md", "llama.cpp on this CPU") in cited


@pytest.mark.parametrize("page", sorted([*(ROOT / "docs").glob("*.md"),
                                         *(ROOT / "benchmarks/results/evidence").glob("*.md")]),
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_pages_are_at_most_400_lines(page: Path):
    lines = len(page.read_text().splitlines())
    assert lines <= MAX_LINES, (
        f"{page.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES}): move measurement "
        "logs, per-case tables and discussions of runs to benchmarks/results/evidence/"
    )
