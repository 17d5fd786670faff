"""A server's command line in a config file (`vllm serve ...`, `python -m sglang.launch_server
...`, `llama-server ...`): its words, the program it starts, its environment and its flags.
Pure word handling; the readers place each setting (reading.py)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from gpuwise.errors import GpuwiseError


def command_words(text: str) -> list[str]:
    """The words of the server's command in the file (`vllm serve ...`): `\\` continuations
    joined, comments, blank lines and other commands (`export ...`, `cd ...`) left out; [] if
    none starts a server. Two servers' commands are refused (which would it be?)."""
    joined = re.sub(r"\\\r?\n", " ", text)
    commands, exported = [], []
    for line in joined.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # not a shell line: YAML, JSON
            continue
        if program(words) is not None:
            commands.append(words)
        elif words[:1] == ["export"]:  # read as the command's own VAR=value words
            exported += [w for w in words[1:] if "=" in w]
    if len(commands) > 1:
        raise GpuwiseError(f"the file holds {len(commands)} server commands; gpuwise reads one",
                           "keep the server's command alone in the file")
    return exported + commands[0] if commands else []


def environment(words: tuple[str, ...]) -> dict[str, str]:
    """The `NAME=value` assignments a command line starts with (and the file's exports)."""
    return dict(w.split("=", 1) for w in words[:_environment(words)])


# The servers whose command lines gpuwise reads, by how they are started: `vllm serve`,
# `python -m <module>`, or the executable itself. Looked up, never compared: the readers are
# named as the runtimes they start.
SUBCOMMANDS = {("vllm", "serve"): "vllm"}
MODULES = {"vllm.entrypoints.openai.api_server": "vllm", "sglang.launch_server": "sglang",
           "sglang_router.launch_server": "sglang"}
EXECUTABLES = {"llama-server": "llama-server"}


def program(words: list[str] | tuple[str, ...]) -> str | None:
    """Which server a command line starts ("vllm", "sglang", "llama-server"), else None.
    Environment assignments (`CUDA_VISIBLE_DEVICES=0 vllm serve ...`) come first."""
    rest = words[_environment(words):]
    if not rest:
        return None
    exe = rest[0].rsplit("/", 1)[-1].removesuffix(".exe")
    if len(rest) > 1 and (exe, rest[1]) in SUBCOMMANDS:
        return SUBCOMMANDS[(exe, rest[1])]
    if exe.startswith("python") and len(rest) > 2 and rest[1] == "-m":
        return MODULES.get(rest[2])
    return EXECUTABLES.get(exe)


def _environment(words: list[str] | tuple[str, ...]) -> int:
    """How many `NAME=value` words start the command."""
    i = 0
    while i < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]):
        i += 1
    return i


def arguments(words: tuple[str, ...]) -> tuple[str, ...]:
    """The words after the program (and vLLM's `serve`, python's `-m module`)."""
    i = _environment(words)
    exe = words[i].rsplit("/", 1)[-1].removesuffix(".exe")
    skip = 3 if exe.startswith("python") else 1 if exe in EXECUTABLES else 2
    return words[i + skip:]


def parse_flags(args: Iterable[str], bools: frozenset[str],
                names: Mapping[str, str]) -> tuple[list[str], dict[str, Any]]:
    """A command line's positional words and its flags as {long name: value} in order given.
    `bools` are the flags that take no value, `names` maps short or alias names to the long
    one. An unknown flag takes the next word as its value unless that word is a flag."""
    positional: list[str] = []
    flags: dict[str, Any] = {}
    words = list(args)
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or re.match(r"^-\d", word):
            positional.append(word)
            continue
        raw, eq, value = word.partition("=")
        key = names.get(raw.lstrip("-"), raw.lstrip("-")).replace("_", "-")
        key = names.get(key, key)
        if eq:
            flags[key] = value
        elif key in bools:
            flags[key] = True
        elif i < len(words) and (not words[i].startswith("-") or re.match(r"^-\d", words[i])):
            flags[key] = words[i]
            i += 1
        else:
            flags[key] = True
    return positional, flags
