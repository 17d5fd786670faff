"""What every config reader shares: the parsed document, the record of what a file said and
where each setting went, and the model a file names (docs/configs.md).

Pure: the text comes in (the app layer reads the file), a `ConfigRead` goes out. Every setting
a file holds ends in one of three lists: applied (the gpuwise options it sets), not modelled
(it would change a step's memory or time, and gpuwise does not model it) or no effect (paths,
logging, learning rates: no bearing on memory or time). None is dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.models import HUB_ID, find_catalogue_model
from gpuwise.errors import GpuwiseError
from gpuwise.workload.configs.command_line import command_words, environment, program
from gpuwise.workload.plans import LORA_TARGETS

TRAIN, SERVE = "train", "serve"  # what a format describes: a training run or a server
# Options that have a --no- form on the command line (the others are plain flags).
NEGATABLE = frozenset({"prefix_cache", "overlap_schedule", "reshard_after_forward",
                       "double_quant", "kbit_prepare"})
# Reads another file a config names (a DeepSpeed JSON from an accelerate config), given as
# written in the file: its text, or None where it cannot be read. The app layer supplies it.
ReadOther = Callable[[str], str | None]


@dataclass(frozen=True)
class Document:
    """A config file's text, parsed: a mapping (YAML, JSON) or a command line's words."""

    text: str
    data: Mapping[str, Any] | None = None
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class Setting:
    """One setting of the file: its key as the file spells it and its value, with the gpuwise
    options it sets (applied) or why gpuwise leaves it (not modelled)."""

    key: str
    value: str
    flags: tuple[str, ...] = ()  # as typed on gpuwise's command line: "--batch 2"
    why: str = ""  # not modelled: what it would change


@dataclass(frozen=True)
class ConfigRead:
    """What a config file says, mapped to gpuwise's options."""

    format: str  # the reader's name: "torchtune", "vllm", ...
    stack: str  # what the file runs: "torchtune full_finetune_single_device recipe"
    kind: str  # TRAIN or SERVE
    options: Mapping[str, Any]  # the commands' parameter names -> values ("model" included)
    applied: tuple[Setting, ...] = ()
    not_modelled: tuple[Setting, ...] = ()
    no_effect: tuple[Setting, ...] = ()
    # which setting set each option (the option's parameter name -> the file's key)
    set_by: Mapping[str, str] = field(default_factory=dict)


def shown_value(value: Any) -> str:
    """A value as a line shows it: YAML's words for None and booleans, lists inline."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {shown_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def flag(name: str, value: Any) -> str:
    """An option as typed: `--batch 2`, `--checkpointing`, `--no-prefix-cache`; "" for a flag
    that is off and has no --no- form (its default)."""
    spelled = "--" + name.replace("_", "-")
    if name == "model":
        return str(value)
    if isinstance(value, bool):
        if value:
            return spelled
        return "--no-" + spelled[2:] if name in NEGATABLE else ""
    return f"{spelled} {value}" if str(value) else ""


class Reader:
    """Collects a file's settings as a reader maps them: `take` a key, then `apply`,
    `not_modelled` or `no_effect` it; `finish` lists every key not taken as not modelled."""

    def __init__(self, fmt: str, kind: str, settings: Mapping[str, Any]) -> None:
        self.format, self.kind = fmt, kind
        self.left: dict[str, Any] = dict(settings)  # not placed yet
        self.options: dict[str, Any] = {}
        self.set_by: dict[str, str] = {}
        self.applied: list[Setting] = []
        self.skipped: list[Setting] = []
        self.idle: list[Setting] = []

    def has(self, key: str) -> bool:
        return key in self.left

    def peek(self, key: str, default: Any = None) -> Any:
        return self.left.get(key, default)

    def take(self, key: str, default: Any = None) -> Any:
        """The key's value, now the reader's to place (`default` if the file has none)."""
        return self.left.pop(key, default)

    def apply(self, key: str, value: Any, **options: Any) -> None:
        """The file's `key: value` sets these options."""
        self.options.update(options)
        for name in options:
            self.set_by[name] = key
        flags = tuple(f for f in (flag(n, v) for n, v in options.items()) if f)
        self.applied.append(Setting(key, shown_value(value), flags))

    def not_modelled(self, key: str, value: Any, why: str) -> None:
        self.skipped.append(Setting(key, shown_value(value), why=why))

    def no_effect(self, key: str, value: Any) -> None:
        self.idle.append(Setting(key, shown_value(value)))

    def take_no_effect(self, keys: Iterable[str], prefixes: Iterable[str] = ()) -> None:
        """Every key named, and every key under the prefixes, as having no effect."""
        names, starts = set(keys), tuple(prefixes)
        for key in [k for k in self.left if k in names or k.startswith(starts)]:
            self.no_effect(key, self.take(key))

    def finish(self, stack: str) -> ConfigRead:
        for key, value in self.left.items():
            self.not_modelled(key, value, "not a setting gpuwise knows")
        self.left = {}
        return ConfigRead(self.format, stack, self.kind, dict(self.options), tuple(self.applied),
                          tuple(self.skipped), tuple(self.idle), dict(self.set_by))


def accumulation(r: Reader, key: str) -> None:
    """Gradient accumulation: one micro-batch a step is gpuwise's step; more is not modelled
    (the memory is one micro-batch's; the optimizer steps once every N)."""
    value = r.take(key)
    if value is None:
        return
    if whole(value) == 1:
        r.apply(key, value)
    else:
        r.not_modelled(key, value, "gradient accumulation: gpuwise's step is one batch and one "
                       "optimizer step")


class Settings(Protocol):
    """What the mapping helpers ask of a reader (`Reader`, or vllm_args.Named over one)."""

    def has(self, key: str) -> bool: ...

    def take(self, key: str) -> Any: ...

    def apply(self, key: str, value: Any, **options: Any) -> None: ...

    def not_modelled(self, key: str, value: Any, why: str) -> None: ...


def count(r: Settings, key: str, option: str, why: str = "not a count") -> None:
    """A count (sequences, tokens): applied as `option`; null, 0, -1 or a word listed with
    `why`."""
    if not r.has(key):
        return
    value = r.take(key)
    number = whole(value)
    if number is not None and number > 0:
        r.apply(key, value, **{option: number})
    else:
        r.not_modelled(key, value, why)


def share(r: Settings, key: str, option: str) -> None:
    """A fraction (of device memory): applied as `option`, else listed."""
    if not r.has(key):
        return
    value = r.take(key)
    if fraction(value) is not None:
        r.apply(key, value, **{option: fraction(value)})
    else:
        r.not_modelled(key, value, "not a fraction")


def choice(r: Reader, key: str, table: Mapping[str, Any], option: str, why: str) -> None:
    """A setting whose value `table` names gpuwise's for: applied as `option`, else listed
    as not modelled with `why`."""
    value = r.take(key)
    if value is not None and str(value) in table:
        r.apply(key, value, **{option: table[str(value)]})
    elif value is not None:
        r.not_modelled(key, value, why)


def sequence(r: Reader, key: str) -> None:
    """The tokens a training sequence has; none (null) is each sample's own length."""
    count(r, key, "seq", "sequences as long as the data's: gpuwise takes --seq (default 2048)")


def dropout(r: Reader, key: str) -> None:
    """LoRA dropout: none has no effect; any keeps a dropout mask of each adapter's input."""
    value = r.take(key)
    if value is not None and fraction(value):
        r.not_modelled(key, value, "the dropout mask of each adapter's input")
    elif value is not None:
        r.no_effect(key, value)


def lora_modules(r: Reader, key: str) -> None:
    """peft's target_modules: a list of module names, or "all-linear"."""
    modules = r.take(key)
    if not modules:
        if modules is not None:
            r.no_effect(key, modules)
        return
    if modules == "all-linear":
        r.apply(key, modules, lora_targets=",".join(LORA_TARGETS))
        return
    listed = [modules] if isinstance(modules, str) else list(modules)
    known = [m for m in listed if m in LORA_TARGETS]
    r.apply(key, modules, lora_targets=",".join(known))
    if len(known) < len(listed):
        r.not_modelled(key, [m for m in listed if m not in known],
                       "LoRA on modules gpuwise does not adapt")


# ---- documents ------------------------------------------------------------------------------

def load_document(text: str, name: str) -> Document:
    """The file's text parsed: a command line (`vllm serve ...`), JSON or YAML. `name` is how
    errors name the file."""
    words = command_words(text)
    if words and program(words) is not None:
        return Document(text, command=tuple(words))
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GpuwiseError(f"{name} is not valid JSON: line {exc.lineno}: {exc.msg}",
                               "fix the file, or give another one") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}: " if mark is not None else ""
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise GpuwiseError(f"{name} is not valid YAML: {where}{problem}",
                               "fix the file, or give another one") from None
    if not isinstance(data, Mapping):
        raise GpuwiseError(f"{name} is neither a config (a YAML or JSON mapping of settings) nor "
                           "a server's command line", FORMATS_HINT)
    return Document(text, data=data)


FORMATS_HINT = ("gpuwise reads torchtune, axolotl, LitGPT, Hugging Face TrainingArguments, "
                "accelerate and DeepSpeed configs, and vLLM, SGLang and llama-server command "
                "lines or YAML; --config-format NAME says which")


ENVIRONMENT_NO_EFFECT = ("CUDA_VISIBLE_DEVICES", "HF_TOKEN", "HF_HOME", "HF_HUB_CACHE",
                         "HUGGING_FACE_HUB_TOKEN", "VLLM_LOGGING_LEVEL", "LLAMA_LOG_VERBOSITY")


def take_environment(r: Reader, words: tuple[str, ...]) -> None:
    """A command line's environment, each variable placed: PyTorch's allocator setting
    applied, the devices' ids and the hub's settings of no effect, the rest not modelled."""
    for name in environment(words):
        value = r.take(name)
        if name == "PYTORCH_CUDA_ALLOC_CONF" and "expandable_segments:True" in str(value):
            r.apply(name, value, expandable_segments=True)
        elif name in ENVIRONMENT_NO_EFFECT:
            r.no_effect(name, value)
        else:
            r.not_modelled(name, value, "an environment variable gpuwise does not read")


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys: {"optimizer": {"lr": 1}} -> {"optimizer.lr": 1}."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


# ---- values ---------------------------------------------------------------------------------

def whole(value: Any) -> int | None:
    """A count the file gives (2, "2", "8k" as vLLM reads it), or None where it is not one."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    text = str(value).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text)
    if not m:
        return None
    scale = {"": 1, "k": 1000, "m": 10**6, "g": 10**9, "K": 1024, "M": 2**20, "G": 2**30}
    number = float(m.group(1)) * scale[m.group(2)]
    return int(number) if number.is_integer() else None


def fraction(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def truthy(value: Any) -> bool:
    """YAML's and the command line's true: true, "true", "True", 1, "auto" (axolotl's bf16)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "on", "auto")
    return bool(value)


def format_id(name: str) -> str | None:
    """gpuwise's weight format for a name (bf16, fp8, q4_k_m, awq, ...), or None."""
    try:
        return weight_format(name.strip().lower()).id
    except GpuwiseError:
        return None


DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
          "fp32": "fp32", "float32": "fp32", "float": "fp32", "32": "fp32"}


# ---- the model a file names -----------------------------------------------------------------

_AFFIXES = ("-instruct", "-hf", "-chat", "-it", "-base", "-gguf", "-awq", "-gptq", "-fp8",
            "-int4", "-int8", "-bnb-4bit")


def catalogue_id(name: str) -> str | None:
    """The catalogue model a name (a hub id, a folder, a torchtune builder) stands for."""
    tried: list[str] = []
    parts = [p for p in name.strip().rstrip("/").split("/") if p]
    if not parts:
        return None
    for base in (name.strip().rstrip("/"), "/".join(parts[-2:]), parts[-1]):
        tried.append(base)
        stem = base.lower()
        for _ in range(4):
            for affix in _AFFIXES:
                stem = stem.removesuffix(affix)
            last = stem.rsplit("/", 1)[-1].removeprefix("meta-")
            tried += [stem, last, re.sub(r"^([a-z]+)(\d)", r"\1-\2", last)]
    for candidate in dict.fromkeys(tried):
        entry = find_catalogue_model(candidate)
        if entry is not None:
            return entry.id
    return None


def model_named(name: str) -> str:
    """The name gpuwise resolves for what a file names: a catalogue id where one fits, else
    the name as written (a hub id or a path)."""
    return catalogue_id(name) or name


def looks_like_hub_id(name: str) -> bool:
    return bool(HUB_ID.match(name))
