"""One vocabulary: the same idea has the same option name, default and unit on every command;
old names still work; every option is described; the catalogues stay readable at 80 columns;
ambiguous device names ask which one; the docs' worked examples are what the commands print."""

from __future__ import annotations

import importlib.metadata
import json
import os
import pydoc
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer
from test_cli import run  # the CLI contract's runner: exit code, stdout, stderr

import gpuwise
from gpuwise.catalog.hardware import load_hardware
from gpuwise.catalog.models import load_models
from gpuwise.cli import app
from gpuwise.cli.common import RENAMED, renamed_options, restore_argument_help
from gpuwise.estimate.watch.log_records import SampleRecord, StepRecord, WatchLog
from gpuwise.estimate.watch.summary import summarize
from gpuwise.estimate.watch.verdict import verdict

ROOT = Path(__file__).resolve().parents[1]

# (command, option): why its default differs from the other commands' (a phrase of its help).
DIFFERENT_DEFAULT = {
    ("validate infer", "--new-tokens"): "fewer here",
    ("validate train", "--seq"): "shorter here",
    ("validate train", "--dtype"): "fp32 here",
    ("module", "--batch"): "the inputs' own",
    ("module", "--dtype"): "as built",
    ("validate infer", "--weights"): "of the random weights",
    ("serve", "--runtime"): "what serves under load",
    ("advise", "--runtime"): "auto (vllm on GPUs",
    ("cost", "--runtime"): "auto (vllm on GPUs",
    ("advise", "--on"): "every priced device and this machine",
    ("plan", "--on"): "every priced device",
    ("plan", "--runtime"): "each that runs on the device",
    ("plan", "--tp"): "a comma list (default: 1,2,4,8",
}


def commands() -> list[tuple[str, click.Command]]:
    """Every command of the CLI with its path ('validate infer'), help restored."""
    found = []

    def walk(group: click.Group, path: tuple[str, ...]) -> None:
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                walk(cmd, (*path, name))
            else:
                restore_argument_help(cmd)
                found.append((" ".join((*path, name)), cmd))

    walk(typer.main.get_command(app), ())
    return found


def options() -> dict[str, dict[str, click.Option]]:
    """option name -> {command path: the option}"""
    out: dict[str, dict[str, click.Option]] = {}
    for path, cmd in commands():
        for p in cmd.params:
            if isinstance(p, click.Option):
                out.setdefault(p.opts[0], {})[path] = p
    return out


def test_one_name_for_prompt_and_generated_tokens():
    for path, cmd in commands():
        for p in cmd.params:
            text = (p.help or "").lower()
            if "prompt tokens" in text:
                assert p.opts == ["--prompt"], (path, p.opts)
            if "tokens generated" in text or "generated tokens per" in text:
                assert p.opts == ["--new-tokens"], (path, p.opts)
    have = {path for path, cmd in commands() if any(p.name == "new_tokens" or "--new-tokens" in
                                                    getattr(p, "opts", ()) for p in cmd.params)}
    assert {"check", "infer", "advise", "cost", "validate infer"} <= have


def test_old_names_are_not_listed_anywhere():
    for old in RENAMED:
        assert old not in options(), old
    for path, cmd in commands():
        assert "--utilisation" not in cmd.get_help(click.Context(cmd, info_name=path))


def test_same_option_same_default_unless_the_help_says_why():
    for name, by_command in options().items():
        defaults = {path: opt.default for path, opt in by_command.items()}
        usual = max(set(map(repr, defaults.values())), key=list(map(repr, defaults.values())).count)
        for path, default in defaults.items():
            if repr(default) == usual:
                continue
            why = DIFFERENT_DEFAULT.get((path, name))
            assert why, f"{path} {name} defaults to {default!r}, the others to {usual}"
            assert why in (by_command[path].help or ""), (path, name)


def test_every_option_and_argument_is_described():
    for path, cmd in commands():
        for p in cmd.params:
            assert (getattr(p, "help", None) or "").strip(), f"{path}: {p.name} has no help"


@pytest.mark.parametrize("path", [path for path, _ in commands()] + [""])
def test_help_is_plain_text_with_defaults(path, capsys):
    code, out, _ = run([*path.split(), "--help"], capsys)
    assert code == 0 and "\\[" not in out
    if path in ("check", "infer", "advise"):
        flat = " ".join(out.split())
        assert "[default: 512]" in flat and "[default: 128]" in flat


def test_old_names_still_work_with_a_note_on_a_terminal(capsys, monkeypatch):
    base = ["advise", "smollm2-135m", "--no-local", "--requests-per-day", "1000", "--json"]
    code, new, err = run([*base, "--new-tokens", "64", "--target-utilization", "50%",
                          "--measured-utilization", "0.5"], capsys)
    assert code == 0 and err == ""
    old_args = [*base, "--output", "64", "--utilisation=50%", "--measured-util", "0.5"]
    code, old, err = run(old_args, capsys)
    assert code == 0 and json.loads(old) == json.loads(new) and err == ""  # scripts: unchanged
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, old, err = run(old_args, capsys)
    assert code == 0 and json.loads(old) == json.loads(new)
    assert "--output is now --new-tokens" in err and "--utilisation is now" in err
    repro = dict(commands())["repro"]
    args = ["--devices", "0,1", "--runs", "2", "--", "python", "train.py", "--devices", "3"]
    assert renamed_options(repro, args) == ["--cuda-visible-devices", *args[1:]]
    assert renamed_options(dict(commands())["train"], ["--output", "5"]) == ["--output", "5"]


def test_catalogues_at_80_columns_show_every_id_and_alias_whole(capsys, monkeypatch):
    for columns in ("80", "0"):
        monkeypatch.setenv("COLUMNS", columns)
        for command, entries in (("hardware", load_hardware()), ("models", load_models())):
            code, out, _ = run([command], capsys)
            assert code == 0 and out.strip()
            assert max(len(line) for line in out.splitlines()) <= 80
            words = set(re.findall(r"[\w.+-]+", out))
            for e in entries:
                assert e.id in words, (command, e.id)
                for alias in e.aliases:
                    assert alias in words, (command, alias)
            code, wide, _ = run([command, "--wide"], capsys)
            assert code == 0 and len(wide) > len(out) * 0.9


def test_ambiguous_device_asks_which_one(capsys):
    code, _, err = run(["check", "gpt2", "--on", "a100"], capsys)
    assert code == 2 and err.startswith("error: a100 is ambiguous: one of ")
    for hw in ("a100-sxm-80gb", "a100-sxm-40gb", "a100-pcie-80gb", "a100-pcie-40gb"):
        assert hw in err
    for name, hw in (("h100", "h100-sxm"), ("4090", "rtx-4090"), ("a100-80gb", "a100-sxm-80gb"),
                     ("l4", "l4"), ("h200", "h200-sxm"), ("tpu-v5p", "tpu-v5p")):
        code, out, _ = run(["check", "gpt2", "--on", name, "--json"], capsys)
        assert code == 0 and json.loads(out)["hardware"]["id"] == hw


def test_suggestions_are_given_once(capsys):
    for args, name in ((["chek", "gpt2"], "'check'"), (["infer", "gpt2", "--bacth", "2"],
                                                         "'--batch'")):
        code, _, err = run(args, capsys)
        assert code == 2 and err.lower().count("did you mean") == 1 and err.count(name) == 1


def test_version_and_the_public_api():
    assert gpuwise.__version__ == importlib.metadata.version("gpuwise")
    text = pydoc.render_doc(gpuwise, renderer=pydoc.plaintext)
    for name in ("from_module", "watch", "seed_everything", "report_metric", "__version__"):
        assert name in gpuwise.__all__ and name in dir(gpuwise) and name in text


def test_version_option_and_shell_completion(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.strip() == f"gpuwise {gpuwise.__version__}"
    code, out, _ = run(["--help"], capsys)
    assert "--install-completion" in out and "--show-completion" in out
    env = {**os.environ, "_GPUWISE_COMPLETE": "complete_bash", "COMP_WORDS": "gpuwise inf",
           "COMP_CWORD": "1"}
    script = Path(sys.executable).parent / "gpuwise"  # completion is keyed by the program name
    done = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["infer"]


def test_advise_lists_assumptions_only_when_asked(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    base = ["advise", "smollm2-135m", "--no-local", "--requests-per-day", "1000"]
    _, short, _ = run(base, capsys)
    _, full, _ = run([*base, "--assumptions"], capsys)
    assert "--assumptions lists them" in short and "--electricity" not in short
    assert "--electricity" in full and "--hosting-per-kw-month" in full
    _, out, _ = run([*base, "--json"], capsys)
    assert len(json.loads(out)["assumptions"]) >= 9


def test_options_a_runtime_ignores_are_named(capsys):
    code, out, _ = run(["check", "gpt2", "--on", "l4", "--ctx", "4096", "--json"], capsys)
    assert code == 0
    notes = json.loads(out)["notes"]
    assert "--ctx applies to llama.cpp, sglang and vllm; ignored under transformers" in notes
    # and the row an L4 cannot run under transformers (FBGEMM fp8 needs compute capability 9.0)
    assert [n for n in notes if "ignored" not in n] == [
        "fp8: not offered, the fbgemm-fp8 kernel does not run on the NVIDIA L4 24GB: it needs "
        "compute capability 9.0 or later, this one has 8.9"]
    code, out, _ = run(["infer", "gpt2", "--on", "l4", "--runtime", "llama.cpp",
                        "--gpu-memory-utilization", "0.8", "--ctx", "4096"], capsys)
    assert code == 0 and "--gpu-memory-utilization applies to sglang and vllm; ignored under" in out
    assert "--ctx applies" not in out
    code, out, _ = run(["infer", "gpt2", "--on", "l4", "--json"], capsys)
    assert not any("ignored" in n for n in json.loads(out)["memory"]["notes"])


def _input_bound_tips(gpu_util: float | None) -> str:
    step_list = tuple(StepRecord(rank=0, pid=1, index=i, t_start=i * 0.1, step_s=0.1,
                                 data_s=0.06) for i in range(20))
    samples = (SampleRecord(t=0.5, gpu_util_percent=gpu_util),)
    v = verdict(summarize(WatchLog({}, step_list, samples)))
    assert v.bound == "input-bound"
    return " ".join(v.findings[0].suggestions)


def test_a_cpu_only_job_is_not_told_about_a_faster_gpu():
    assert "GPU" not in _input_bound_tips(None)
    assert "a faster GPU will not help" in _input_bound_tips(40.0)


def test_worked_examples_in_the_docs_are_current():
    done = subprocess.run([sys.executable, "tools/regenerate_doc_examples.py", "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_docs_use_no_old_option_names():
    """Only the README's table of renamed options names the old ones."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in page.read_text().splitlines():
            if line.startswith("| `") and "` | `--" in line:  # the table of renamed options
                continue
            for old in RENAMED:
                assert not re.search(re.escape(old) + r"(?![\w-])", line), f"{page.name}: {line}"
