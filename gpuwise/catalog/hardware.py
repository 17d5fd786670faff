"""The hardware catalogue (data/hardware.toml) and lookup by name."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from gpuwise.catalog.toml_cache import parsed_toml
from gpuwise.errors import GpuwiseError, normalise_name, unknown_name_error
from gpuwise.units import GIB

# Kinds whose devices are linked to each other (NVLink, ICI, Gaudi's RoCE ports): a model may
# be split over several (tensor parallelism, ZeRO-3); others run one device a replica.
LINKED_KINDS = ("gpu", "tpu", "hpu")


@dataclass(frozen=True)
class Hardware:
    """One device. Peaks are dense; sparse peaks are kept apart. Units in the field names."""

    id: str
    name: str
    kind: str  # gpu | tpu | hpu (Intel Gaudi) | apple | cpu
    vendor: str
    memory_bytes: int
    memory_bandwidth_gbs: float
    peak_tflops: dict[str, float] = field(default_factory=dict, hash=False)  # its keys: what its matmul units run
    sparse_peak_tflops: dict[str, float] = field(default_factory=dict, hash=False)
    compute_units: int = 0
    compute_unit_name: str = ""
    boost_clock_mhz: float = 0.0  # the clock the peaks are computed at (GPUs)
    l2_mib: float = 0.0
    tdp_w: float = 0.0
    interconnect: str = ""
    interconnect_gbs: float = 0.0
    host_link: str = ""
    host_link_gbs: float = 0.0
    list_price_usd: float = 0.0
    cloud_usd_per_hour: float = 0.0
    aliases: tuple[str, ...] = ()
    spec_source: str = ""
    spec_date: str = ""
    price_source: str = ""
    price_date: str = ""
    notes: str = ""
    source: str = "spec"  # "spec" (catalogue) or "measured" (this machine)
    arch: str = ""  # the chip's architecture (hardware.toml); "" where not known (detected)
    compute_capability: float = 0.0  # NVIDIA's CUDA compute capability; 0: not NVIDIA or not known
    site: str = "datacentre"  # where an owned one runs: "home" (GeForce cards, Macs) or "datacentre"
    # "laptop" (a laptop GPU), "module" (a Jetson); "": a card or board. `advise` does not
    # choose a laptop or a module itself (nobody serves from a row of laptops); --on still takes one
    form_factor: str = ""

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


def _from_record(rec: dict) -> Hardware:
    rec = dict(rec)
    memory_gib = rec.pop("memory_gib")
    rec["aliases"] = tuple(rec.get("aliases", ()))
    known = set(Hardware.__dataclass_fields__)
    return Hardware(memory_bytes=int(memory_gib * GIB),
                    **{k: v for k, v in rec.items() if k in known})


def _gb(gib: float) -> str:
    return f"{gib:g}gb"


def _with_sizes(rec: dict) -> list[dict]:
    """A record and, where it lists `sizes` (an Apple chip bin's other unified-memory sizes),
    one record a size: id `<id>-<n>gb`, the name's size changed, the size table's keys (memory,
    a bin's cores, bandwidth and peaks, its price and source) over the entry's; no price unless
    the size gives one. The entry itself keeps its id and gets the alias `<id>-<its n>gb`."""
    rec = dict(rec)
    sizes = rec.pop("sizes", ())
    if not sizes:
        return [rec]
    own = _gb(rec["memory_gib"])
    rec["aliases"] = [*rec.get("aliases", ()), f"{rec['id']}-{own}"]
    out = [rec]
    for size in sizes:
        gib = _gb(size["memory_gib"])
        out.append({**rec, "aliases": [], "list_price_usd": 0.0,
                    "price_source": "no US price found for this size in this pass (0 = not known)",
                    "name": rec["name"].replace(f"{rec['memory_gib']:g}GB", f"{size['memory_gib']:g}GB"),
                    **size, "id": f"{rec['id']}-{gib}"})
    return out


@cache
def load_hardware() -> tuple[Hardware, ...]:
    """Every device in the catalogue, in file order; an entry with `sizes` gives one device a
    memory size."""
    text = resources.files("gpuwise.catalog").joinpath("data/hardware.toml").read_text()
    return tuple(_from_record(r) for rec in parsed_toml(text, "hardware")["device"]
                 for r in _with_sizes(rec))


def find_hardware(name: str) -> Hardware:
    """Look a device up by id, alias or display name, or by the start of one id ("tpu-v5p");
    a start several ids share is refused with the ids ("a100": four of them), unknown
    names get 'did you mean'."""
    key = normalise_name(name)
    devices = load_hardware()
    for hw in devices:
        names = {hw.id, normalise_name(hw.name), *(normalise_name(a) for a in hw.aliases)}
        if key in names:
            return hw
    partial = [hw for hw in devices if key and hw.id.startswith(key)]
    if len(partial) == 1:
        return partial[0]
    if partial:
        raise GpuwiseError(f"{name.strip()} is ambiguous: one of {', '.join(hw.id for hw in partial)}",
                           "name one of them (`gpuwise hardware` lists ids and aliases)")
    choices = [hw.id for hw in devices] + [a for hw in devices for a in hw.aliases]
    raise unknown_name_error("hardware", name, choices, "gpuwise hardware")
