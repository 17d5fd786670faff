"""What to run (issue 41, item 3): one chosen serving deployment, a `Launch`, as the command line
that starts it under vLLM, SGLang or llama.cpp, and as a Kubernetes Deployment where it runs as
several replicas. Pure: text from a frozen record, nothing started or read but the catalogue.

Every flag comes from the lists in catalog/data/launch_flags.toml, read from each runtime's own
reference at a named version; a flag missing there is never emitted. A field left at None is
left out of the command (the runtime's default then). A combination a runtime cannot run is
refused in one line. docs/plan.md, "The command to run" maps each field to its flags."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.launch_flags import launch_flags
from gpuwise.errors import GpuwiseError

RUNTIMES = ("vllm", "sglang", "llama.cpp")
ROLES = ("prefill", "decode")
SIXTEEN_BIT = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # --dtype values
# What a runtime quantises an unquantised checkpoint to as it loads it (--quantization X).
# Any other format (int4 AWQ/GPTQ, int8, fp8-block, mxfp4, nvfp4) needs a checkpoint stored in
# it: its config.json's quantization_config names the method, which the runtime reads there.
ONLINE = {"vllm": {"fp8": "fp8", "nf4": "bitsandbytes"}, "sglang": {"fp8": "fp8"}}
# The KV cache's dtype, gpuwise's name -> the runtime's value (None: the default, the model's
# compute dtype). llama.cpp has no fp8 cache: q8_0 is its 8-bit type.
KV_DTYPES: dict[str, dict[str, str | None]] = {
    "vllm": {"fp8": "fp8", "bf16": None, "fp16": None},
    "sglang": {"fp8": "fp8_e4m3", "bf16": None, "fp16": None},
    "llama.cpp": {"fp16": None, "f16": None, "fp8": "q8_0", "int8": "q8_0", "fp32": "f32"},
}
NIXL_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}  # vLLM's NixlConnector
DEPLOYMENT_PORT = 8000  # the port a Deployment's pods listen on (passed as --port)
IMAGES = {"vllm": "vllm/vllm-openai:latest", "sglang": "lmsysorg/sglang:latest",
          "llama.cpp": "ghcr.io/ggml-org/llama.cpp:server-cuda"}
LLAMA_ONLY = ("gpu_layers", "cpu_moe", "n_cpu_moe", "parallel", "ubatch_size")


@dataclass(frozen=True)
class Launch:
    """What a plan chose for one server (or one pool of identical servers)."""

    model: str  # hub id, the catalogue's hf_id ("Qwen/Qwen2.5-7B-Instruct")
    runtime: str = "vllm"  # "vllm", "sglang" or "llama.cpp"
    tp: int = 1  # tensor parallel; llama.cpp: the GPUs its layers are split over
    pp: int = 1  # pipeline parallel
    expert_parallel: bool = False
    replicas: int = 1  # data-parallel replicas, each tp * pp GPUs
    weights: str = "bf16"  # gpuwise's format name: bf16, fp8, fp8-block, int4, mxfp4, q4_k_m...
    checkpoint: str = "bf16"  # the format the weights at `model` are stored in (shipped_weights)
    kv_dtype: str | None = None  # None: the compute dtype; "fp8"
    max_model_len: int | None = None  # llama.cpp: n_ctx, the cells its slots share
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None  # the chunked-prefill size; llama.cpp: -b
    prefix_caching: bool | None = None  # None: the runtime's default
    cuda_graphs: bool | None = None  # None: the runtime's default (on)
    gguf_file: str | None = None  # the .gguf llama.cpp (or vLLM) loads
    gpu_layers: int | None = None  # llama.cpp -ngl
    cpu_moe: bool = False  # llama.cpp: every expert in host memory
    n_cpu_moe: int | None = None  # llama.cpp: the experts of the first N layers in host memory
    parallel: int | None = None  # llama.cpp slots (default: max_num_seqs)
    ubatch_size: int | None = None  # llama.cpp -ub
    port: int | None = None
    host: str | None = None
    role: str | None = None  # disaggregated serving: "prefill" or "decode"

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise GpuwiseError(f"no launch command for runtime {self.runtime!r}",
                               "vllm, sglang or llama.cpp")
        if not self.model.strip():
            raise GpuwiseError("a launch command needs the model's hub id")
        for name in ("tp", "pp", "replicas", "max_model_len", "max_num_seqs",
                     "max_num_batched_tokens", "parallel", "ubatch_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                raise GpuwiseError(f"{name} must be a whole number of at least 1, not {value}")
        for name in ("gpu_layers", "n_cpu_moe"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise GpuwiseError(f"{name} must be 0 or more, not {value}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise GpuwiseError("gpu_memory_utilization is a fraction in (0, 1], not "
                               f"{self.gpu_memory_utilization}")
        if self.port is not None and not 0 < self.port < 65536:
            raise GpuwiseError(f"port {self.port} is not a TCP port (1 to 65535)")
        if self.role not in (None, *ROLES):
            raise GpuwiseError(f"unknown role {self.role!r}", "prefill or decode (or none)")

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp


def _opt(flag: str, value: object) -> list[str]:
    """[flag, value] where the plan sets the value, else nothing (the runtime's default)."""
    if value is None:
        return []
    return [flag, format(value, "g") if isinstance(value, float) else str(value)]


def _above_one(flag: str, value: int) -> list[str]:
    return _opt(flag, value if value > 1 else None)


def _format_id(name: str) -> str:
    return weight_format(name).id


def _checks(launch: Launch) -> None:
    """Refuse, in one line, what the runtime cannot run."""
    flags = launch_flags(launch.runtime)
    name = flags.name
    if flags.one_process:
        if launch.expert_parallel:
            raise GpuwiseError("llama.cpp has no expert parallelism",
                               "its experts go to host memory with cpu_moe or n_cpu_moe")
        if launch.pp > 1:
            raise GpuwiseError("llama-server has no pipeline parallelism",
                               "its GPUs split the layers (tp GPUs, --split-mode layer)")
        if launch.role:
            raise GpuwiseError("llama-server does not split prefill and decode", "role=None")
        if launch.cuda_graphs is False:
            raise GpuwiseError("llama-server has no switch for CUDA graphs", "cuda_graphs=None")
        if launch.cpu_moe and launch.n_cpu_moe is not None:
            raise GpuwiseError("cpu_moe keeps every expert in host memory; n_cpu_moe some",
                               "set one of them")
        if launch.parallel and launch.max_num_seqs and launch.parallel != launch.max_num_seqs:
            raise GpuwiseError(f"llama-server's slots are one number: parallel {launch.parallel} "
                               f"and max_num_seqs {launch.max_num_seqs} differ")
        return
    llama_only = [f for f in LLAMA_ONLY if getattr(launch, f) not in (None, False)]
    if llama_only:
        raise GpuwiseError(f"{', '.join(llama_only)}: llama-server's, not {name}'s",
                           "runtime='llama.cpp'")
    groups = launch.tp * (launch.replicas if flags.experts_over_replicas else 1)
    if launch.expert_parallel and groups < 2:
        spread = "tp x replicas" if flags.experts_over_replicas else "tp"
        raise GpuwiseError(f"{name} spreads the experts over {spread} GPUs: one GPU has all",
                           "expert_parallel=False")


def _weights(launch: Launch) -> tuple[str, list[str]]:
    """(what the server loads, the flags its weights need) for vLLM and SGLang."""
    fmt = weight_format(launch.weights)
    name = launch_flags(launch.runtime).name
    if fmt.gguf or launch.gguf_file:
        if not launch_flags(launch.runtime).loads_gguf:
            raise GpuwiseError(f"a GGUF file is run here by llama.cpp or vLLM, not {name}",
                               "runtime='llama.cpp' or 'vllm'")
        if not fmt.gguf:
            raise GpuwiseError(f"a .gguf file holds GGUF types; {fmt.id} is not one",
                               "weights='q4_k_m' (or whichever the file holds)")
        if not launch.gguf_file:
            raise GpuwiseError(f"vLLM loads {fmt.id} from a .gguf file", "set gguf_file")
        # vLLM's docs: the hub model's tokenizer, as converting the file's is slow
        return launch.gguf_file, ["--tokenizer", launch.model]
    checkpoint = _format_id(launch.checkpoint)
    if fmt.id == checkpoint:
        return launch.model, []  # as stored: a quantised checkpoint's config names its method
    if fmt.id in SIXTEEN_BIT and checkpoint in SIXTEEN_BIT:
        return launch.model, ["--dtype", SIXTEEN_BIT[fmt.id]]
    online = ONLINE[launch.runtime].get(fmt.id)
    if online and checkpoint in SIXTEEN_BIT:
        return launch.model, ["--quantization", online]
    raise GpuwiseError(f"{name} does not turn a {checkpoint} checkpoint into {fmt.id} as it "
                       "loads", f"give the hub id of a checkpoint stored in {fmt.id}, "
                       f"and checkpoint={fmt.id!r}")


def _kv(launch: Launch) -> str | None:
    if launch.kv_dtype is None:
        return None
    table = dict(KV_DTYPES[launch.runtime])
    table |= {t: t for t in launch_flags(launch.runtime).cache_types if t != "f16"}
    key = launch.kv_dtype.lower()
    if key not in table:
        raise GpuwiseError(f"{launch.runtime} has no {launch.kv_dtype!r} KV cache",
                           f"kv_dtype one of {', '.join(sorted(table))}")
    return table[key]


def _checked(launch: Launch, argv: list[str]) -> list[str]:
    """The command, each flag checked against the runtime's recorded list."""
    known = launch_flags(launch.runtime)
    unknown = [t for t in argv[len(known.program):] if t.startswith("-") and t not in known.flags]
    if unknown:  # a bug here, never the user's: the lists are what may be emitted
        raise RuntimeError(f"{', '.join(unknown)}: not in launch_flags.toml [{launch.runtime}]")
    return argv


def vllm_command(launch: Launch) -> list[str]:
    """`vllm serve MODEL ...`: the plan's choices, and nothing it leaves to vLLM."""
    launch = replace(launch, runtime="vllm")
    _checks(launch)
    model, weight_flags = _weights(launch)
    argv = [*launch_flags("vllm").program, model, *weight_flags]
    argv += _above_one("--tensor-parallel-size", launch.tp)
    argv += _above_one("--pipeline-parallel-size", launch.pp)
    argv += _above_one("--data-parallel-size", launch.replicas)
    argv += ["--enable-expert-parallel"] if launch.expert_parallel else []
    argv += _opt("--kv-cache-dtype", _kv(launch))
    argv += _opt("--max-model-len", launch.max_model_len)
    argv += _opt("--gpu-memory-utilization", launch.gpu_memory_utilization)
    argv += _opt("--max-num-seqs", launch.max_num_seqs)
    argv += _opt("--max-num-batched-tokens", launch.max_num_batched_tokens)
    if launch.prefix_caching is not None:
        argv += ["--enable-prefix-caching" if launch.prefix_caching
                 else "--no-enable-prefix-caching"]
    argv += ["--enforce-eager"] if launch.cuda_graphs is False else []
    if launch.role:
        config = {"kv_connector": "NixlConnector", "kv_role": NIXL_ROLES[launch.role]}
        argv += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
    argv += _opt("--host", launch.host) + _opt("--port", launch.port)
    return _checked(launch, argv)


def sglang_command(launch: Launch) -> list[str]:
    """`python -m sglang.launch_server --model-path MODEL ...`."""
    launch = replace(launch, runtime="sglang")
    _checks(launch)
    model, weight_flags = _weights(launch)
    argv = [*launch_flags("sglang").program, "--model-path", model, *weight_flags]
    argv += _above_one("--tp-size", launch.tp)
    argv += _above_one("--pp-size", launch.pp)
    argv += _above_one("--dp-size", launch.replicas)
    argv += _opt("--ep-size", launch.tp if launch.expert_parallel else None)
    argv += _opt("--kv-cache-dtype", _kv(launch))
    argv += _opt("--context-length", launch.max_model_len)
    argv += _opt("--mem-fraction-static", launch.gpu_memory_utilization)
    argv += _opt("--max-running-requests", launch.max_num_seqs)
    argv += _opt("--chunked-prefill-size", launch.max_num_batched_tokens)
    argv += ["--disable-radix-cache"] if launch.prefix_caching is False else []  # on by default
    argv += ["--disable-cuda-graph"] if launch.cuda_graphs is False else []
    argv += _opt("--disaggregation-mode", launch.role)
    argv += _opt("--host", launch.host) + _opt("--port", launch.port)
    return _checked(launch, argv)


def llama_server_command(launch: Launch) -> list[str]:
    """`llama-server -m FILE.gguf ...`. Several GPUs (tp) split the layers and the KV cache
    between them: --split-mode layer, llama-server's default, so no flag (row and tensor
    splits are not what gpuwise models). Replicas are separate servers (a Deployment)."""
    launch = replace(launch, runtime="llama.cpp")
    _checks(launch)
    fmt = weight_format(launch.weights)
    if not (fmt.gguf or fmt.id in SIXTEEN_BIT):
        raise GpuwiseError(f"llama.cpp runs GGUF files; {fmt.id} is not a GGUF type",
                           "weights='q4_k_m', 'q8_0', 'bf16'...")
    if not launch.gguf_file:
        raise GpuwiseError(f"llama-server loads a .gguf file: give the {fmt.id} file of "
                           f"{launch.model}", "set gguf_file")
    kv = _kv(launch)
    argv = [*launch_flags("llama.cpp").program, "-m", launch.gguf_file]
    argv += _opt("-c", launch.max_model_len)
    argv += _opt("-ngl", launch.gpu_layers)
    argv += _opt("--parallel", launch.parallel or launch.max_num_seqs)
    argv += _opt("-b", launch.max_num_batched_tokens) + _opt("-ub", launch.ubatch_size)
    argv += ["--cpu-moe"] if launch.cpu_moe else []
    argv += _opt("--n-cpu-moe", launch.n_cpu_moe)
    argv += _opt("-ctk", kv) + _opt("-ctv", kv)
    if launch.prefix_caching is not None:
        argv += ["--cache-prompt" if launch.prefix_caching else "--no-cache-prompt"]
    argv += _opt("--host", launch.host) + _opt("--port", launch.port)
    return _checked(launch, argv)


COMMANDS: dict[str, Callable[[Launch], list[str]]] = {
    "vllm": vllm_command, "sglang": sglang_command, "llama.cpp": llama_server_command}


def command(launch: Launch) -> list[str]:
    """The argv that starts the server, for its runtime."""
    return COMMANDS[launch.runtime](launch)


def command_line(launch: Launch) -> str:
    """The command as one shell line, quoted for a POSIX shell."""
    return shlex.join(command(launch))


def _k8s_name(launch: Launch) -> str:
    """A DNS-1123 name for the Deployment: the model's, the runtime's and the role's."""
    raw = "-".join(p for p in (launch.model.split("/")[-1], launch.runtime, launch.role) if p)
    name = re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")
    return name[:63].rstrip("-") or "gpuwise-server"


def _flow(lead: str, words: list[str]) -> list[str]:
    """`words` as a YAML flow sequence after `lead`, a line for each flag and its value."""
    groups: list[list[str]] = []
    for word in words:
        if word.startswith("-") or not groups:
            groups.append([])
        groups[-1].append(json.dumps(word))  # a JSON string is a YAML double-quoted scalar
    pad = " " * (len(lead) + 1)
    lines = [(pad if i else lead + "[") + ", ".join(g) for i, g in enumerate(groups)]
    return [line + ("," if i < len(lines) - 1 else "]") for i, line in enumerate(lines)]


def replicas_snippet(launch: Launch, image: str | None = None) -> str:
    """A Kubernetes Deployment running `launch.replicas` copies of the server, each on tp * pp GPUs,
    ready when its /health answers. Each pod runs one replica (no data-parallel flag), listens
    on every address at DEPLOYMENT_PORT; a Service in front spreads the requests."""
    pod = replace(launch, replicas=1, host="0.0.0.0", port=launch.port or DEPLOYMENT_PORT)
    argv = command(pod)
    program = launch_flags(launch.runtime).program
    one_process = launch_flags(launch.runtime).one_process
    cpu_only = one_process and launch.gpu_layers == 0
    gpus = 0 if cpu_only else launch.gpus_per_replica
    name = _k8s_name(launch)
    q = json.dumps
    lines = [
        f"# gpuwise plan: {launch.replicas} replica(s) of {launch.model} under {launch.runtime}"
        + (f" ({launch.role})" if launch.role else "") + f", {gpus} GPU(s) each",
        "apiVersion: apps/v1",
        "kind: Deployment",
        "metadata:",
        f"  name: {name}",
        f"  labels: {{app: {name}}}",
        "spec:",
        f"  replicas: {launch.replicas}",
        f"  selector: {{matchLabels: {{app: {name}}}}}",
        "  template:",
        f"    metadata: {{labels: {{app: {name}}}}}",
        "    spec:",
        "      containers:",
        "        - name: server",
        f"          image: {q(image or IMAGES[launch.runtime])}",
        f"          command: [{', '.join(q(w) for w in program)}]",
        *_flow("          args: ", argv[len(program):]),
        f"          ports: [{{containerPort: {pod.port}}}]",
    ]
    if gpus:
        lines += ["          resources:", "            limits:",
                  f"              nvidia.com/gpu: {gpus}"]
    lines += [
        "          readinessProbe:",
        f"            httpGet: {{path: /health, port: {pod.port}}}",
        "            periodSeconds: 10",
    ]
    if launch.gguf_file:
        lines.insert(1, f"# {launch.gguf_file} must be in the container: mount its volume")
    if gpus > 1 and not one_process:  # NCCL between a pod's GPUs: more shared memory
        lines += ["          volumeMounts: [{name: dshm, mountPath: /dev/shm}]",
                  "      volumes: [{name: dshm, emptyDir: {medium: Memory}}]"]
    return "\n".join(lines) + "\n"
