"""Match a GPU name as the driver reports it ("NVIDIA A100-SXM4-80GB") to its catalogue entry,
so that a detected GPU borrows the datasheet's bandwidth and peaks."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuwise.catalog.hardware import Hardware, load_hardware
from gpuwise.units import GIB

# Words in marketing names that do not tell two devices apart.
_NOISE_WORDS = frozenset(
    {
        "nvidia",
        "geforce",
        "tesla",
        "quadro",
        "tensor",
        "core",
        "gpu",
        "generation",
        "graphics",
        "card",
        "with",
    }
)
_MEMORY_GB = re.compile(r"(\d+)\s*gb\b")
_FORM_HINTS = ((re.compile(r"sxm\d*"), "sxm"), (re.compile(r"pci-?e"), "pcie"))
_MEMORY_KIND = re.compile(r"g?hbm\d*e?|gddr\d*x?")
# Relative difference in memory size still read as "the same size" (GB vs GiB, reserved memory).
_SAME_MEMORY = 0.12


@dataclass(frozen=True)
class _NameFacts:
    tokens: tuple[str, ...]  # the model, e.g. ("h", "100") or ("rtx", "4090")
    form: str | None  # "sxm", "pcie" or None
    memory_gb: int | None  # a size written in the name, e.g. 80 for "A100-SXM4-80GB"


def _name_facts(name: str) -> _NameFacts:
    text = name.lower().replace("_", " ")
    sizes = _MEMORY_GB.findall(text)
    text = _MEMORY_GB.sub(" ", text)
    form = None
    for pattern, hint in _FORM_HINTS:
        if pattern.search(text):
            form = form or hint
            text = pattern.sub(" ", text)
    text = _MEMORY_KIND.sub(" ", text)
    # Letters and digits split apart so "rtx4090" and "RTX 4090" read the same.
    tokens = tuple(t for t in re.findall(r"[a-z]+|\d+", text) if t not in _NOISE_WORDS)
    return _NameFacts(tokens, form, int(sizes[0]) if sizes else None)


def _entry_names(hw: Hardware) -> list[_NameFacts]:
    return [_name_facts(n) for n in (hw.id, hw.name, *hw.aliases)]


def _entry_form(hw: Hardware) -> str | None:
    for facts in _entry_names(hw):
        if facts.form:
            return facts.form
    return None


def _contains(outer: tuple[str, ...], inner: tuple[str, ...]) -> bool:
    """Whether `inner` is a run of `outer` that names a model number (has a digit token)."""
    if not inner or not any(t.isdigit() for t in inner):
        return False
    n = len(inner)
    return any(outer[i : i + n] == inner for i in range(len(outer) - n + 1))


def _candidates(gpu: _NameFacts, devices: tuple[Hardware, ...]) -> list[Hardware]:
    """Entries naming the same model; failing that, those whose model is part of the name."""
    exact = [hw for hw in devices if any(f.tokens == gpu.tokens for f in _entry_names(hw))]
    if exact:
        return exact
    best: list[Hardware] = []
    longest = 0
    for hw in devices:
        size = max(
            (len(f.tokens) for f in _entry_names(hw) if _contains(gpu.tokens, f.tokens)), default=0
        )
        if size > longest:
            best, longest = [hw], size
        elif size and size == longest:
            best.append(hw)
    return best


def _memory_mismatch(hw: Hardware, target_bytes: int) -> float:
    if target_bytes <= 0:
        return 0.0
    rel = abs(hw.memory_bytes - target_bytes) / target_bytes
    return 0.0 if rel <= _SAME_MEMORY else rel


def match_catalogue(gpu_name: str, memory_bytes: int) -> Hardware | None:
    """The catalogue entry for a GPU name as the driver reports it, or None if there is none.

    Memory size picks between variants first (A100 40GB vs 80GB), then the form factor: a
    name without "PCIe" is read as SXM, as NVML names SXM parts ("NVIDIA H100 80GB HBM3").
    """
    try:
        devices = tuple(hw for hw in load_hardware() if hw.kind == "gpu")
    except Exception:  # no catalogue yet, or unreadable: nothing to borrow from
        return None
    gpu = _name_facts(gpu_name)
    if not gpu.tokens:
        return None
    candidates = _candidates(gpu, devices)
    if not candidates:
        return None
    target = memory_bytes if memory_bytes > 0 else (gpu.memory_gb or 0) * GIB
    form = gpu.form or "sxm"

    def rank(hw: Hardware) -> tuple[float, int]:
        entry_form = _entry_form(hw)
        return _memory_mismatch(hw, target), int(entry_form is not None and entry_form != form)

    return min(candidates, key=rank)  # min is stable: ties keep catalogue order
