"""Constants of the training and serving stacks whose memory rules plans can name
(data/stacks.toml): torchtune, Liger, FSDP2, torchtitan, DeepSpeed, bitsandbytes, peft,
AutoAWQ, every value with its source."""

from __future__ import annotations

from functools import cache
from typing import Any

from gpuwise.catalog.sourced import sourced_section

FILE = "stacks.toml"


@cache
def stack_value(section: str, key: str) -> Any:
    """One sourced value of `[section]` (the loader refuses the file if any value lacks a
    source)."""
    values, _ = sourced_section(FILE, section)
    return values[key]
