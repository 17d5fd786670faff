"""The model catalogue (data/models.toml + data/models/*.json) and resolving any model name.

A model is named by a catalogue id or alias, a path to a config.json or a model folder, or a
Hugging Face hub id. From the hub only config.json is fetched; no code from a model repo runs.
"""

from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from gpuwise.catalog.checkpoints import Checkpoint, checkpoint_kind, read_checkpoint
from gpuwise.errors import GpuwiseError, normalise_name, unknown_name_error

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class ModelEntry:
    id: str
    hf_id: str
    family: str
    config: str
    aliases: tuple[str, ...] = ()
    published_params: int = 0
    source: str = ""
    date: str = ""
    notes: str = ""

    def load_config(self) -> dict[str, Any]:
        path = resources.files("gpuwise.catalog").joinpath(f"data/models/{self.config}")
        return json.loads(path.read_text())


@dataclass(frozen=True)
class ResolvedModel:
    """A model's name, its config.json facts, and where they came from."""

    name: str
    config: dict[str, Any] = field(repr=False)
    origin: str  # "catalogue", "file", "checkpoint", "hub" or "hub cache"
    location: str = ""
    entry: ModelEntry | None = None
    checkpoint: Checkpoint | None = field(default=None, repr=False)  # headers of a local file


@cache
def load_models() -> tuple[ModelEntry, ...]:
    text = resources.files("gpuwise.catalog").joinpath("data/models.toml").read_text()
    out = []
    for rec in tomllib.loads(text)["model"]:
        rec = {k: v for k, v in rec.items() if k in ModelEntry.__dataclass_fields__}
        rec["aliases"] = tuple(rec.get("aliases", ()))
        out.append(ModelEntry(**rec))
    return tuple(out)


def find_catalogue_model(name: str) -> ModelEntry | None:
    key = normalise_name(name)
    for entry in load_models():
        names = {entry.id, normalise_name(entry.hf_id), *(normalise_name(a) for a in entry.aliases)}
        if key in names or normalise_name(entry.hf_id.split("/")[-1]) == key:
            return entry
    return None


def read_config_file(path: Path) -> dict[str, Any]:
    if path.is_dir():
        path = path / "config.json"
        if not path.exists():
            raise GpuwiseError(
                f"no config.json in {path.parent}", "pass a model folder that has one"
            )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise GpuwiseError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})",
                           "pass a Hugging Face config.json") from None  # fmt: skip
    except (OSError, UnicodeDecodeError) as exc:
        raise GpuwiseError(f"cannot read {path}: {exc}", "check the path") from None
    if not isinstance(data, dict):
        raise GpuwiseError(f"{path} is not a JSON object", "pass a Hugging Face config.json")
    return data


def _from_hub(repo_id: str) -> ResolvedModel:
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:  # pragma: no cover - a base dependency
        raise GpuwiseError(
            "huggingface_hub is not installed", "pip install huggingface_hub"
        ) from None
    fetch_error = ""
    try:
        path = hf_hub_download(repo_id, "config.json", etag_timeout=5)
        return ResolvedModel(repo_id, read_config_file(Path(path)), "hub", repo_id)
    except Exception as exc:  # network, auth, missing repo: fall back to the local cache
        fetch_error = type(exc).__name__
    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return ResolvedModel(repo_id, read_config_file(Path(cached)), "hub cache", cached)
    raise GpuwiseError(
        f"could not fetch config.json for {repo_id!r} from the Hugging Face hub ({fetch_error}) "
        "and it is not in the local hub cache",
        "check the name and the network (gated repos need `huggingface-cli login`), "
        "or pass a path to a config.json",
    )


def _reads_checkpoint(path: Path) -> bool:
    """A .gguf/.safetensors file, or a folder of shards (a folder with a config.json is read
    for its exact bytes only when the safetensors package is there to read them)."""
    kind = checkpoint_kind(path)
    if kind is None:
        return False
    if path.is_dir() and (path / "config.json").exists():
        return importlib.util.find_spec("safetensors") is not None
    return True


def _from_checkpoint(path: Path) -> ResolvedModel:
    ckpt = read_checkpoint(path)
    if ckpt.config is None:
        raise GpuwiseError(f"{path} has no config.json beside it: gpuwise needs the "
                           "architecture (layers, heads, sizes) for the KV cache and activations",
                           "put the model's config.json in the same folder")  # fmt: skip
    name = path.stem if path.is_file() else path.name
    return ResolvedModel(name, ckpt.config, "checkpoint", str(path), checkpoint=ckpt)


def resolve_model(name: str) -> ResolvedModel:
    """Turn what the user typed into a config: catalogue, then local path, then hub id."""
    if not name or not name.strip():
        raise GpuwiseError("no model given", "name a model: `gpuwise models` lists them")
    entry = find_catalogue_model(name)
    if entry:
        return ResolvedModel(entry.id, entry.load_config(), "catalogue", entry.hf_id, entry)
    path = Path(name).expanduser()
    if path.exists() and _reads_checkpoint(path):
        return _from_checkpoint(path)
    if path.exists():
        return ResolvedModel(path.stem if path.is_file() else path.name,
                             read_config_file(path), "file", str(path))  # fmt: skip
    if name.endswith(".json") or name.startswith((".", "/", "~")):
        raise GpuwiseError(f"no such file: {name}", "check the path")
    if HUB_ID.match(name):
        return _from_hub(name)
    choices = [e.id for e in load_models()] + [a for e in load_models() for a in e.aliases]
    raise unknown_name_error("model", name, choices, "gpuwise models")
