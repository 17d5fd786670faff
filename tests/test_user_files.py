"""The user's files (issue 21): every command that takes a path, given a hostile one, exits 2
with one `error:` line (a `hint:` line may follow), no traceback and no hang, and leaves what
was there as it was. Outputs go only to new files or to gpuwise's own, which work."""

from __future__ import annotations

import hashlib
import json
import os
import random
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwise.errors import GpuwiseError
from gpuwise.files import own_output, read_text, replace_atomically, shown

GPUWISE = (sys.executable, "-c", "from gpuwise.cli import main; main()")
TIMEOUT_S = 60  # a hang fails its case instead of hanging the suite
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
PASS = (sys.executable, "-c", "pass")


# -- the hostile paths: each makes one in a folder and returns it ---------------------------


def _fifo(folder: Path, name: str) -> Path:
    os.mkfifo(folder / name)
    return folder / name


def _link_to(device: str) -> Callable[[Path, str], Path]:
    def make(folder: Path, name: str) -> Path:
        (folder / name).symlink_to(device)
        return folder / name

    return make


def _directory(folder: Path, name: str) -> Path:
    (folder / name).mkdir()
    return folder / name


def _unreadable(folder: Path, name: str) -> Path:
    (folder / name).write_text('{"kind": "header", "format": "gpuwise-watch/1"}\n')
    (folder / name).chmod(0)
    return folder / name


def _in_read_only_folder(folder: Path, name: str) -> Path:
    (folder / "ro").mkdir()
    (folder / "ro").chmod(0o555)
    return folder / "ro" / name


def _binary(folder: Path, name: str) -> Path:
    (folder / name).write_bytes(bytes([0xFF, 0xFE, 0x00]) + random.Random(0).randbytes(4096))
    return folder / name


def _huge_sparse(folder: Path, name: str) -> Path:
    with open(folder / name, "wb") as f:
        f.truncate(10 * 1024**3)  # 10 GB of holes: no disk used
    return folder / name


def _empty(folder: Path, name: str) -> Path:
    (folder / name).write_bytes(b"")
    return folder / name


def _truncated(folder: Path, name: str) -> Path:
    (folder / name).write_bytes(b'{"kind": "study", "comm')  # a header cut short
    return folder / name


HOSTILE: dict[str, Callable[[Path, str], Path]] = {
    "fifo": _fifo,
    "link-to-dev-zero": _link_to("/dev/zero"),
    "link-to-dev-urandom": _link_to("/dev/urandom"),
    "directory": _directory,
    "unreadable": _unreadable,
    "in-read-only-folder": _in_read_only_folder,
    # Through a link: code that deleted or renamed over the path itself (as `repro --fresh`
    # once did) would, run as root, remove the machine's /dev/full; this removes only the link.
    "link-to-dev-full": _link_to("/dev/full"),
    "binary": _binary,
    "huge-sparse": _huge_sparse,
    "empty": _empty,
    "truncated": _truncated,
}
ROOT_READS_ANYWAY = {"unreadable", "in-read-only-folder"}
DEVICES = ("/dev/zero", "/dev/urandom", "/dev/full")



def option_now(name: str) -> str:
    """The option's current name (one renamed for the shared vocabulary notes the old one)."""
    import gpuwise.cli.common as common

    return dict(getattr(common, "RENAMED", {})).get(name, name)


# Every command that takes a path: (file name to make, argv with PATH in it).
COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "check-config": ("config.json", ("check", "PATH", "--on", "h100")),
    "check-safetensors": ("model.safetensors", ("check", "PATH", "--on", "h100")),
    "infer-gguf": ("model.gguf", ("infer", "PATH", "--on", "h100")),
    "watch-report": ("run.jsonl", ("watch", "--report", "PATH")),
    "watch-log": ("run.jsonl", ("watch", "--log", "PATH", "--", *PASS)),
    "repro-results": ("results.jsonl", ("repro", "--results", "PATH", "--runs", "1", "--", *PASS)),
    "repro-fresh": ("results.jsonl", ("repro", "--fresh", "--results", "PATH", "--runs", "1",
                                      "--", *PASS)),
    "advise-measured-util": ("run.jsonl", ("advise", "llama-3.1-8b", "--requests-per-day", "1000",
                                           option_now("--measured-util"), "PATH")),
    "infer-html": ("report.html", ("infer", "llama-3.1-8b", "--on", "h100", "--html", "PATH")),
}


OUTPUTS = ("watch-log", "repro-results", "repro-fresh", "infer-html")  # commands that write PATH


def test_an_empty_file_is_a_fine_output(tmp_path: Path) -> None:
    for command in OUTPUTS:
        name, argv = COMMANDS[command]
        path = _empty(tmp_path, f"{command}-{name}")
        proc = gpuwise(*(str(path) if a == "PATH" else a for a in argv), cwd=tmp_path)
        assert "is not a gpuwise" not in proc.stderr and "Traceback" not in proc.stderr
        first = path.read_text().splitlines()[0]  # gpuwise's own, first line
        if path.suffix == ".html":
            assert first == "<!DOCTYPE html><!-- gpuwise report -->", first
            continue
        header = json.loads(first)
        assert header["kind"] in ("header", "study"), header


def gpuwise(*args: str, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh process (a hang is a timeout, not a stuck suite)."""
    return subprocess.run([*GPUWISE, *args], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def state(path: Path) -> tuple[object, ...] | None:
    """What is at `path` (the link itself, not its target): type, size, mtime, and the bytes'
    digest of a small regular file; None when nothing is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    digest = ""
    if path.is_file() and not path.is_symlink() and st.st_size < 1 << 20 and st.st_mode & 0o444:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    listing = sorted(os.listdir(path)) if path.is_dir() and not path.is_symlink() else []
    return st.st_mode, st.st_size, st.st_mtime_ns, digest, listing


def assert_one_clear_line(proc: subprocess.CompletedProcess[str]) -> None:
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert lines and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), proc.stderr
    assert len(lines[0]) < 400  # names are cut, never echoed in full


def devices_now() -> dict[str, tuple[int, int]]:
    return {d: (stat.S_IFMT(os.stat(d).st_mode), os.stat(d).st_rdev) for d in DEVICES}


def test_the_devices_the_table_links_to_are_devices() -> None:
    assert all(kind == stat.S_IFCHR for kind, _ in devices_now().values())


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_hostile_path_is_one_line_exit_2_and_left_as_it_was(
    command: str, kind: str, tmp_path: Path
) -> None:
    if IS_ROOT and kind in ROOT_READS_ANYWAY:
        pytest.skip("root reads and writes regardless of permissions")
    if kind == "empty" and command in OUTPUTS:
        pytest.skip("an empty file is a fine output (test_an_empty_file_is_a_fine_output)")
    name, argv = COMMANDS[command]
    path = HOSTILE[kind](tmp_path, name)
    devices = devices_now()
    before = state(path)
    start = time.monotonic()
    proc = gpuwise(*(str(path) if a == "PATH" else a for a in argv), cwd=tmp_path)
    assert time.monotonic() - start < TIMEOUT_S
    assert_one_clear_line(proc)
    assert state(path) == before
    assert devices_now() == devices  # still the devices they were
    if kind == "in-read-only-folder":
        (tmp_path / "ro").chmod(0o755)  # so that pytest can clean up


# -- outputs that are gpuwise's own are written -------------------------------------------


def test_a_new_watch_log_is_written_and_read_back(tmp_path: Path) -> None:
    log = tmp_path / "sub" / "run.jsonl"  # its folder is made
    proc = gpuwise("watch", "--json", "--log", str(log), "--", *PASS)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(log.read_text().splitlines()[0])["kind"] == "header"
    assert gpuwise("watch", "--report", str(log), "--json").returncode == 0


def test_a_watch_log_of_gpuwise_own_is_replaced(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    assert gpuwise("watch", "--json", "--log", str(log), "--", *PASS).returncode == 0
    first = log.read_text()
    proc = gpuwise("watch", "--json", "--log", str(log), "--", *PASS)
    assert proc.returncode == 0, proc.stderr
    kinds = [json.loads(line)["kind"] for line in log.read_text().splitlines()]
    assert kinds.count("header") == 1 and log.read_text() != first


def test_a_user_file_given_as_the_watch_log_is_refused_untouched(tmp_path: Path) -> None:
    keep = tmp_path / "keep.py"
    keep.write_text("print('mine')\n")
    proc = gpuwise("watch", "--log", str(keep), "--", *PASS)
    assert_one_clear_line(proc)
    assert "keep.py" in proc.stderr and keep.read_text() == "print('mine')\n"


def _study(results: Path, counts: Path, fresh: bool = False) -> subprocess.CompletedProcess[str]:
    code = ("import sys; open(sys.argv[1], 'a').write('run\\n'); "
            "print('{\"loss\": 0.5}')")
    return gpuwise("repro", "--json", *(("--fresh",) if fresh else ()), "--results", str(results),
                   "--runs", "2", "--conditions", "same-seed", "--",
                   sys.executable, "-c", code, str(counts))


def test_repro_resumes_from_its_own_results_and_fresh_starts_it_over(tmp_path: Path) -> None:
    results, counts = tmp_path / "results.jsonl", tmp_path / "counts.txt"
    assert _study(results, counts).returncode == 0
    assert len(counts.read_text().splitlines()) == 2
    assert _study(results, counts).returncode == 0  # every run is there: none runs again
    assert len(counts.read_text().splitlines()) == 2
    proc = _study(results, counts, fresh=True)
    assert proc.returncode == 0, proc.stderr
    assert len(counts.read_text().splitlines()) == 4
    kinds = [json.loads(line)["kind"] for line in results.read_text().splitlines()]
    assert kinds == ["study", "run", "run"]


def test_repro_refuses_a_watch_log_and_a_watch_refuses_a_results_file(tmp_path: Path) -> None:
    log, results = tmp_path / "run.jsonl", tmp_path / "results.jsonl"
    assert gpuwise("watch", "--json", "--log", str(log), "--", *PASS).returncode == 0
    assert _study(results, tmp_path / "counts.txt").returncode == 0
    for argv in (("watch", "--log", str(results), "--", *PASS),
                 ("repro", "--fresh", "--results", str(log), "--", *PASS)):
        before = (state(log), state(results))
        assert_one_clear_line(gpuwise(*argv))
        assert (state(log), state(results)) == before


# -- the helpers themselves ---------------------------------------------------------------------


def test_shown_cuts_a_long_name_in_the_middle() -> None:
    assert shown("short") == "short"
    cut = shown("x" * 100_000)
    assert len(cut) < 120 and "100,000 characters" in cut


def test_an_unreadable_file_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.json"
    path.write_text("{}")

    def refuse(*args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(GpuwiseError, match="cannot read model config .*Permission denied"):
        read_text(path, "model config", 1000)


def test_a_replace_that_cannot_be_written_leaves_the_old_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(GpuwiseError, match="is not a directory"):
        replace_atomically(tmp_path / "file" / "out.json", b"{}", "probe profile", "")
    (tmp_path / "old.json").write_text("old")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(GpuwiseError, match="is a directory, not a file gpuwise can write"):
        replace_atomically(tmp_path / "dir.json", b"{}", "probe profile", "")
    (tmp_path / "full").symlink_to("/dev/full")
    with pytest.raises(GpuwiseError, match="is a device"):
        replace_atomically(tmp_path / "full", b"{}", "probe profile", "")
    replace_atomically(tmp_path / "old.json", b"new", "probe profile", "")
    assert (tmp_path / "old.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "file", "full", "old.json"]


def test_own_output_takes_a_new_path_and_an_empty_file(tmp_path: Path) -> None:
    assert own_output(tmp_path / "new" / "x.jsonl", bool, "log", "") == tmp_path / "new" / "x.jsonl"
    (tmp_path / "empty").write_bytes(b"")  # nothing to lose: `--log $(mktemp)` works
    assert own_output(tmp_path / "empty", bool, "log", "") == tmp_path / "empty"
    (tmp_path / "mine").write_bytes(b"notes\n")
    with pytest.raises(GpuwiseError, match="exists and is not a gpuwise log"):
        own_output(tmp_path / "mine", lambda head: False, "log", "")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(GpuwiseError, match="link to a missing file"):
        own_output(tmp_path / "dangling", bool, "log", "")


def test_a_probe_that_cannot_be_saved_in_the_cache_is_saved_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_probe_merge import _profile

    from gpuwise.measure.probe.store import load_profile, save_profile

    (tmp_path / "cache").write_text("a file, not a directory")
    monkeypatch.setenv("GPUWISE_CACHE_DIR", str(tmp_path / "cache"))
    profile = _profile(1.0)
    with pytest.raises(GpuwiseError, match="saved to .* instead") as caught:
        save_profile(profile)
    aside = Path(caught.value.message.split("saved to ")[1].split(" instead")[0])
    monkeypatch.setenv("GPUWISE_CACHE_DIR", str(aside.parent))
    assert load_profile(profile.backend, profile.fingerprint) == profile
    aside.unlink()
    aside.parent.rmdir()


def test_a_saved_profile_that_is_a_fifo_is_no_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuwise.measure.probe.store import CACHE_ENV, profile_path

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    os.mkfifo(profile_path("fp", "torch-cpu"))
    code = ("from gpuwise.measure.probe.store import load_profile; "
            "print(load_profile('torch-cpu', 'fp'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT_S)  # a hang is a timeout
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stderr


def test_an_unreadable_model_folder_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a user other than root sees a folder chmod 000 (root reads anyway: simulated)."""
    from gpuwise.cli import main

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    real_stat, real_scandir = os.stat, os.scandir

    def denied(path: object) -> bool:
        return str(path).startswith(f"{folder}{os.sep}")

    def stat_(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if denied(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    def scandir(path: object = ".") -> object:
        if str(path) == str(folder):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "stat", stat_)
    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(SystemExit) as exit_:
        main(["check", str(folder), "--on", "h100"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and "Permission denied" in err
    assert len(err.splitlines()) <= 2
