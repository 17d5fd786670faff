"""Bottom layer: the user-facing error and name matching. Imports nothing from gpuwise."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class GpuwiseError(Exception):
    """A problem with the user's input: shown as one line with a hint, exit code 2."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def did_you_mean(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The closest names to `name` among `choices`, best first."""
    lowered = {c.lower(): c for c in choices}  # each name once, however often it is given
    close = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    if not close:
        close = [c for c in lowered if name.lower() in c][:n]
    return [lowered[c] for c in close]


def unknown_name_error(kind: str, name: str, choices: Iterable[str], list_cmd: str) -> GpuwiseError:
    suggestions = did_you_mean(name, choices)
    if suggestions:
        hint = f"did you mean {', '.join(repr(s) for s in suggestions)}? (`{list_cmd}` lists them)"
    else:
        hint = f"`{list_cmd}` lists the known names"
    return GpuwiseError(f"unknown {kind} {name!r}", hint)


def comma_choices(text: str, choices: tuple[str, ...], unknown: str,
                  none_given: str) -> tuple[str, ...]:
    """A comma list of names from `choices`, each once, in the order given; an unknown name is
    refused as "`unknown` 'NAME'" with a "did you mean", an empty list as `none_given`."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    every = f"choose from {', '.join(choices)}"
    for name in names:
        if name not in choices:
            close = did_you_mean(name, choices)
            raise GpuwiseError(f"{unknown} {name!r}",
                               f"did you mean {close[0]!r}? " if close else every)
    if not names:
        raise GpuwiseError(none_given, every)
    return names


def normalise_name(name: str) -> str:
    """Lowercase, with spaces and underscores read as dashes."""
    return name.strip().lower().replace("_", "-").replace(" ", "-")
