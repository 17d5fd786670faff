"""The catalogue's TOML files, parsed once per content. tomllib takes about 50 ms a process
for the whole catalogue (the hardware file alone 23 ms), JSON about 2: a parsed copy is kept
as JSON in gpuwise's cache folder (`files.cache_dir`) under a hash of the text, so a changed
file is parsed afresh. A copy that cannot be read or written is passed over, and the text is
parsed as before; a file whose values JSON cannot hold (dates) is never kept."""

from __future__ import annotations

import contextlib
import hashlib
import json
import tomllib
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.files import cache_dir, read_bytes, replace_atomically
from gpuwise.units import MIB

FOLDER = "catalogue"
MAX_COPY_BYTES = 64 * MIB


def parsed_toml(text: str, name: str) -> dict[str, Any]:
    """`tomllib.loads(text)`, from its kept copy where there is one."""
    digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
    path = cache_dir() / FOLDER / f"{name}-{digest}.json"
    try:
        kept = json.loads(read_bytes(path, "catalogue copy", MAX_COPY_BYTES))
        if isinstance(kept, dict):
            return kept
    except (GpuwiseError, ValueError):
        pass
    data = tomllib.loads(text)
    # not writable, or a value JSON cannot hold: parsed again next time
    with contextlib.suppress(GpuwiseError, TypeError, ValueError):
        replace_atomically(path, json.dumps(data).encode(), "catalogue copy", "")
    return data
