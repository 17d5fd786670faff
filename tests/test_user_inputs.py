"""The user's inputs that are not output files (issue 21): model names no file or hub id can
have, a hub without network, FIFOs inside model folders, a module factory that exits. Each is
one `error:` line and exit 2, never a traceback or a hang."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from test_user_files import assert_one_clear_line, gpuwise

# -- models: names, folders, the hub ----------------------------------------------------------


@pytest.mark.parametrize("name", ["a" * 100_000, "a/" + "b" * 3000, "a/b..c"])
def test_a_model_name_no_file_or_hub_id_can_have_is_one_short_line(name: str) -> None:
    proc = gpuwise("check", name, "--on", "h100", env={"HF_HUB_OFFLINE": "1"})
    assert_one_clear_line(proc)
    assert len(proc.stderr) < 600


def test_a_hub_id_without_network_is_one_offline_line_at_once(tmp_path: Path) -> None:
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": ""}
    start = time.monotonic()
    proc = gpuwise("check", "someone/not-a-real-model-xyz", "--on", "h100", env=env)
    assert time.monotonic() - start < 15  # no retry storm
    assert_one_clear_line(proc)
    assert proc.stderr.startswith("error: offline: ") and "local hub cache" in proc.stderr


def test_a_config_json_that_is_a_fifo_inside_a_model_folder_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "config.json")
    assert_one_clear_line(gpuwise("check", str(tmp_path), "--on", "h100"))


def test_a_safetensors_index_naming_a_fifo_shard_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00001.safetensors"}}))
    os.mkfifo(tmp_path / "model-00001.safetensors")
    (tmp_path / "config.json").write_text("{}")
    pytest.importorskip("safetensors")
    assert_one_clear_line(gpuwise("check", str(tmp_path), "--on", "h100"))


def test_a_module_factory_that_exits_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(4)\n")
    (tmp_path / "exits_in_factory.py").write_text("import sys\ndef build():\n    sys.exit(3)\n")
    for factory in ("exits_at_import:build", "exits_in_factory:build"):
        proc = gpuwise("module", factory, "--input", "2x8", cwd=tmp_path)
        assert_one_clear_line(proc)
        assert "SystemExit" in proc.stderr
