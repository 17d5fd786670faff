"""Catalogue data files whose every value names its source: a section holds its values and a
`sources` table with one entry a value (`"*"`: every value the table does not name), so no
number enters an estimate without where it came from."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any, TypeVar

from gpuwise.catalog.toml_cache import parsed_toml

T = TypeVar("T")


@cache
def data_file(name: str) -> dict[str, Any]:
    """A TOML file of gpuwise/catalog/data, parsed once (callers must not change it)."""
    text = resources.files("gpuwise.catalog").joinpath(f"data/{name}").read_text()
    return parsed_toml(text, name.removesuffix(".toml"))


def sourced_section(file: str, section: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(values, the source of each value) of `[section]` in the data file `file`; a dotted
    section ("ggml.cpu") names a table inside another."""
    table = data_file(file)
    for key in section.split("."):
        table = table[key]
    values = dict(table)
    named: dict[str, str] = values.pop("sources", {})
    default = named.get("*", "")
    sources = {key: named.get(key, default) for key in values}
    missing = sorted(key for key, source in sources.items() if not source)
    stray = sorted(set(named) - set(values) - {"*"})
    if missing or stray:
        raise ValueError(f"catalog/data/{file} [{section}]: "
                         + (f"no source for {', '.join(missing)}" if missing else
                            f"sources for values it lacks: {', '.join(stray)}"))
    return values, sources


def sourced_record(record: Callable[..., T], file: str, section: str, **more: Any) -> T:
    """`record` built from `[section]` of the data file `file`: its values as fields, their
    sources as `sources`, and `more`."""
    values, sources = sourced_section(file, section)
    return record(**values, **more, sources=sources)
