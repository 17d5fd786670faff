"""The shape of what `gpuwise probe` saves, checked before anything reads it: a saved profile
is a file on disk that a person, a crash or another version may have changed, and a wrong type
deep in it would otherwise surface as a traceback in the middle of an estimate.

A check is a function (value, where) that raises ValueError naming the first field that is
wrong ("kernels.linear.fp32: a text, not a table"). Numbers are finite and not negative: no
reading of a real probe is NaN, infinite or below zero.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

Check = Callable[[Any, str], None]


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a text"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, Sequence):
        return "a list"
    return "null" if value is None else type(value).__name__


def fail(where: str, wanted: str, value: Any) -> NoReturn:
    """Raise the one-line reason: where, what it should be, what it is."""
    shown = f"{value!r}"[:40] if isinstance(value, int | float | bool) else _kind(value)
    raise ValueError(f"{where}: {shown}, not {wanted}")


def number(value: Any, where: str) -> None:
    """A finite number, not negative."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        fail(where, "a number", value)
    elif not math.isfinite(value) or value < 0:
        fail(where, "a finite number of at least 0", value)


def integer(value: Any, where: str) -> None:
    """A whole number, not negative."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail(where, "a whole number of at least 0", value)


def size(value: Any, where: str) -> None:
    """A whole number of at least 1 (a matrix side, an array's bytes)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fail(where, "a whole number of at least 1", value)


def text(value: Any, where: str) -> None:
    if not isinstance(value, str):
        fail(where, "a text", value)


def flag(value: Any, where: str) -> None:
    if not isinstance(value, bool):
        fail(where, "true or false", value)


def maybe(check: Check) -> Check:
    """`check`, or null."""

    def run(value: Any, where: str) -> None:
        if value is not None:
            check(value, where)

    return run


def _sequence(value: Any, where: str) -> Sequence[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        fail(where, "a list", value)
    return value  # type: ignore[no-any-return]


def _mapping(value: Any, where: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        fail(where, "a table", value)
    for key in value:
        if not isinstance(key, str):
            fail(f"{where} key", "a text", key)
    return value  # type: ignore[no-any-return]


def list_of(check: Check) -> Check:
    def run(value: Any, where: str) -> None:
        for i, item in enumerate(_sequence(value, where)):
            check(item, f"{where}[{i}]")

    return run


def table_of(check: Check, special: Mapping[str, Check] | None = None) -> Check:
    """A table whose values all pass `check`, but the keys in `special`, which pass theirs."""

    def run(value: Any, where: str) -> None:
        for key, item in _mapping(value, where).items():
            (special or {}).get(key, check)(item, f"{where}.{key}")

    return run


def record(required: Mapping[str, Check], optional: Mapping[str, Check] | None = None) -> Check:
    """A table with these fields and no others (`optional` ones may be left out)."""
    known = {**required, **(optional or {})}

    def run(value: Any, where: str) -> None:
        fields = _mapping(value, where)
        for key in required:
            if key not in fields:
                raise ValueError(f"{where}: no field {key!r}")
        for key, item in fields.items():
            if key not in known:
                raise ValueError(f"{where}: unknown field {key!r}")
            known[key](item, f"{where}.{key}")

    return run


def record_of(cls: type, checks: Mapping[str, Check] | None = None,
              leave_out: tuple[str, ...] = ()) -> Check:
    """The check of a dataclass as saved with `dataclasses.asdict`: its fields, and no others;
    a field with a default may be left out. Each field's check follows from its annotation
    (bool, int, float, str, `X | None`, tuple/list, dict[str, X], a nested dataclass), or is
    `checks[name]` (a narrower one: a size, not any whole number). So what is written and
    what is read come from one definition: a field added to the dataclass is known to the
    reader, one taken away is refused in an old file. An annotation with no check (`Any`) and
    no entry in `checks` is a TypeError when the check is made, not a field let through."""
    hints = typing.get_type_hints(cls)
    given = dict(checks or {})
    required: dict[str, Check] = {}
    optional: dict[str, Check] = {}
    for f in dataclasses.fields(cls):
        if f.name in leave_out:
            continue
        check = given.pop(f.name, None) or check_of(hints[f.name], f"{cls.__name__}.{f.name}")
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        (optional if has_default else required)[f.name] = check
    if given:
        raise TypeError(f"{cls.__name__} has no field {', '.join(sorted(given))}")
    return record(required, optional)


def check_of(hint: Any, where: str) -> Check:
    """The check of one annotation (see `record_of`)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    simple: dict[Any, Check] = {bool: flag, int: integer, float: number, str: text}
    if hint in simple:
        return simple[hint]
    if origin in (types.UnionType, typing.Union) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return maybe(check_of(rest[0], where))
    if origin in (tuple, list) and args and (origin is list or args[-1] is Ellipsis):
        return list_of(check_of(args[0], where))
    if origin is dict and args and args[0] is str:
        return table_of(check_of(args[1], where))
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return record_of(hint)
    raise TypeError(f"{where}: no check for {hint!r}; give one by name")


def point(sizes: int, more: tuple[int, ...] = (), least: float = 1) -> Check:
    """[size..., value]: `sizes` numbers of at least `least` (a shape, a length), then one
    number (seconds or a rate); `more` lists other counts of sizes a point may have."""

    def run(value: Any, where: str) -> None:
        items = _sequence(value, where)
        if len(items) - 1 not in (sizes, *more):
            raise ValueError(f"{where}: {len(items)} numbers, not a point of {sizes + 1}")
        for i, item in enumerate(items):
            number(item, f"{where}[{i}]")
            if i < len(items) - 1 and item < least:
                fail(f"{where}[{i}]", f"a size of at least {least}", item)

    return run


def _grids(each: Check) -> Check:
    """{dtype: {name: [point, ...]}}."""
    return table_of(table_of(list_of(each)))


KERNELS: Check = record({}, {
    "linear": _grids(point(3)),  # [m, k, n, seconds]
    "conv": _grids(point(3, more=(4,))),  # [m, k, n, (gemms), seconds]
    "sdpa": _grids(point(1)),  # [length, seconds per batch x head]
    "optimizer": _grids(point(1)),  # [elements, seconds per element]
    "elementwise": table_of(table_of(number)),  # {dtype: {kind: bytes/s}}
    "fresh": table_of(number, {"by_held": list_of(point(1, least=0))}),  # [bytes held, bytes/s]
    "skipped": table_of(table_of(number)),
    "missing": table_of(text),
})


def check_kernels(value: Any, where: str = "kernels") -> None:
    """ValueError naming the first field of a probe's `kernels` record that is malformed."""
    KERNELS(value, where)
