"""The user's own config files, read as the stacks read them (docs/configs.md): a torchtune
recipe, an axolotl config, Hugging Face TrainingArguments, accelerate and DeepSpeed configs, a
LitGPT config; vLLM's, SGLang's and llama-server's command lines (or vLLM's and SGLang's YAML).
Each reader maps the settings to gpuwise's options and lists the rest (`reading.ConfigRead`).
Pure: the app layer reads the file (app/config_files.py) and detects its format."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuwise.workload.configs import (
    axolotl,
    hf_training_args,
    litgpt,
    llama_server,
    sglang_args,
    torchtune,
    vllm_args,
)
from gpuwise.workload.configs.command_line import program
from gpuwise.workload.configs.reading import (
    FORMATS_HINT,
    SERVE,
    TRAIN,
    ConfigRead,
    Document,
    ReadOther,
    Setting,
    load_document,
)


@dataclass(frozen=True)
class ConfigFormat:
    name: str  # what --config-format takes
    kind: str  # TRAIN or SERVE
    what: str  # the file, in words
    read: Callable[[Document, ReadOther], ConfigRead]
    command_line: bool = False  # read from a command line (else from YAML or JSON)


def _no_other(read: Callable[[Document], ConfigRead]) -> Callable[[Document, ReadOther],
                                                                  ConfigRead]:
    return lambda doc, _: read(doc)


FORMATS = {f.name: f for f in (
    ConfigFormat("torchtune", TRAIN, "a torchtune recipe config (YAML)",
                 _no_other(torchtune.read)),
    ConfigFormat("axolotl", TRAIN, "an axolotl config (YAML)", _no_other(axolotl.read)),
    ConfigFormat("hf-trainer", TRAIN, "Hugging Face TrainingArguments (JSON or YAML)",
                 hf_training_args.read_training_arguments),
    ConfigFormat("accelerate", TRAIN, "an accelerate config (YAML)",
                 hf_training_args.read_accelerate),
    ConfigFormat("deepspeed", TRAIN, "a DeepSpeed config (JSON)", hf_training_args.read_deepspeed),
    ConfigFormat("litgpt", TRAIN, "a LitGPT config (YAML)", _no_other(litgpt.read)),
    ConfigFormat("vllm", SERVE, "vLLM engine arguments (a `vllm serve` line or YAML)",
                 _no_other(vllm_args.read)),
    ConfigFormat("sglang", SERVE, "SGLang server arguments (a `sglang.launch_server` line or "
                 "YAML)", _no_other(sglang_args.read)),
    ConfigFormat("llama-server", SERVE, "a llama-server command line", _no_other(llama_server.read),
                 command_line=True),
)}

# How a mapping's keys say which stack wrote it, in the order asked (docs/configs.md).
DETECTORS: tuple[tuple[str, Callable[[dict], bool]], ...] = (
    ("torchtune", torchtune.is_torchtune),
    ("accelerate", hf_training_args.is_accelerate),
    ("deepspeed", hf_training_args.is_deepspeed),
    ("hf-trainer", hf_training_args.is_training_arguments),
    ("axolotl", axolotl.is_axolotl),
    ("litgpt", litgpt.is_litgpt),
    ("sglang", lambda d: any(str(k).replace("_", "-") == "model-path" for k in d)),
    ("vllm", lambda d: "model" in d),
)

__all__ = ["DETECTORS", "FORMATS", "FORMATS_HINT", "SERVE", "TRAIN", "ConfigFormat",
           "ConfigRead", "Document", "ReadOther", "Setting", "load_document", "program"]
