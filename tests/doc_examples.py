"""The command lines of the docs' shell blocks, read as a user reads them, and the files their
placeholders name, made for real (`tests/test_doc_examples.py` runs them).

How a block becomes commands (each rule is the plain reading of the docs' notation):

1. Blocks: fenced ```sh, ```bash, ```shell or ```console in README.md and docs/*.md.
2. A block with `$ ` prompts is a session: only the `$ ` lines are commands, the rest output.
3. A block starting with `#!` is one script, one example, named `script: <its first line>`.
4. Lines: `\\` continuations joined, a `# comment` (a `#` at a word's start, outside quotes)
   stripped, runs of spaces made one.
5. `a && b`, `a; b` are two commands; `a | gpuwise b` is the docs' "either" (two commands);
   any other `|` is a real pipe. A line starting with `for`, `while` or `if` stays whole.
6. Optional parts `[--opt ...]` (a `[` starting a word, outside quotes) give two variants: the
   plain form (all dropped) and the full form (all kept). A lone `...` word (the user's own
   arguments) is dropped, and the word `FILE` is `report.html`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHELL_LANGS = ("sh", "bash", "shell", "console")
FENCE = re.compile(r"^\s*```(\S*)")
COMPOUND = ("for ", "while ", "if ")


@dataclass(frozen=True)
class DocCommand:
    """One command of a doc's shell block: where it is and its text as extracted."""

    doc: str
    line: int
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def fenced_blocks(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line number of the block's first line, language, its lines) for every fenced block."""
    lang, start, body = None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match and lang is None:
            lang, start, body = match.group(1), number + 1, []
        elif match:
            yield start, lang, body
            lang = None
        elif lang is not None:
            body.append(line)


def _outside_quotes(text: str) -> Iterator[tuple[int, str]]:
    """(index, character) of the characters of `text` that are outside shell quotes."""
    quote = ""
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        else:
            yield i, char


def strip_comment(line: str) -> str:
    for i, char in _outside_quotes(line):
        if char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def logical_lines(start: int, lines: list[str]) -> Iterator[tuple[int, str]]:
    """(line number, text) with `\\` continuations joined and comments stripped."""
    pending, first = "", start
    for number, raw in enumerate(lines, start):
        if not pending:
            first = number
        line = strip_comment(raw).strip()
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        joined = " ".join((pending + line).split())
        pending = ""
        if joined:
            yield first, joined


def split_commands(text: str) -> list[str]:
    """Rule 5: `&&`, `;` and `| gpuwise` separate commands (outside quotes)."""
    if text.startswith(COMPOUND):
        return [text]
    cuts: list[tuple[int, int]] = []
    for i, char in _outside_quotes(text):
        if text.startswith("&&", i):
            cuts.append((i, i + 2))
        elif char == ";" or char == "|" and re.match(r"\|\s*(\S*/)?gpuwise\b", text[i:]):
            cuts.append((i, i + 1))
    parts, at = [], 0
    for begin, end in cuts:
        parts.append(text[at:begin])
        at = end
    parts.append(text[at:])
    return [" ".join(p.split()) for p in parts if p.strip()]


def commands_in_block(start: int, lines: list[str]) -> list[tuple[int, str]]:
    """Rules 2-5: the commands of one shell block, with their line numbers."""
    if lines and lines[0].startswith("#!"):
        return [(start, "script: " + " ".join(lines[1].split()))]
    if any(line.startswith("$ ") for line in lines):
        numbered = [(n, line[2:]) for n, line in enumerate(lines, start) if line.startswith("$ ")]
        lines_out = [(n, " ".join(strip_comment(text).split())) for n, text in numbered]
    else:
        lines_out = list(logical_lines(start, lines))
    return [(n, part) for n, text in lines_out for part in split_commands(text)]


def doc_commands() -> list[DocCommand]:
    """Every command of every shell block of README.md and docs/*.md, in the docs' order."""
    found = []
    for path in doc_files():
        name = str(path.relative_to(REPO))
        for start, lang, lines in fenced_blocks(path.read_text()):
            if lang in SHELL_LANGS:
                found += [DocCommand(name, n, text) for n, text in commands_in_block(start, lines)]
    return found


def untagged_command_blocks() -> list[str]:
    """Blocks without a language whose lines look like commands: they would escape the run."""
    looks_like_command = re.compile(r"^\s*(\$ |gpuwise\s|\.venv/bin/|pip install )")
    found = []
    for path in doc_files():
        for start, lang, lines in fenced_blocks(path.read_text()):
            if not lang and any(looks_like_command.match(line) for line in lines):
                found.append(f"{path.relative_to(REPO)}:{start}")
    return found


def _optional_groups(text: str) -> list[tuple[int, int]]:
    """(start, end) of every `[...]` that starts a word outside quotes (rule 6)."""
    groups, depth, begin = [], 0, 0
    for i, char in _outside_quotes(text):
        if char == "[" and (depth or i == 0 or text[i - 1].isspace()):
            begin = i if depth == 0 else begin
            depth += 1
        elif char == "]" and depth:
            depth -= 1
            if depth == 0:
                groups.append((begin, i + 1))
    return groups


def variants(text: str) -> list[str]:
    """Rule 6: the plain and the full form of a command with optional parts, else itself."""
    groups = _optional_groups(text)
    plain, full, at = [], [], 0
    for begin, end in groups:
        plain.append(text[at:begin])
        full.append(text[at:begin] + text[begin + 1 : end - 1])
        at = end
    plain.append(text[at:])
    full.append(text[at:])
    forms = [_concrete("".join(plain)), _concrete("".join(full))] if groups else [_concrete(text)]
    return list(dict.fromkeys(forms))


def _concrete(text: str) -> str:
    words = [("report.html" if w == "FILE" else w) for w in text.split() if w != "..."]
    return " ".join(words)


def gpuwise_args(command: str) -> list[str] | None:
    """The arguments after `gpuwise` (with any `VAR=value` and path before it), else None."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]
    if words and Path(words[0]).name == "gpuwise":
        return words[1:]
    return None
