"""The command a plan hands back (gpuwise/workload/launch.py; docs/plan.md, "The command to run"):
every flag of every command is one its runtime has at the version recorded in
catalog/data/launch_flags.toml, each value is the plan's, what the plan leaves unset is left to
the runtime, replicas give a Kubernetes Deployment, a disaggregated pair gives the producer and
consumer, and what a runtime cannot run is refused in one line. Where vLLM is installed its own
parser reads the commands too."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import random
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpuwise.catalog.launch_flags import launch_flags
from gpuwise.errors import GpuwiseError
from gpuwise.workload.launch import (
    RUNTIMES,
    Launch,
    command,
    command_line,
    llama_server_command,
    replicas_snippet,
    sglang_command,
    vllm_command,
)

MODEL = "Qwen/Qwen2.5-7B-Instruct"
GGUF = "/models/qwen2.5-7b-instruct-q4_k_m.gguf"
# The flags that take no value (switches), by runtime; every other flag takes one.
SWITCHES = {
    "vllm": {"--enable-expert-parallel", "--enable-prefix-caching", "--no-enable-prefix-caching",
             "--enforce-eager"},
    "sglang": {"--disable-radix-cache", "--disable-cuda-graph"},
    "llama.cpp": {"--cpu-moe", "--cache-prompt", "--no-cache-prompt"},
}


def parsed(launch: Launch) -> tuple[list[str], dict[str, str | None]]:
    """(the words before the first flag, each flag with its value) of the launch's command,
    every flag checked against the recorded list and given once."""
    argv = command(launch)
    known = launch_flags(launch.runtime)
    assert argv[: len(known.program)] == list(known.program)
    rest = argv[len(known.program):]
    head: list[str] = []
    while rest and not rest[0].startswith("-"):
        head.append(rest.pop(0))
    flags: dict[str, str | None] = {}
    while rest:
        flag = rest.pop(0)
        assert flag.startswith("-"), f"{flag!r} is no flag: {argv}"
        assert flag in known.flags, f"{flag} is not in launch_flags.toml [{launch.runtime}]"
        assert flag not in flags, f"{flag} twice: {argv}"
        if flag in SWITCHES[launch.runtime]:
            flags[flag] = None
        else:
            assert rest and not rest[0].startswith("-"), f"{flag} has no value: {argv}"
            flags[flag] = rest.pop(0)
    return head, flags


def launches(runtime: str, n: int = 150, seed: int = 41) -> Iterator[Launch]:
    """`n` random launches a runtime can run, drawn over every field it reads."""
    rng = random.Random(seed)
    pick = rng.choice
    for _ in range(n):
        if runtime == "llama.cpp":
            cpu_moe = pick((False, True))
            yield Launch(MODEL, runtime, tp=pick((1, 2, 4)), gguf_file=GGUF,
                         weights=pick(("q4_k_m", "q8_0", "iq4_xs", "bf16")),
                         kv_dtype=pick((None, "fp8", "q4_0", "bf16", "fp16", "iq4_nl")),
                         max_model_len=pick((None, 4096, 32768)),
                         gpu_layers=pick((None, 0, 99)), cpu_moe=cpu_moe,
                         n_cpu_moe=None if cpu_moe else pick((None, 8)),
                         parallel=pick((None, 4)), max_num_batched_tokens=pick((None, 2048)),
                         ubatch_size=pick((None, 512)), prefix_caching=pick((None, True, False)),
                         port=pick((None, 8080)), replicas=pick((1, 3)))
            continue
        tp = pick((1, 2, 4, 8))
        pairs = [("bf16", "bf16"), ("fp16", "bf16"), ("fp8", "bf16"), ("fp8", "fp8"),
                 ("fp8-block", "fp8-block"), ("mxfp4", "mxfp4"), ("int4", "int4")]
        weights, checkpoint = pick(pairs + ([("nf4", "bf16")] if runtime == "vllm" else []))
        yield Launch(MODEL, runtime, tp=tp, pp=pick((1, 2)), replicas=pick((1, 3)),
                     expert_parallel=tp > 1 and pick((False, True)), weights=weights,
                     checkpoint=checkpoint, kv_dtype=pick((None, "fp8", "bf16")),
                     max_model_len=pick((None, 32768)),
                     gpu_memory_utilization=pick((None, 0.92)),
                     max_num_seqs=pick((None, 128)), max_num_batched_tokens=pick((None, 2048)),
                     prefix_caching=pick((None, True, False)),
                     cuda_graphs=pick((None, True, False)), port=pick((None, 9000)),
                     role=pick((None, "prefill", "decode")))


def refused(launch: Launch) -> str:
    with pytest.raises(GpuwiseError) as caught:
        command(launch)
    error = caught.value
    assert "\n" not in error.message and "\n" not in error.hint
    return f"{error.message} ({error.hint})"


def test_each_flag_list_names_its_version_and_sources():
    for runtime in RUNTIMES:
        known = launch_flags(runtime)
        assert known.version and known.read and known.program and len(known.flags) > 10
        assert known.sources and all(s.startswith("https://github.com/") for s in known.sources)
    assert "q8_0" in launch_flags("llama.cpp").cache_types


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_emitted_flag_is_in_the_runtimes_recorded_list(runtime):
    for launch in launches(runtime):
        parsed(launch)
        assert shlex.split(command_line(launch)) == command(launch)


def test_values_are_the_plans():
    plan = Launch(MODEL, tp=4, pp=2, replicas=3, expert_parallel=True, kv_dtype="fp8",
                  max_model_len=32768, gpu_memory_utilization=0.85, max_num_seqs=128,
                  max_num_batched_tokens=4096, prefix_caching=False, cuda_graphs=False, port=9000)
    head, vllm = parsed(plan)
    assert head == [MODEL]
    assert vllm == {"--tensor-parallel-size": "4", "--pipeline-parallel-size": "2",
                    "--data-parallel-size": "3", "--enable-expert-parallel": None,
                    "--kv-cache-dtype": "fp8", "--max-model-len": "32768",
                    "--gpu-memory-utilization": "0.85", "--max-num-seqs": "128",
                    "--max-num-batched-tokens": "4096", "--no-enable-prefix-caching": None,
                    "--enforce-eager": None, "--port": "9000"}
    _, sglang = parsed(replace(plan, runtime="sglang"))
    assert sglang_command(plan) == command(replace(plan, runtime="sglang"))  # as its runtime
    assert sglang == {"--model-path": MODEL, "--tp-size": "4", "--pp-size": "2", "--dp-size": "3",
                      "--ep-size": "4", "--kv-cache-dtype": "fp8_e4m3",
                      "--context-length": "32768", "--mem-fraction-static": "0.85",
                      "--max-running-requests": "128", "--chunked-prefill-size": "4096",
                      "--disable-radix-cache": None, "--disable-cuda-graph": None,
                      "--port": "9000"}
    small = Launch(MODEL, "llama.cpp", tp=2, weights="q4_k_m", gguf_file=GGUF, kv_dtype="fp8",
                   max_model_len=16384, gpu_layers=99, n_cpu_moe=12, max_num_seqs=4,
                   max_num_batched_tokens=2048, ubatch_size=512, prefix_caching=False, port=8080)
    _, llama = parsed(small)
    assert llama == {"-m": GGUF, "-c": "16384", "-ngl": "99", "--parallel": "4", "-b": "2048",
                     "-ub": "512", "--n-cpu-moe": "12", "-ctk": "q8_0", "-ctv": "q8_0",
                     "--no-cache-prompt": None, "--port": "8080"}
    assert parsed(replace(small, n_cpu_moe=None, cpu_moe=True, kv_dtype="q4_0",
                          prefix_caching=True))[1].items() >= {
        "--cpu-moe": None, "-ctk": "q4_0", "-ctv": "q4_0", "--cache-prompt": None}.items()
    assert "--enable-prefix-caching" in vllm_command(replace(plan, prefix_caching=True))


def test_what_the_plan_leaves_unset_is_left_to_the_runtime():
    assert command(Launch(MODEL)) == ["vllm", "serve", MODEL]
    assert command(Launch(MODEL, "sglang")) == [
        "python", "-m", "sglang.launch_server", "--model-path", MODEL]
    assert command(Launch(MODEL, "llama.cpp", weights="q4_k_m", gguf_file=GGUF)) == [
        "llama-server", "-m", GGUF]
    # 16-bit KV is the compute dtype's, CUDA graphs on and tp 1 are the defaults: no flag
    quiet = Launch(MODEL, tp=1, kv_dtype="bf16", cuda_graphs=True)
    assert command(quiet) == ["vllm", "serve", MODEL]
    assert command(replace(quiet, runtime="sglang", prefix_caching=True))[-1] == MODEL
    assert command(Launch(MODEL, "llama.cpp", weights="q8_0", gguf_file=GGUF,
                          kv_dtype="fp16", gpu_memory_utilization=0.9)) == [
        "llama-server", "-m", GGUF]  # llama.cpp reads no memory fraction


@pytest.mark.parametrize("runtime", ["vllm", "sglang"])
def test_weights_need_a_flag_only_where_the_checkpoint_is_not_in_their_format(runtime):
    flags = parsed(Launch(MODEL, runtime, weights="fp8"))[1]  # a bf16 checkpoint
    assert flags.get("--quantization") == "fp8"
    for stored in ("fp8", "fp8-block", "mxfp4", "int4", "nvfp4"):  # the config.json says
        assert "--quantization" not in parsed(
            Launch(MODEL, runtime, weights=stored, checkpoint=stored))[1]
    assert parsed(Launch(MODEL, runtime, weights="awq", checkpoint="gptq"))[1].get(
        "--quantization") is None  # both int4: AWQ or GPTQ, the checkpoint names which
    assert parsed(Launch(MODEL, runtime, weights="fp16"))[1].get("--dtype") == "float16"
    assert "stored in int4" in refused(Launch(MODEL, runtime, weights="int4"))
    assert "bf16" in refused(Launch(MODEL, runtime, weights="bf16", checkpoint="mxfp4"))


def test_vllm_quantises_to_nf4_with_bitsandbytes_and_loads_gguf_files():
    assert parsed(Launch(MODEL, weights="nf4"))[1]["--quantization"] == "bitsandbytes"
    refused(Launch(MODEL, "sglang", weights="nf4"))
    head, flags = parsed(Launch(MODEL, weights="q4_k_m", gguf_file=GGUF))
    assert head == [GGUF] and flags == {"--tokenizer": MODEL}


def test_replicas_give_a_deployment_of_one_replica_pods():
    plan = Launch(MODEL, tp=2, replicas=4, weights="fp8", max_model_len=8192)
    text = replicas_snippet(plan)
    assert "  replicas: 4\n" in text and "nvidia.com/gpu: 2" in text and "/health" in text
    yaml = pytest.importorskip("yaml")  # the snippet is built without it; read it back here
    deployment = yaml.safe_load(text)
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == 4
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    one = replace(plan, replicas=1, host="0.0.0.0", port=8000)
    assert container["command"] + container["args"] == vllm_command(one)
    assert "--data-parallel-size" not in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert pod["volumes"][0]["emptyDir"] == {"medium": "Memory"}  # NCCL's shared memory
    assert deployment["metadata"]["name"] == "qwen2-5-7b-instruct-vllm"

    llama = Launch(MODEL, "llama.cpp", tp=2, replicas=3, weights="q4_k_m", gguf_file=GGUF,
                   gpu_layers=99, port=8080)
    served = yaml.safe_load(replicas_snippet(llama))
    assert served["spec"]["replicas"] == 3
    (container,) = served["spec"]["template"]["spec"]["containers"]
    assert container["command"] + container["args"] == llama_server_command(
        replace(llama, host="0.0.0.0"))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    cpu = yaml.safe_load(replicas_snippet(replace(llama, gpu_layers=0)))
    assert "resources" not in cpu["spec"]["template"]["spec"]["containers"][0]
    sglang = yaml.safe_load(replicas_snippet(replace(plan, runtime="sglang"), image="my/sglang"))
    (container,) = sglang["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "my/sglang" and "--dp-size" not in container["args"]
    assert container["args"][container["args"].index("--host") + 1] == "0.0.0.0"


def test_a_disaggregated_pair_is_a_producer_and_a_consumer():
    prefill = Launch("Qwen/Qwen3-32B", tp=2, weights="fp8", role="prefill", replicas=2)
    decode = replace(prefill, tp=4, role="decode", replicas=1)
    configs = [json.loads(parsed(p)[1]["--kv-transfer-config"]) for p in (prefill, decode)]
    assert configs == [{"kv_connector": "NixlConnector", "kv_role": "kv_producer"},
                       {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}]
    assert "'{\"kv_connector\":" in command_line(prefill)  # one shell word
    modes = [parsed(replace(p, runtime="sglang"))[1]["--disaggregation-mode"]
             for p in (prefill, decode)]
    assert modes == ["prefill", "decode"]
    names = {replicas_snippet(p).split("name: ")[1].split("\n")[0] for p in (prefill, decode)}
    assert names == {"qwen3-32b-vllm-prefill", "qwen3-32b-vllm-decode"}
    yaml = pytest.importorskip("yaml")
    pod = yaml.safe_load(replicas_snippet(prefill))["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert json.loads(args[args.index("--kv-transfer-config") + 1])["kv_role"] == "kv_producer"


def test_what_a_runtime_cannot_run_is_refused_in_one_line():
    gguf = dict(weights="q4_k_m", gguf_file=GGUF)
    assert "expert" in refused(Launch(MODEL, "llama.cpp", tp=2, expert_parallel=True, **gguf))
    assert "pipeline" in refused(Launch(MODEL, "llama.cpp", pp=2, **gguf))
    assert ".gguf" in refused(Launch(MODEL, weights="q4_k_m"))  # vLLM, no file
    assert ".gguf" in refused(Launch(MODEL, "llama.cpp", weights="q4_k_m"))
    assert "GGUF" in refused(Launch(MODEL, "llama.cpp", weights="fp8", gguf_file=GGUF))
    refused(Launch(MODEL, "sglang", **gguf))
    refused(Launch(MODEL, "llama.cpp", role="prefill", **gguf))
    refused(Launch(MODEL, "llama.cpp", cuda_graphs=False, **gguf))
    refused(Launch(MODEL, "llama.cpp", cpu_moe=True, n_cpu_moe=4, **gguf))
    assert "llama-server's" in refused(Launch(MODEL, gpu_layers=99))
    assert "llama-server's" in refused(Launch(MODEL, "sglang", parallel=4))
    refused(Launch(MODEL, expert_parallel=True))  # one GPU holds every expert
    refused(Launch(MODEL, "sglang", replicas=2, expert_parallel=True))
    assert "KV" in refused(Launch(MODEL, kv_dtype="q4_0"))
    refused(Launch(MODEL, "llama.cpp", kv_dtype="fp4", **gguf))
    for bad in (dict(runtime="tgi"), dict(tp=0), dict(replicas=-1), dict(role="both"),
                dict(gpu_memory_utilization=1.5), dict(port=70000), dict(model=" ")):
        with pytest.raises(GpuwiseError):
            Launch(**{"model": MODEL, **bad})  # type: ignore[arg-type]


def test_the_docs_example_prints_what_the_docs_show():
    """docs/plan.md, "The command to run": its example's output is pasted in; it must be current."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "plan.md").read_text()
    section = page[page.index("## The command to run"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    shown = re.search(r"```text\n(.*?)```", section, re.S)
    assert code and shown
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.group(1), "docs/plan.md", "exec"), {})
    assert out.getvalue().rstrip("\n") == shown.group(1).rstrip("\n")


def test_the_module_is_pure():
    """docs/architecture.md, "Layers, and folders by question": the workload layer imports
    only the stdlib and gpuwise's lower layers."""
    path = Path(__file__).resolve().parents[1] / "gpuwise" / "workload" / "launch.py"
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or name.startswith(
                ("gpuwise.catalog", "gpuwise.workload", "gpuwise.errors", "gpuwise.units")), name


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_parses_the_commands_with_its_own_parser():
    from vllm.engine.arg_utils import AsyncEngineArgs

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # vLLM before 0.11
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    parser.add_argument("--host")  # the OpenAI frontend's (FrontendArgs), not the engine's
    parser.add_argument("--port", type=int)
    for launch in launches("vllm", n=60):
        argv = vllm_command(launch)[2:]
        args = parser.parse_args(["--model", *argv])
        assert args.tensor_parallel_size == launch.tp
        assert args.pipeline_parallel_size == launch.pp
        assert args.data_parallel_size == launch.replicas
        assert args.enable_expert_parallel == launch.expert_parallel
        assert args.enforce_eager == (launch.cuda_graphs is False)
