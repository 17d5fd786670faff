"""The ranges a model's config.json fields may take (data/config_ranges.toml), each with the
values real models have, for the message that refuses a value outside it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from gpuwise.catalog.sourced import sourced_section

FILE = "config_ranges.toml"


@dataclass(frozen=True)
class ConfigRange:
    """Accepted values of one kind of config field; integer bounds mean an integer field."""

    name: str
    low: int | float
    high: int | float
    real: str  # what real models have, said beside a refusal
    source: str
    low_open: bool = False

    @property
    def integer(self) -> bool:
        return isinstance(self.low, int) and isinstance(self.high, int)

    def holds(self, value: object) -> bool:
        """Whether `value` is a number of the right kind inside the range."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def text(self) -> str:
        """The range as written in a message: '1..1,048,576' or '(0, 1]'."""
        if self.integer:
            return f"{self.low:,}..{self.high:,}"
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"


@cache
def config_ranges() -> dict[str, ConfigRange]:
    """Every range by name (hidden_size, num_layers, experts, ...)."""
    values, sources = sourced_section(FILE, "config")
    return {name: ConfigRange(name=name, source=sources[name], **spec)
            for name, spec in values.items()}
