"""How fast checkpoint headers are read: gpuwise's bounded GGUF reader against gguf's own
GGUFReader on a header with a Llama-3-sized vocabulary (128,256 tokens), and a safetensors
folder of 4 shards x 300 tensors. Writes its files in a temporary folder; no download.

    .venv/bin/python benchmarks/read_checkpoints.py
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import save_file

from gpuwise.catalog.checkpoints import read_checkpoint

VOCAB = 128_256


def write_gguf(path: Path) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((w.add_block_count, 2), (w.add_context_length, 8192),
                       (w.add_embedding_length, 64), (w.add_feed_forward_length, 128),
                       (w.add_head_count, 4), (w.add_head_count_kv, 2)):
        add(value)
    w.add_token_list([f"token{i}" for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)
    w.add_token_scores([0.0] * VOCAB)
    w.add_tensor("token_embd.weight", np.zeros((VOCAB, 64), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_shards(folder: Path, shards: int = 4, per_shard: int = 300) -> None:
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {f"layer.{s}.{i}.weight": np.zeros((8, 8), np.float16) for i in range(per_shard)}
        save_file(tensors, str(folder / name))
        weight_map.update(dict.fromkeys(tensors, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def timed(fn, repeat: int = 3) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vocab.gguf"
        write_gguf(path)
        ours = timed(lambda: read_checkpoint(path))
        theirs = timed(lambda: gguf.GGUFReader(str(path)), repeat=1)
        print(f"GGUF header, {VOCAB:,}-token vocabulary: gpuwise {ours:.3f} s, "
              f"gguf.GGUFReader {theirs:.3f} s ({theirs / ours:.0f}x)")
        folder = Path(tmp) / "shards"
        folder.mkdir()
        write_shards(folder)
        t = timed(lambda: read_checkpoint(folder))
        print(f"safetensors folder, 4 shards x 300 tensors: gpuwise {t:.3f} s")


if __name__ == "__main__":
    main()
