"""Write a data file of the catalogue (gpuwise/catalog/data/), as the tools here do."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "gpuwise" / "catalog" / "data"


def write_data(name: str, data: dict[str, Any], argv: list[str] = sys.argv) -> Path:
    """Write `data` as JSON to the catalogue's `name`, or to the path given as argv[1]."""
    target = Path(argv[1]) if len(argv) > 1 else DATA / name
    target.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return target
