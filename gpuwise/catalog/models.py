"""The model catalogue (data/models.toml + data/models/*.json) and resolving any model name.

A model is named by a catalogue id or alias, a path to a config.json or a model folder, or a
Hugging Face hub id. From the hub only config.json is fetched; no code from a model repo runs.
Local paths are looked at before they are opened (gpuwise.files: no FIFO or device is read, a
config.json is at most 16 MiB); the hub is asked once, with a short timeout, and when it
cannot be reached the local hub cache answers ("offline: ..."), with no retries.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from gpuwise.catalog.checkpoints import Checkpoint, checkpoint_kind, read_checkpoint
from gpuwise.catalog.checkpoints.safetensors_reader import read_config_json
from gpuwise.catalog.toml_cache import parsed_toml
from gpuwise.errors import GpuwiseError, normalise_name, unknown_name_error
from gpuwise.files import file_type, shown

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
MAX_NAME_CHARS = 4096  # PATH_MAX; a hub id is at most 96 + 1 + 96 characters
HUB_TIMEOUT_S = 5.0
PATH_HINT = "pass a config.json, a model folder, a .safetensors or a .gguf file"


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
    for rec in parsed_toml(text, "models")["model"]:
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
    """The config.json at `path`, or in the model folder `path`."""
    if file_type(path, "model folder", PATH_HINT) == "directory":
        path = path / "config.json"
        if file_type(path, "model config", PATH_HINT) is None:
            raise GpuwiseError(f"no config.json in {shown(path.parent)}",
                               "pass a model folder that has one")
    return read_config_json(path)


def _from_hub(repo_id: str) -> ResolvedModel:
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:  # pragma: no cover - a base dependency
        raise GpuwiseError(
            "huggingface_hub is not installed", "pip install huggingface_hub"
        ) from None
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise GpuwiseError(f"{shown(repo_id)!r} is not a model gpuwise knows nor a valid Hugging "
                           "Face repo id", "`gpuwise models` lists the known names; a hub id is "
                           "owner/name, each at most 96 characters") from None
    offline, fetch_error = _hub_unreachable(repo_id), ""
    if offline is None:
        try:
            path = hf_hub_download(repo_id, "config.json", etag_timeout=HUB_TIMEOUT_S)
            return ResolvedModel(repo_id, read_config_file(Path(path)), "hub", repo_id)
        except GpuwiseError:
            raise
        except Exception as exc:  # not found, gated, auth: the local cache may still have it
            fetch_error = type(exc).__name__
    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return ResolvedModel(repo_id, read_config_file(Path(cached)), "hub cache", cached)
    if offline is not None:
        fix = "unset HF_HUB_OFFLINE" if "HF_HUB_OFFLINE" in offline else "connect to the network"
        raise GpuwiseError(f"offline: {offline} (using the local hub cache, nothing cached for "
                           f"{shown(repo_id)!r})", f"{fix}, or pass a path to a config.json")
    raise GpuwiseError(
        f"could not fetch config.json for {shown(repo_id)!r} from the Hugging Face hub ({fetch_error}) "
        "and it is not in the local hub cache",
        "check the name and the network (gated repos need `huggingface-cli login`), "
        "or pass a path to a config.json",
    )


def _hub_unreachable(repo_id: str) -> str | None:
    """Why the hub cannot be asked (offline mode, no network), or None when it answers. One
    request without retries: hf_hub_download alone retries a dead network for ~25 s."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import HfHubHTTPError

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=HUB_TIMEOUT_S)
    except HfHubHTTPError:
        return None  # the hub answered (not found, gated): hf_hub_download says which
    except Exception as exc:  # no network, no DNS, a timeout
        return f"cannot reach the Hugging Face hub: {type(exc).__name__}"
    return None


def _reads_checkpoint(path: Path, kind: str) -> bool:
    """A .gguf/.safetensors file, or a folder of shards (a folder with a config.json is read
    for its exact bytes only when the safetensors package is there to read them)."""
    if checkpoint_kind(path) is None:
        return False
    if kind == "directory" and file_type(path / "config.json", "model config") is not None:
        return importlib.util.find_spec("safetensors") is not None
    return True


def _from_checkpoint(path: Path, kind: str) -> ResolvedModel:
    ckpt = read_checkpoint(path)
    if ckpt.config is None:
        raise GpuwiseError(f"{shown(path)} has no config.json beside it: gpuwise needs the "
                           "architecture (layers, heads, sizes) for the KV cache and activations",
                           "put the model's config.json in the same folder")
    name = path.stem if kind == "file" else path.name
    return ResolvedModel(name, ckpt.config, "checkpoint", str(path), checkpoint=ckpt)


def resolve_model(name: str) -> ResolvedModel:
    """Turn what the user typed into a config: catalogue, then local path, then hub id."""
    if not name or not name.strip():
        raise GpuwiseError("no model given", "name a model: `gpuwise models` lists them")
    if len(name) > MAX_NAME_CHARS:
        raise GpuwiseError(f"model name {shown(name)} is too long for a model, a path or a hub id",
                           "name a model: `gpuwise models` lists them")
    entry = find_catalogue_model(name)
    if entry:
        return ResolvedModel(entry.id, entry.load_config(), "catalogue", entry.hf_id, entry)
    path = _expanded(name)
    kind = file_type(path, "model path", PATH_HINT)
    if kind == "file" or kind == "directory":
        if _reads_checkpoint(path, kind):
            return _from_checkpoint(path, kind)
        return ResolvedModel(path.stem if kind == "file" else path.name,
                             read_config_file(path), "file", str(path))
    if kind is not None:
        raise GpuwiseError(f"{shown(path)} is a {kind}, not a model file or folder", PATH_HINT)
    if name.endswith(".json") or name.startswith((".", "/", "~")):
        raise GpuwiseError(f"no such file: {shown(name)}", "check the path")
    if HUB_ID.match(name):
        return _from_hub(name)
    choices = [e.id for e in load_models()] + [a for e in load_models() for a in e.aliases]
    raise unknown_name_error("model", shown(name), choices, "gpuwise models")


def _expanded(name: str) -> Path:
    try:
        return Path(name).expanduser()
    except RuntimeError:  # "~someone" with no such user: the path as typed
        return Path(name)
