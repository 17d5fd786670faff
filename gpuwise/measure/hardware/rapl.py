"""CPU package energy from RAPL (Intel and AMD) under /sys/class/powercap: the one module that
reads it.

Each package zone (intel-rapl:0, intel-rapl:1, ...) counts microjoules since an arbitrary
origin and wraps to 0 past `max_energy_range_uj`; its sub-zones (core, uncore, dram) are
inside the package's count and are not read. Since 2020 the counters are readable by root
only. Nothing here raises once the zones are found: a zone that cannot be read is left out,
with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RAPL_ROOT = Path("/sys/class/powercap")


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


@dataclass(frozen=True)
class RaplZone:
    """One package's counter."""

    name: str  # "intel-rapl:0"
    energy_file: Path
    range_uj: int  # the counter wraps to 0 past this

    def read_uj(self) -> int:
        """The counter now (raises OSError or ValueError when it cannot be read)."""
        return _read_int(self.energy_file)

    def read_j(self) -> float:
        return self.read_uj() / 1e6

    @property
    def range_j(self) -> float:
        return self.range_uj / 1e6


@dataclass(frozen=True)
class RaplZones:
    """The readable package zones, and why each other one (or any at all) is missing."""

    zones: tuple[RaplZone, ...]
    problems: tuple[str, ...]

    @property
    def reason(self) -> str | None:
        """Why there is no CPU energy reading (None when a zone is readable)."""
        if self.zones:
            return None
        return self.problems[-1] if self.problems else "no readable RAPL package zone"


def find_zones(root: Path = RAPL_ROOT) -> RaplZones:
    """The package zones under `root` whose counters can be read."""
    if not root.exists():
        return RaplZones((), (f"no RAPL here ({root} absent)",))
    zones: list[RaplZone] = []
    problems: list[str] = []
    for zone in sorted(root.glob("*-rapl:*")):
        if zone.name.count(":") != 1:
            continue  # sub-zones (core, uncore, dram) are inside the package reading
        energy = zone / "energy_uj"
        try:
            _read_int(energy)
            limit = _read_int(zone / "max_energy_range_uj")
        except PermissionError:
            problems.append(f"no permission to read {energy} (root only since 2020)")
            continue
        except (OSError, ValueError) as exc:
            problems.append(f"{energy} not readable ({str(exc) or type(exc).__name__})")
            continue
        zones.append(RaplZone(zone.name, energy, limit))
    if not zones and not problems:
        problems.append(f"no RAPL package zone under {root}")
    return RaplZones(tuple(zones), tuple(problems))


class RaplCounter:
    """Cumulative CPU package energy in joules over every readable package zone, wrap-arounds
    added back: the difference between two readings is the energy used in between (as long
    as each zone wraps at most once between readings)."""

    def __init__(self, root: Path = RAPL_ROOT) -> None:
        found = find_zones(root)
        self.zones = found.zones
        self.reason = found.reason
        self._last: dict[str, int] = {}
        self._wraps: dict[str, int] = {}

    def read(self) -> float | None:
        """Joules since an arbitrary origin; None when no zone is readable (now)."""
        if not self.zones:
            return None
        total = 0
        try:
            for zone in self.zones:
                value = zone.read_uj()
                if value < self._last.get(zone.name, value):
                    self._wraps[zone.name] = self._wraps.get(zone.name, 0) + zone.range_uj
                self._last[zone.name] = value
                total += value + self._wraps.get(zone.name, 0)
        except (OSError, ValueError):
            return None
        return total / 1e6
