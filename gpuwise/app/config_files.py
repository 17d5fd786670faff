"""`--config FILE`: the user's own config file read, its format told from its content (or
`--config-format`), and what a command takes of it (docs/configs.md). The mapping itself is
in workload/configs/, one reader a stack; this module reads the file and the files it names."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwise.errors import GpuwiseError, did_you_mean
from gpuwise.files import file_type, read_text, shown
from gpuwise.workload.configs import (
    DETECTORS,
    FORMATS,
    FORMATS_HINT,
    ConfigRead,
    Document,
    Setting,
    load_document,
    program,
)
from gpuwise.workload.configs.reading import flag

MAX_CONFIG_BYTES = 4 << 20  # a config is kilobytes; a recipe with comments tens of them
WHAT = "config file"
KIND_WORDS = {"train": "a training run", "serve": "a server"}
KIND_COMMANDS = {"train": "gpuwise train (or advise)", "serve": "gpuwise serve, infer, check "
                 "or advise"}


@dataclass(frozen=True)
class Overridden:
    """An option given on the command line over the file's setting for it: the flag wins."""

    flag: str  # as given: "--batch 8"
    setting: str  # the file's: "batch_size: 2"


@dataclass(frozen=True)
class ConfigUse:
    """What a command took of a config file: the options it applied, those the command line
    gave instead, and the settings whose options this command does not have."""

    file: str
    read: ConfigRead
    command: str
    used: Mapping[str, Any] = field(default_factory=dict)  # parameter name -> value applied
    overridden: tuple[Overridden, ...] = ()
    not_used: tuple[Setting, ...] = ()

    @property
    def flags(self) -> tuple[str, ...]:
        """The options the file set for this command, as typed on the command line."""
        ordered = sorted(self.used.items(), key=lambda item: item[0] != "model")
        return tuple(f for f in (flag(n, v) for n, v in ordered) if f)


def read_config(path: str | Path, fmt: str | None, command: str,
                kinds: tuple[str, ...]) -> ConfigRead:
    """The file at `path` read by its format's reader (`fmt`, else told from its content),
    for a command that takes configs of `kinds` ("train", "serve")."""
    if fmt is not None and fmt not in FORMATS:
        close = did_you_mean(fmt, FORMATS)
        raise GpuwiseError(f"unknown config format {fmt!r}",
                           (f"did you mean {close[0]!r}? " if close else "")
                           + f"choose one of: {', '.join(FORMATS)}")
    hint = "give the path of a config file (docs/configs.md lists the formats)"
    if str(path).startswith("~"):
        with suppress(RuntimeError):  # "~someone" with no such user: the path as typed
            path = Path(path).expanduser()
    text = read_text(path, WHAT, MAX_CONFIG_BYTES, hint)
    if not text.strip():
        raise GpuwiseError(f"{WHAT} {shown(path)} is empty", hint)
    doc = _document(text, path, fmt)
    name = fmt or detect_format(doc, str(path))
    form = FORMATS[name]
    if form.kind not in kinds:
        what = (f"--config-format {fmt} reads {shown(path)} as" if fmt else
                f"{shown(path)} is")
        raise GpuwiseError(
            f"{what} {form.what}: it describes {KIND_WORDS[form.kind]}, which "
            f"gpuwise {command} does not estimate", f"give it to {KIND_COMMANDS[form.kind]}")
    if form.command_line and not doc.command:
        raise GpuwiseError(f"{shown(path)} is not a {name} command line",
                           f"the file holds one command: `{name} -m model.gguf -c 8192 ...`")
    return form.read(doc, _other_files(Path(path)))


def _document(text: str, path: str | Path, fmt: str | None) -> Document:
    doc = load_document(text, f"{WHAT} {shown(path)}")
    if doc.command and fmt is not None and program(doc.command) != fmt:
        raise GpuwiseError(f"{shown(path)} is a {program(doc.command)} command line, not "
                           f"{FORMATS[fmt].what}", "leave out --config-format: gpuwise tells "
                           "the format from the file")
    return doc


def detect_format(doc: Document, name: str) -> str:
    """The format a document is in: the server a command line starts, or the stack whose keys
    a mapping has (workload/configs DETECTORS, in order)."""
    if doc.command:
        found = program(doc.command)
        if found is not None:
            return found
    if doc.data is not None:
        for fmt, test in DETECTORS:
            if test(dict(doc.data)):
                return fmt
    keys = ", ".join(list(map(str, doc.data or {}))[:4])
    raise GpuwiseError(f"cannot tell which stack wrote {shown(name)}"
                       + (f" (its keys: {keys}, ...)" if keys else ""),
                       FORMATS_HINT + f" ({', '.join(FORMATS)})")


def _other_files(config: Path) -> Any:
    """Reads a file the config names (a DeepSpeed JSON): as written, else beside the config."""
    def read(name: str) -> str | None:
        for candidate in (Path(name), config.parent / name):
            if file_type(candidate) == "file":
                return read_text(candidate, "DeepSpeed config", MAX_CONFIG_BYTES)
        return None
    return read


def config_use(read: ConfigRead, file: str, command: str, params: Mapping[str, Any],
               given: set[str]) -> ConfigUse:
    """What `command` (whose parameters hold `params`, those in `given` typed on the command
    line) took of the file: each option it has and the line did not give, the line's options
    that differ from the file's, and the file's options the command does not have."""
    used: dict[str, Any] = {}
    overridden: list[Overridden] = []
    not_used: list[Setting] = []
    values = {s.key: s.value for s in read.applied}
    for name, value in read.options.items():
        key = read.set_by.get(name, name)
        if name not in params:
            shown_flag = flag(name, value) or f"--{name.replace('_', '-')}"
            not_used.append(Setting(key, values.get(key, str(value)), (shown_flag,),
                                    f"gpuwise {command} has no {shown_flag.split()[0]}"))
        elif name in given and params[name] != value:
            overridden.append(Overridden(flag(name, params[name]) or f"--{name}",
                                         f"{key}: {values.get(key, value)}"))
        elif name not in given:
            used[name] = value
    return ConfigUse(file, read, command, used, tuple(overridden), tuple(not_used))
