"""The flags each serving runtime's command line may carry (data/launch_flags.toml): the program
that starts it, the flags confirmed in its own reference, and the version and sources they were
read from. `workload/launch.py` emits nothing else (docs/plan.md, "The command to run")."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from gpuwise.catalog.sourced import data_file

SECTIONS = {"vllm": "vllm", "sglang": "sglang", "llama.cpp": "llama_cpp"}


@dataclass(frozen=True)
class LaunchFlags:
    runtime: str
    program: tuple[str, ...]  # the words that start the server ("vllm", "serve")
    version: str
    sources: tuple[str, ...]
    read: str  # when the lists were read from the sources
    flags: frozenset[str]
    cache_types: tuple[str, ...] = ()  # llama.cpp's -ctk/-ctv values
    name: str = ""  # the server's name in a message ("vLLM", "llama-server")
    one_process: bool = False  # one server process: no pipeline, expert or prefill split
    loads_gguf: bool = False  # runs a .gguf file
    experts_over_replicas: bool = False  # expert parallelism spans tp x data-parallel ranks


@cache
def launch_flags(runtime: str) -> LaunchFlags:
    """The recorded flags of "vllm", "sglang" or "llama.cpp"."""
    rec = data_file("launch_flags.toml")[SECTIONS[runtime]]
    return LaunchFlags(runtime=runtime, program=tuple(rec["program"]), version=rec["version"],
                       sources=tuple(rec["sources"]), read=rec["read"],
                       flags=frozenset(rec["flags"]),
                       cache_types=tuple(rec.get("cache_types", ())), name=rec["name"],
                       one_process=rec.get("one_process", False),
                       loads_gguf=rec.get("loads_gguf", False),
                       experts_over_replicas=rec.get("experts_over_replicas", False))
