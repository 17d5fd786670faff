"""The files the docs' commands name, made for real in a temporary folder: a tiny Q4_K_M GGUF, a
safetensors model with its config.json, a GPTQ model folder, a PyTorch module factory, the
user's `train.py`, a request trace, watch logs (`tests/test_doc_examples.py` uses them).

Weights are random and tiny; only the names and layouts are those the docs show.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from doc_examples import REPO

# A llama of 2 layers whose widths suit Q4_K blocks (256) and GPTQ groups (128).
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 2048,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16"}
LINEARS = {"self_attn.q_proj": (256, 256), "self_attn.k_proj": (128, 256),
           "self_attn.v_proj": (128, 256), "self_attn.o_proj": (256, 256),
           "mlp.gate_proj": (512, 256), "mlp.up_proj": (512, 256),
           "mlp.down_proj": (256, 512)}  # (out, in) per layer

MODULE_FACTORY = '''"""An image-and-text module for `gpuwise module mypkg.models:build`."""
import torch


class ImageText(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 7, stride=4)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.embed = torch.nn.Embedding(1000, 16)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, image, ids=None):
        x = self.pool(torch.relu(self.conv(image))).flatten(1)
        if ids is not None:
            x = x + self.embed(ids).mean(1).to(x.dtype)
        return self.head(x)


def build():
    return ImageText()
'''

# The user's training script under `gpuwise watch`: a DataLoader loop (DDP under torchrun).
WATCH_TRAIN = '''"""A small training job: an MLP on random data, any extra arguments accepted."""
import argparse
import os

import torch
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--epochs", type=int, default=2)
args, _ = parser.parse_known_args()
torch.set_num_threads(1)
torch.manual_seed(0)
world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    torch.distributed.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
if world > 1:
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
data = TensorDataset(torch.randn(1024, 64), torch.randn(1024, 1))
for epoch in range(args.epochs):
    for x, y in DataLoader(data, batch_size=32):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
print(f"loss {loss.item():.4f}")
if world > 1:
    torch.distributed.barrier()  # both ranks done with gloo before either tears it down
    torch.distributed.destroy_process_group()
'''

# The user's training script under `gpuwise repro`: plain Python, so each of a study's many
# runs takes a fraction of a second; seeded from GPUWISE_SEED or `--seed N`.
REPRO_TRAIN = '''"""Linear regression by SGD in plain Python; prints `val loss X` and a JSON line."""
import argparse
import json
import os
import random

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--seed", type=int, default=None)
args, _ = parser.parse_known_args()
seed = args.seed if args.seed is not None else int(os.environ.get("GPUWISE_SEED", "0"))
data_rng, rng = random.Random(1234), random.Random(seed)
truth = [0.5, -1.0, 2.0, 0.25]
rows = [[data_rng.gauss(0, 1) for _ in truth] for _ in range(400)]
data = [(x, sum(a * b for a, b in zip(truth, x)) + data_rng.gauss(0, 0.1)) for x in rows]
train, val = data[:300], data[300:]
w = [rng.gauss(0, 1) for _ in truth]
for _ in range(args.epochs):
    rng.shuffle(train)
    for x, y in train:
        err = sum(a * b for a, b in zip(w, x)) - y
        w = [a - 0.01 * err * b for a, b in zip(w, x)]
val_loss = sum((sum(a * b for a, b in zip(w, x)) - y) ** 2 for x, y in val) / len(val)
print(f"val loss {val_loss:.6f}")
print(json.dumps({"val_loss": val_loss}))
'''

# Writes a watch log through the Python API (`gpuwise.watch()`), as a program would; under
# RANK/WORLD_SIZE the API names it per rank (run.rank0.jsonl).
WATCH_LOG_WRITER = '''import sys, time
import gpuwise

with gpuwise.watch(sys.argv[1] if len(sys.argv) > 1 else None, interval_s=0.05) as w:
    for batch in w.loader(range(12)):
        with w.phase("forward"):
            time.sleep(0.01)
        with w.phase("backward"):
            time.sleep(0.01)
'''


def write_q4_k_m_gguf(path: Path) -> None:
    """A llama GGUF laid out as Q4_K_M files are (Q4_K, Q6_K for v/down/output), random bytes."""
    import gguf
    import numpy as np

    q = gguf.GGMLQuantizationType
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(2048)
    writer.add_embedding_length(256)
    writer.add_feed_forward_length(512)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    rng = np.random.default_rng(0)

    def add(name: str, shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType) -> None:
        if qtype == q.F32:
            data = np.ones(shape, np.float32)
        else:
            byte_shape = gguf.quants.quant_shape_to_byte_shape(shape, qtype)
            data = rng.integers(0, 256, byte_shape, dtype=np.uint8)
        writer.add_tensor(name, data, raw_dtype=None if qtype == q.F32 else qtype)

    add("token_embd.weight", (512, 256), q.Q4_K)
    for i in range(2):
        for part, shape in (("attn_q", (256, 256)), ("attn_k", (128, 256)),
                            ("attn_output", (256, 256)), ("ffn_gate", (512, 256)),
                            ("ffn_up", (512, 256))):
            add(f"blk.{i}.{part}.weight", shape, q.Q4_K)
        add(f"blk.{i}.attn_v.weight", (128, 256), q.Q6_K)
        add(f"blk.{i}.ffn_down.weight", (256, 512), q.Q6_K)
        add(f"blk.{i}.attn_norm.weight", (256,), q.F32)
        add(f"blk.{i}.ffn_norm.weight", (256,), q.F32)
    add("output_norm.weight", (256,), q.F32)
    add("output.weight", (512, 256), q.Q6_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _plain_tensors() -> dict[str, tuple[str, list[int], int]]:
    """The embedding, norms and head of TINY_LLAMA in bf16: name -> (dtype, shape, bytes)."""
    specs = {"model.embed_tokens.weight": ("bfloat16", [512, 256], 512 * 256 * 2),
             "model.norm.weight": ("bfloat16", [256], 512),
             "lm_head.weight": ("bfloat16", [512, 256], 512 * 256 * 2)}
    for i in range(2):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            specs[f"model.layers.{i}.{norm}.weight"] = ("bfloat16", [256], 512)
    return specs


def write_safetensors_model(path: Path) -> None:
    """`path` (.safetensors) with TINY_LLAMA's tensors in bf16, and config.json beside it."""
    from checkpoint_files import write_safetensors

    specs = _plain_tensors()
    for i in range(2):
        for name, (out, inp) in LINEARS.items():
            specs[f"model.layers.{i}.{name}.weight"] = ("bfloat16", [out, inp], out * inp * 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(path, specs)
    (path.parent / "config.json").write_text(json.dumps(TINY_LLAMA))


def write_gptq_folder(folder: Path) -> None:
    """A GPTQ (4-bit, group 128) model folder: config.json and model.safetensors."""
    from checkpoint_files import gptq_layer, write_safetensors

    specs = _plain_tensors()
    for i in range(2):
        for name, (out, inp) in LINEARS.items():
            specs.update(gptq_layer(f"model.layers.{i}.{name}", out, inp))
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "model.safetensors", specs)
    config = {**TINY_LLAMA, "torch_dtype": "float16",
              "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    (folder / "config.json").write_text(json.dumps(config))


def write_module_package(cwd: Path) -> None:
    package = cwd / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(MODULE_FACTORY)


def write_trace(path: Path) -> None:
    """A recorded stream: 60 requests over 30 s, lengths around 512 + 256 tokens."""
    lines = [json.dumps({"arrival_s": i * 0.5, "prompt_tokens": 400 + 37 * (i % 7),
                         "output_tokens": 200 + 19 * (i % 5)}) for i in range(60)]
    path.write_text("\n".join(lines) + "\n")


def write_watch_logs(cwd: Path, env: dict[str, str], names: list[str]) -> None:
    """Watch logs by the API: `run.jsonl`, per-rank `run.rankN.jsonl`, or the default name."""
    writer = cwd / "_write_watch_log.py"
    writer.write_text(WATCH_LOG_WRITER)
    for name in names:
        rank = re.fullmatch(r"(.+)\.rank(\d+)\.jsonl", name)
        run_env = dict(env)
        args = [sys.executable, str(writer)]
        if rank:
            run_env.update(RANK=rank.group(2), WORLD_SIZE="2")
            args.append(rank.group(1) + ".jsonl")
        elif "*" not in name:
            args.append(name)
        subprocess.run(args, cwd=cwd, env=run_env, check=True, timeout=120,
                       capture_output=True)
    writer.unlink()


def _is_module_path(word: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", word) is not None and "." in word


def _report_logs(words: list[str]) -> list[str]:
    if "--report" not in words:
        return []
    after = words[words.index("--report") + 1 :]
    return [w for w in after if w.endswith(".jsonl")]


def make_placeholders(words: list[str], cwd: Path, env: dict[str, str]) -> None:
    """Make for real in `cwd` every file the command's words name."""
    makers: list[tuple[Callable[[str], bool], Callable[[str], None]]] = [
        (lambda w: w.endswith(".gguf"), lambda w: write_q4_k_m_gguf(cwd / w)),
        (lambda w: w.endswith(".safetensors"), lambda w: write_safetensors_model(cwd / w)),
        (lambda w: w.endswith("/") and "GPTQ" in w, lambda w: write_gptq_folder(cwd / w)),
        (_is_module_path, lambda w: write_module_package(cwd)),
        (lambda w: w == "requests.jsonl", lambda w: write_trace(cwd / w)),
        (lambda w: w == "train.py", lambda w: _write_train(cwd / w, words)),
        (lambda w: (REPO / w).is_file() and "/" in w and not w.startswith("."),
         lambda w: _copy_from_repo(w, cwd)),
    ]
    for word in dict.fromkeys(words):
        for matches, make in makers:
            if matches(word):
                make(word)
                break
    logs = _report_logs(words)
    if logs:
        write_watch_logs(cwd, env, logs)


def _write_train(path: Path, words: list[str]) -> None:
    path.write_text(REPRO_TRAIN if "repro" in words else WATCH_TRAIN)


def _copy_from_repo(relative: str, cwd: Path) -> None:
    (cwd / relative).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / relative, cwd / relative)


def user_environment(tmp: Path) -> dict[str, str]:
    """The environment of a user at a fresh shell: home, caches and hub cache in `tmp`, offline,
    the venv's bin first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUWISE_", "RAY_", "PYTEST_")) and k != "COLUMNS"}
    (tmp / "home").mkdir()
    env.update(HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "cache"),
               GPUWISE_CACHE_DIR=str(tmp / "gpuwise-cache"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp / "hf"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    return env
