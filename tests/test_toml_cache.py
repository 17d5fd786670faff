"""The catalogue's TOML files are parsed once per content (catalog/toml_cache.py): the kept
copy gives what tomllib gives, a changed file is parsed afresh, and a copy that is broken or
cannot be written is passed over."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from gpuwise.catalog.toml_cache import FOLDER, parsed_toml
from gpuwise.files import cache_dir

TEXT = 'a = 1\nb = 2.0\n[t]\nc = ["x", 3]\nd = { e = true }\n'


def _copies(name: str) -> list[Path]:
    folder = cache_dir() / FOLDER
    return sorted(folder.glob(f"{name}-*.json")) if folder.exists() else []


def test_the_kept_copy_is_what_tomllib_parses() -> None:
    assert not _copies("kept")
    first = parsed_toml(TEXT, "kept")
    assert first == tomllib.loads(TEXT) and len(_copies("kept")) == 1
    assert parsed_toml(TEXT, "kept") == first and isinstance(first["b"], float)
    hardware = resources.files("gpuwise.catalog").joinpath("data/hardware.toml").read_text()
    assert parsed_toml(hardware, "hardware") == parsed_toml(hardware, "hardware") == \
        tomllib.loads(hardware)


def test_a_changed_file_is_parsed_afresh_and_a_broken_copy_passed_over() -> None:
    parsed_toml(TEXT, "changed")
    changed = TEXT.replace("a = 1", "a = 5")
    assert parsed_toml(changed, "changed")["a"] == 5 and len(_copies("changed")) == 2
    for copy in _copies("changed"):
        copy.write_text("{not json")
    assert parsed_toml(TEXT, "changed") == tomllib.loads(TEXT)


def test_a_date_is_never_kept_and_an_unwritable_cache_is_passed_over(monkeypatch,
                                                                       tmp_path) -> None:
    dated = "when = 2025-10-01\n"
    assert parsed_toml(dated, "dated") == tomllib.loads(dated) and not _copies("dated")
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("GPUWISE_CACHE_DIR", str(blocked / "cache"))  # under a file
    assert parsed_toml(TEXT, "blocked") == tomllib.loads(TEXT)
