"""Every command of the docs' shell blocks, run as a user types it, or listed here with why not.

The commands are read from README.md and docs/*.md at test time (`tests/doc_examples.py` says
how: continuations, comments, `a | b` as "either", `[--opt]` as the plain and the full form).
Each runs through a shell (`bash -c`, so `COLUMNS=110 gpuwise ...`, pipes and loops work as
typed) in a fresh temporary folder, with HOME, XDG_CACHE_HOME, GPUWISE_CACHE_DIR and the
Hugging Face cache there and the hub offline; `.venv` in that folder is this venv, so
`.venv/bin/gpuwise` works as in the repository root. The files a command names are made for
real first (`tests/doc_placeholders.py`: a tiny GGUF, safetensors and GPTQ checkpoints, a
module factory, `train.py`, a request trace, watch logs).

Each run must exit 0 without a traceback; its output must hold what the docs promise
(PROMISES), every number of its JSON must be finite, no time negative, no memory negative or
above 1 PB, and its text must show no NaN, infinity or negative quantity. A command that
cannot run here is in NOT_RUN, one that runs in a cheaper form in SUBSTITUTED, each with its
reason, and is reported as a skip with that reason. A doc command that is neither run nor
listed, or a listed one the docs no longer show, fails `test_every_doc_command_is_run_or_listed`
or `test_listed_commands_are_in_the_docs`.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from doc_examples import (
    DocCommand,
    doc_commands,
    gpuwise_args,
    untagged_command_blocks,
    variants,
)
from doc_placeholders import make_placeholders, user_environment

PIP = "installs packages: CI's own install (`make install-test`) does this before the tests"
BENCH = "a benchmarks/ script, not the gpuwise CLI: run on demand (minutes to hours), its results in benchmarks/results/"
GPU_BENCH = "needs a CUDA GPU (benchmarks/gpu_check.sh on the GPU machine)"
LLAMA = "real llama.cpp: tests/test_llama_cpp_workflow.py"
PRIVATE_RAY = "a Ray cluster at a private address (10.0.0.5): not reachable offline"
TOOLS = "a tools/ script, not the gpuwise CLI: regenerates catalog data from benchmarks/results/"
SLURM = "a Slurm batch script for a multi-node GPU cluster (sbatch, srun, scontrol)"

# Doc commands (as extracted) that do not run here, each with its reason.
NOT_RUN: dict[str, str] = {
    "pip install .": PIP,
    "pip install '.[nvidia]'": PIP,
    "pip install '.[checkpoints]'": PIP,
    "pip install '.[prometheus]'": PIP,
    "pip install torch --index-url https://download.pytorch.org/whl/cpu": PIP,
    "pip install '.[torch]'": PIP,
    "pip install 'gpuwise[llama]'": PIP,
    "pip install 'gpuwise[checkpoints]'": PIP,
    "pip install 'gpuwise[ray]'": PIP,
    "pip install 'gpuwise[prometheus]'": PIP,
    "pip install 'gpuwise[html]'": PIP,
    "make run": "make: creates .venv and installs (network); CI's own set-up",
    "make test": "make: the whole test suite, of which this test is a part",
    "gpuwise probe --runtime llama.cpp": LLAMA,
    "gpuwise infer tinyllama-1.1b --runtime llama.cpp --weights q4_0 --threads 2": LLAMA,
    "gpuwise repro --ray 10.0.0.5:6379 --runs 20 -- python train.py": PRIVATE_RAY,
    "gpuwise repro --ray 10.0.0.5:6379 --runs 10 --results /shared/study.jsonl -- python train.py":
        PRIVATE_RAY,
    "gpuwise repro --ray --runs 10 -- python train.py":
        "starts a local Ray on every core (tens of seconds and GBs on a shared 2-core machine); "
        "tests/test_repro_ray.py runs repro's Ray path",
    "gpuwise claims --html docs/claims-cpu.html":
        "regenerates the repository's own page (3 minutes); `claims --quick --html` runs here",
    "script: #SBATCH --job-name=repro --nodes=4 --ntasks-per-node=1 --gpus-per-node=4": SLURM,
    "script: #SBATCH --job-name=llama-sft --nodes=4 --ntasks-per-node=1 --gpus-per-node=8": SLURM,
    ".venv/bin/python benchmarks/blas_buffers_trace.py --threads 2": BENCH,
    ".venv/bin/python benchmarks/blas_buffers_trace.py --threads 4 --step 10": BENCH,
    ".venv/bin/python benchmarks/validate_llama_cpp_memory.py": BENCH,
    ".venv/bin/python benchmarks/validate_cpu.py": BENCH,
    ".venv/bin/python benchmarks/validate_cpu.py --reestimate": BENCH,
    ".venv/bin/python benchmarks/validate_cpu.py --time --passes 3": BENCH,
    ".venv/bin/python benchmarks/malloc_trace.py --json benchmarks/results/malloc_trace.json":
        BENCH,
    ".venv/bin/python benchmarks/validate_gpu.py compare benchmarks/results/gpu_h200/"
    "gpu_measured.json --out /tmp/compare.json": BENCH,
    ".venv/bin/python benchmarks/validate_gpu.py compare benchmarks/results/gpu_h200/"
    "gpu_measured.json --out benchmarks/results/gpu_h200/compare.json": BENCH,
    ".venv/bin/python tools/write_time_intervals.py": TOOLS,
    ".venv/bin/python tools/write_time_intervals.py --check": TOOLS,
    "OUT=gpu_out STEPS=memory bash benchmarks/gpu_check.sh": GPU_BENCH,
    "OUT=out PROBE_S=270 RUNS_S=330 bash benchmarks/gpu_check.sh": GPU_BENCH,
    "python3 benchmarks/gpu_memory_check.py measure --out gpu_out [--quick] [--budget-s 360]":
        GPU_BENCH,
    ".venv/bin/python benchmarks/gpu_memory_check.py compare gpu_out/gpu_memory.json --out "
    "/tmp/memory_compare.json": "compares a GPU run's gpu_out/gpu_memory.json: " + GPU_BENCH,
    ".venv/bin/python benchmarks/validate_published_memory.py": BENCH,
    ".venv/bin/python benchmarks/validate_modules.py --json": BENCH,
    ".venv/bin/python benchmarks/validate_modules.py --no-memory --passes 5 --json > "
    "benchmarks/results/modules_time.json": BENCH,
    ".venv/bin/python benchmarks/repro_ray_overhead.py": BENCH,
    ".venv/bin/python benchmarks/repro_ray_overhead.py --slots 2": BENCH,
    ".venv/bin/python benchmarks/probe_vs_reference.py": BENCH,
    ".venv/bin/python benchmarks/estimate_speed.py": BENCH,
    ".venv/bin/python benchmarks/validate_serving.py --json "
    "benchmarks/results/serving_published.json": BENCH,
    ".venv/bin/python benchmarks/validate_serving_heldout.py": BENCH,
    ".venv/bin/python benchmarks/serve_llama_server.py --server build/bin/llama-server":
        "needs a llama-server build (.ci/llama_server.sh): " + BENCH,
    ".venv/bin/python benchmarks/validate_serve_llama_cpp.py --json "
    "benchmarks/results/serve_llama_cpp_compare.json": BENCH,
    ".venv/bin/python benchmarks/llama_cpp_shared_cells.py --json "
    "benchmarks/results/llama_cpp_shared_cells.json": BENCH,
    ".venv/bin/python benchmarks/serve_speed.py": BENCH,
    ".venv/bin/python benchmarks/validate_published.py": BENCH,
    ".venv/bin/python benchmarks/validate_runtimes.py --json "
    "benchmarks/results/runtimes_published.json": BENCH,
    ".venv/bin/python benchmarks/validate_llama_cpp.py --cache DIR": "needs llama-cpp-python and a probe: " + BENCH,
    ".venv/bin/python benchmarks/watch_overhead.py": BENCH,
    ".venv/bin/python benchmarks/reestimate_llama_cpp.py": "its figure is checked against the docs "
                                                           "in tests/test_reestimate_llama_cpp.py",
    ".venv/bin/python benchmarks/watch_overhead.py --whole --repeats 3 --steps 120": BENCH,
}

QUICK_PROBE = "a full probe takes 2.5-5.5 minutes on 2 cores (docs/speed.md); --quick, the same path"
FEW_CLAIMS = (
    "the claims' real experiments take 4-9 minutes on a busy 2-core machine even with --quick "
    "(50 s idle, docs/claims.md; tests/test_claims.py runs them); the estimate-only claim, "
    "--quick, takes the same command path, its table printed as without --html"
)
CLAIMS_PAGE = "gpuwise claims --quick --only memory --html report.html"
FEW_RANKS = ("8 ranks on a 2-core machine take minutes; 2 ranks (gloo) run the same path, and "
             "port 0 picks a free one (a fixed port can be taken on a shared CI machine)")
FREE_PORT = "a fixed port can be taken on a shared CI machine; 0 picks a free one"

# Doc commands (a variant, as run) that run in a cheaper or safer form: (what runs, why).
SUBSTITUTED: dict[str, tuple[str, str]] = {
    "gpuwise probe": ("gpuwise probe --quick --repeat 3", QUICK_PROBE + " (README.md's full form)"),
    ".venv/bin/gpuwise probe --repeat 3": ("gpuwise probe --quick --repeat 3", QUICK_PROBE),
    "gpuwise claims": (CLAIMS_PAGE, FEW_CLAIMS),
    "gpuwise claims --quick": (CLAIMS_PAGE, FEW_CLAIMS),
    "gpuwise claims --quick --html report.html": (CLAIMS_PAGE, FEW_CLAIMS),
    "gpuwise claims --html claims.html": (CLAIMS_PAGE, FEW_CLAIMS + "; the page named as README's"),
    "gpuwise claims --json": ("gpuwise claims --quick --only memory --json", FEW_CLAIMS),
    "gpuwise claims --only bandwidth,energy": (CLAIMS_PAGE, FEW_CLAIMS),
    "gpuwise validate infer smollm2-135m --prompt 512 --weights fp32":
        ("gpuwise validate infer smollm2-135m --prompt 16 --new-tokens 8 --weights fp32",
         "a real run: 512-token prompts take minutes on a busy 2-core machine"),
    "for s in 1 2 3; do PYTHONHASHSEED=$s setarch -R .venv/bin/gpuwise validate infer gpt2 "
    "--batch 2 --prompt 512 --new-tokens 8 --weights fp32 --attention eager --no-time --json "
    "| jq '.measured_passes_model_bytes'; done":
        ("for s in 1; do PYTHONHASHSEED=$s setarch -R .venv/bin/gpuwise validate infer gpt2 "
         "--batch 2 --prompt 16 --new-tokens 2 --weights fp32 --attention eager --no-time --json "
         "| jq '.measured_passes_model_bytes'; done",
         "one real run of 16-token prompts, not three of 512 (each a minute or more on a busy "
         "2-core machine): the same path"),
    "gpuwise repro --runs 5 --parallel 2 --detect 0.1% --results /tmp/r7/doc.jsonl --fresh "
    "-- .venv/bin/python tests/repro_train.py":
        ("gpuwise repro --runs 2 --parallel 2 --detect 0.1% --results r7/doc.jsonl --fresh "
         "-- .venv/bin/python tests/repro_train.py --steps 5",
         "the doc's study takes 3 minutes: 2 runs of 5 steps; results in the temporary folder"),
    "gpuwise watch --log run.jsonl --interval 0.5 -- torchrun --nproc_per_node 8 train.py":
        ("gpuwise watch --log run.jsonl --interval 0.5 -- torchrun --standalone "
         "--nproc_per_node 2 train.py", FEW_RANKS),
    "gpuwise watch --prometheus 9400 -- torchrun --nproc_per_node 8 train.py":
        ("gpuwise watch --prometheus 0 -- torchrun --standalone --nproc_per_node 2 train.py",
         FEW_RANKS),
    "gpuwise watch --prometheus 127.0.0.1:9400 --job-name llama-sft -- python train.py":
        ("gpuwise watch --prometheus 127.0.0.1:0 --job-name llama-sft -- python train.py",
         FREE_PORT),
}

# What the docs promise a command prints: (pattern matched in the command, strings its text
# output must hold) for commands without `--json` ...
TEXT_PROMISES: list[tuple[str, tuple[str, ...]]] = [
    (r"^gpuwise infer .*(\.gguf|GPTQ/|\.safetensors)", ("weights source: checkpoint (exact bytes)",)),
    (r"^gpuwise check .*\.safetensors", ("exact",)),
    (r"^gpuwise infer (?!.*--ops)", ("80%",)),
    (r"^gpuwise infer .*--ops", ("decode",)),
    (r"serve .*--sweep", ("highest rate",)),
    (r"^gpuwise serve (?!.*--sweep)", ("time to first token", "time per output token")),
    (r"^(COLUMNS=\d+ )?gpuwise advise", ("recommendation",)),
    (r"^gpuwise cost ", ("$",)),
    (r"^gpuwise probe", ("saved",)),  # "saved to", or "saved aside to" when not trusted
    (r"^gpuwise repro", ("Runs per condition",)),
    (r"^gpuwise watch (?!--report)", ("gpuwise watch (measured)", "exit code 0")),
    (r"^gpuwise watch (?!--report|--no-inject)", ("Where each step's time went",)),
    (r"^gpuwise watch --report", ("gpuwise watch (measured)",)),
    (r"--prometheus", ("metrics for Prometheus at",)),
    (r"^gpuwise --version", ("gpuwise",)),
    (r"^gpuwise --install-completion", ("completion installed",)),
    (r"^gpuwise claims", ("claim", "verdict")),
]
# ... and the fields the JSON record of a `--json` command must hold (at any depth).
JSON_PROMISES: list[tuple[str, tuple[str, ...]]] = [
    (r"^gpuwise check .*\.safetensors", ("checkpoint", "precisions", "bytes_by_dtype")),
    (r"^gpuwise serve", ("ttft_s", "tpot_s", "e2e_s", "goodput_requests_per_s")),
    (r"^gpuwise watch", ("verdict", "summary")),
    (r"^gpuwise repro", ("conditions",)),
    (r"^gpuwise claims", ("claims",)),
    (r"^gpuwise module", ("memory",)),
]

SLOW_WORDS = ("probe", "claims", "validate", "watch", "repro", "torchrun")
TIMEOUT_S = 600
PB = 1e15


@dataclass
class Run:
    """A command as it runs, and where the docs show it (several docs may show one command)."""

    command: str
    shown_at: list[str] = field(default_factory=list)
    substituted_for: list[tuple[str, str]] = field(default_factory=list)


def _runs() -> list[Run]:
    runs: dict[str, Run] = {}
    for doc in doc_commands():
        if doc.text in NOT_RUN:
            continue
        for variant in variants(doc.text):
            command, reason = SUBSTITUTED.get(variant, (variant, ""))
            run = runs.setdefault(command, Run(command))
            run.shown_at.append(doc.where)
            if reason:
                run.substituted_for.append((variant, reason))
    return list(runs.values())


def _runnable(command: str) -> bool:
    return gpuwise_args(command) is not None or "gpuwise " in command


def _listed() -> list[DocCommand]:
    return [doc for doc in doc_commands() if doc.text in NOT_RUN]


def _param(run: Run) -> object:
    slow = any(word in run.command.split() for word in SLOW_WORDS) or "for " in run.command
    marks = [pytest.mark.slow] if slow else []
    return pytest.param(run, id=f"{run.shown_at[0]} {run.command[:70]}", marks=marks)


# ------------------------------------------------------------------------ the lists' own checks


def test_every_doc_command_is_run_or_listed():
    unknown = [f"{d.where}: {d.text}" for d in doc_commands()
               if d.text not in NOT_RUN and not all(_runnable(v) for v in variants(d.text))]
    assert not unknown, ("doc commands neither run nor listed in NOT_RUN (add each, with its "
                         "reason, or make it runnable):\n" + "\n".join(unknown))


def test_listed_commands_are_in_the_docs():
    texts = {d.text for d in doc_commands()}
    shown_variants = {v for text in texts for v in variants(text)}
    stale = [t for t in NOT_RUN if t not in texts]
    stale += [t for t in SUBSTITUTED if t not in shown_variants]
    assert not stale, "listed commands the docs no longer show:\n" + "\n".join(stale)


def test_no_command_block_escapes_the_run():
    assert not untagged_command_blocks(), (
        "fenced blocks with commands but no language (tag them ```sh or ```console): "
        + ", ".join(untagged_command_blocks())
    )


def test_the_docs_have_commands():
    assert len(doc_commands()) > 50 and len(_runs()) > 30


# ------------------------------------------------------------------------------ the runs


@pytest.mark.parametrize("doc", _listed(), ids=lambda d: f"{d.where} {d.text[:60]}")
def test_listed_doc_command(doc: DocCommand):
    pytest.skip(f"{doc.where} `{doc.text}`: not run: {NOT_RUN[doc.text]}")


@pytest.mark.parametrize("shown", sorted(SUBSTITUTED), ids=lambda text: text[:70])
def test_substituted_doc_command(shown: str):
    """Reported as a skip so that the CI log names each substitution and its reason; the
    command run instead is a test_doc_command."""
    command, reason = SUBSTITUTED[shown]
    pytest.skip(f"`{shown}` runs as `{command}`: {reason}")


@pytest.mark.parametrize("run", [_param(r) for r in _runs()])
def test_doc_command(run: Run, tmp_path: Path):
    for shown, reason in run.substituted_for:
        print(f"substituted for `{shown}`: {reason}")
    cwd, env = tmp_path / "work", user_environment(tmp_path)
    cwd.mkdir()
    (cwd / ".venv").symlink_to(Path(sys.prefix))
    make_placeholders(_words(run.command), cwd, env)
    proc = run_as_typed(run.command, cwd, env)
    output = proc.stdout + proc.stderr
    where = f"{', '.join(run.shown_at)}: `{run.command}`"
    assert proc.returncode == 0, f"{where} exited {proc.returncode}:\n{output[-4000:]}"
    assert "Traceback" not in output, f"{where} printed a traceback:\n{output[-4000:]}"
    prints_json = "--json" in run.command.split() and "| jq" not in run.command
    record = json_record(proc.stdout, where) if prints_json else None
    check_promises(run.command, output, record, where)
    check_text_numbers(output, where)
    check_json_numbers(record, where)
    check_files(run.command, cwd, env, output, where)
    if "| jq" in run.command:
        check_jq_values(run.command, proc.stdout, where)


def run_as_typed(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The command through bash, which stays its parent as a user's shell is (`bash -c CMD`
    alone would exec CMD, and `--install-completion` asks its parent which shell it is); a
    torchrun job whose rank aborted in gloo's own teardown (SIGABRT, seen on a loaded 2-core
    machine; tests/test_watch_runs.py retries too) once more."""
    for _ in range(2):
        proc = subprocess.run(["bash", "-c", f"{command}\nexit $?"], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        if proc.returncode == 0 or "torchrun" not in command or "SIGABRT" not in proc.stderr:
            break
    return proc


def _words(command: str) -> list[str]:
    return [w.strip("'\"") for w in command.replace(";", " ").split()]


# ----------------------------------------------------------------------- what is checked


def check_promises(command: str, output: str, record: object, where: str) -> None:
    """The docs' promises: strings in the text output, or fields of the JSON record."""
    plain = re.sub(r"^(\S+=\S+ )*(\.venv/bin/)?", "", command)
    promises = JSON_PROMISES if record is not None else TEXT_PROMISES
    present = json_keys(record) if record is not None else set()
    for pattern, expected in promises:
        if re.search(pattern, plain):
            missing = [e for e in expected if (e not in present if record is not None
                                                else e not in output)]
            assert not missing, f"{where}: output lacks {missing}:\n{output[-3000:]}"


def json_keys(record: object) -> set[str]:
    if isinstance(record, dict):
        return set(record) | {k for v in record.values() for k in json_keys(v)}
    if isinstance(record, list):
        return {k for v in record for k in json_keys(v)}
    return set()


NEGATIVE_QUANTITY = re.compile(r"(?<![\w.\-])-\d[\d.,]*\s?(ms|s|us|µs|B|KiB|MiB|GiB|TiB|W|J)\b")
NOT_A_NUMBER = re.compile(r"(?<![\w-])(nan|NaN|inf|-inf|Infinity)(?![\w-])")
BIG_MEMORY = re.compile(r"\b[\d.,]+\s?(PiB|EiB|PB|EB)\b")


def check_text_numbers(output: str, where: str) -> None:
    for pattern, what in ((NEGATIVE_QUANTITY, "a negative quantity"),
                          (NOT_A_NUMBER, "a NaN or an infinity"),
                          (BIG_MEMORY, "a memory of petabytes")):
        found = pattern.search(output)
        assert not found, f"{where} printed {what}: {_around(output, found)}"


def _around(text: str, match: re.Match | None) -> str:
    if match is None:
        return ""
    return repr(text[max(0, match.start() - 150) : match.end() + 80])


def json_record(stdout: str, where: str) -> object:
    """The command's JSON: all of stdout, or its last line (watch and repro: the job's own
    output comes first)."""
    text = stdout.strip()
    for candidate in (text, text.splitlines()[-1] if text else ""):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    raise AssertionError(f"{where}: stdout is no JSON record:\n{stdout[-2000:]}")


TIME_KEY = re.compile(r"(^|_)(s|ms|us|seconds|time)$|_s_|_ms_")
BYTES_KEY = re.compile(r"bytes")
# Times an estimate or a measurement always has, so zero is as wrong as negative (the key, or
# its parent for the {mean, p50, p90, p99} records of serve).
HEADLINE_TIMES = {"ttft_s", "tpot_s", "e2e_s", "itl_s", "s_per_token", "prefill_s",
                  "decode_s_per_token", "step_s", "duration_s"}


def check_json_numbers(record: object, where: str, path: str = "") -> None:
    """Every number finite; times not negative (headline times above zero); memory not
    negative nor above 1 PB."""
    if isinstance(record, dict):
        for key, value in record.items():
            check_json_numbers(value, where, f"{path}.{key}")
        return
    if isinstance(record, list):
        for i, value in enumerate(record):
            check_json_numbers(value, where, f"{path}[{i}]")
        return
    if isinstance(record, bool) or not isinstance(record, int | float):
        return
    keys = re.findall(r"\.([^.\[]+)", path) or [""]
    assert math.isfinite(record), f"{where}: {path} = {record}"
    if TIME_KEY.search(keys[-1]):
        assert record >= 0, f"{where}: a negative time {path} = {record}"
    if HEADLINE_TIMES & set(keys[-2:]):
        assert record > 0, f"{where}: a time of zero or less, {path} = {record}"
    if BYTES_KEY.search(keys[-1]):
        assert 0 <= record <= PB, f"{where}: memory {path} = {record} bytes"


def check_files(command: str, cwd: Path, env: dict[str, str], output: str, where: str) -> None:
    """What a command writes: its --html page, the completion script, the results file."""
    words = command.split()
    if "--html" in words:
        page = cwd / words[words.index("--html") + 1]
        assert page.read_text().startswith("<!DOCTYPE html><!-- gpuwise report -->"), where
    if "--install-completion" in words:
        scripts = list(Path(env["HOME"]).rglob("*gpuwise*"))
        assert scripts, f"{where}: no completion script in HOME: {output}"


def check_jq_values(command: str, stdout: str, where: str) -> None:
    """A loop piping each run's JSON through jq: one value a run (a byte count or a list of
    them, one a pass), each in range."""
    runs = re.search(r"for \w+ in ([^;]+);", command)
    assert runs, where
    values, at, decoder = [], 0, json.JSONDecoder()
    while stdout[at:].strip():
        at += len(stdout[at:]) - len(stdout[at:].lstrip())
        value, at = decoder.raw_decode(stdout, at)
        values.append(value)
    assert len(values) == len(runs.group(1).split()), f"{where}: {stdout!r}"
    numbers = [n for v in values for n in (v if isinstance(v, list) else [v])]
    assert numbers and all(isinstance(n, int | float) and 0 < n <= PB for n in numbers), (
        f"{where}: {values}"
    )
