"""A checkpoint's headers as a plain dict for --json: exact bytes, dtypes, quantised layers."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpuwise.catalog.checkpoints import Checkpoint


def checkpoint_record(ckpt: Checkpoint) -> dict[str, Any]:
    schemes: Counter[str] = Counter()
    for q in ckpt.quantised:
        schemes[f"{q.scheme} {q.bits}-bit"] += 1
    return {
        "path": ckpt.path, "format": ckpt.format, "files": list(ckpt.files),
        "tensors": len(ckpt.tensors), "total_bytes": ckpt.total_bytes,
        "bytes_by_dtype": ckpt.bytes_by_dtype(), "main_dtype": ckpt.main_dtype,
        "logical_params": ckpt.logical_params,
        "quantised_layers": dict(schemes), "quantised_bytes": ckpt.quantised_bytes,
        "config_source": ckpt.config_source, "source": "checkpoint headers (exact bytes)",
        "file_type": ckpt.metadata.get("general.file_type_name"),
    }
