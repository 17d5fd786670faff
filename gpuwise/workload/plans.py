"""What the user wants to run: inference and training plans, checked on construction."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from gpuwise.catalog.formats import WeightFormat, weight_format
from gpuwise.catalog.runtime_speed import RUNTIME_IDS, runtime_speed
from gpuwise.errors import GpuwiseError, did_you_mean
from gpuwise.files import shown
from gpuwise.workload.arch import Architecture
from gpuwise.workload.limits import check_count

ATTENTIONS = ("eager", "sdpa", "flash")
TRAIN_DTYPES = ("fp32", "bf16", "fp16", "mixed-bf16", "mixed-fp16")
OPTIMIZERS = ("adamw", "adamw_fused", "sgd", "adafactor", "adamw8bit", "paged_adamw8bit")
FINETUNES = ("full", "lora", "qlora")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_TOKENS = 1 << 24  # 16M tokens: beyond any context window a model has
# The runtimes, from the catalogue (data/runtime_speed.toml: each runtime's section and
# whether it trains); estimate/runtimes/ holds one unit for each.
SERVING_RUNTIMES = tuple(RUNTIME_IDS)
TRAINING_RUNTIMES = tuple(r for r in RUNTIME_IDS if runtime_speed(r).training)
# Memory features of training stacks (docs/memory.md, "Training stacks' memory features").
LOSSES = ("full", "chunked", "fused")  # transformers; torchtune's chunked; Liger/Unsloth fused
OFFLOADS = ("optimizer", "params", "activations")  # ZeRO-Offload / FSDP CPU offload; torchtune
SHARDINGS = ("zero", "fsdp2")  # DeepSpeed ZeRO's layout, or torch FSDP2's fully_shard
# The host allocator of a CPU process (catalog/data/allocators.toml): glibc as users start it,
# glibc pinned so the resident set tracks live tensors, or a preloaded jemalloc / tcmalloc.
ALLOCATORS = ("glibc", "glibc-mmap64k", "jemalloc", "tcmalloc")


def _check_size(name: str, value: int, low: int = 1, high: int = MAX_TOKENS) -> None:
    check_count(value, "--" + name.replace("_", "-"), high, low)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        close = did_you_mean(value, choices)
        guess = f"did you mean {close[0]!r}? " if close else ""
        raise GpuwiseError(f"unknown {name} {value!r}", f"{guess}choose one of: {', '.join(choices)}")


@dataclass(frozen=True)
class StoredWeights:
    """Exact weight bytes read from a checkpoint's headers (instead of params x format)."""

    total_bytes: int
    embedding_bytes: int = 0  # the input token embedding's share (llama.cpp keeps it on the host)
    label: str = ""  # what is stored, e.g. "Q4_K (GGUF)" or "BF16 (safetensors)"
    ggml_type: str = ""  # a GGUF file's main tensor type ("Q4_K"), which llama.cpp's speed follows
    # A GGUF's tensors in file order as (name, ggml type, rows, columns, bytes, experts): what
    # llama.cpp's CPU backend repacks, and what stays mapped after loading (llama_cpp_memory.py).
    gguf_tensors: tuple[tuple[str, str, int, int, int, int], ...] = ()


@dataclass(frozen=True)
class InferencePlan:
    """Generate `new_tokens` after a `prompt_tokens` prompt for `batch` sequences."""

    batch: int = 1
    prompt_tokens: int = 512
    new_tokens: int = 128
    weights: str = "bf16"
    kv_dtype: str | None = None  # None: the compute dtype
    attention: str = "sdpa"
    logits: str = "last"  # generate() keeps the last position's logits; "all" keeps every one
    runtime: str = "transformers"  # whose memory rules and time model apply (SERVING_RUNTIMES)
    stored_weights: StoredWeights | None = None  # from a checkpoint; None: estimated
    context_alloc: int | None = None  # llama.cpp n_ctx / vLLM max_model_len; None: the model's
    gpu_memory_utilization: float | None = None  # vLLM's pre-allocated share; None: 0.9
    threads: int | None = None  # llama.cpp's CPU threads; None: one a core
    gpu_layers: int | None = None  # llama.cpp -ngl: layers on the device; None: all of them
    quant_kernel: str = ""  # the weight-only kernel; "": the runtime's own for the format
    tp: int = 1  # tensor-parallel devices the model runs on, each layer split over them
    # vLLM --enable-expert-parallel / SGLang --ep-size tp: each of the tp devices holds E/tp
    # whole routed experts (attention and shared experts stay split); docs/speed.md
    expert_parallel: bool = False
    # llama.cpp --n-cpu-moe N (--cpu-moe: every layer): the routed experts' tensors of the
    # first N layers in host memory, run there; None: none
    cpu_moe_layers: int | None = None
    # AutoAWQ from_quantized(fuse_layers=True): q, k, v fused at load, the KV cache pre-allocated
    # for context_alloc positions (None: the model's) and kept (quant_workspace.py)
    fuse_layers: bool = False
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    allocator: str = "glibc"  # the host allocator of a CPU process (ALLOCATORS)

    def __post_init__(self) -> None:
        _check_size("batch", self.batch, high=1 << 16)
        _check_size("prompt", self.prompt_tokens)
        _check_size("new_tokens", self.new_tokens, low=0)
        _check_choice("attention", self.attention, ATTENTIONS)
        _check_choice("logits mode", self.logits, ("last", "all"))
        _check_choice("runtime", self.runtime, SERVING_RUNTIMES)
        _check_choice("allocator", self.allocator, ALLOCATORS)
        if self.context_alloc is not None:
            _check_size("ctx", self.context_alloc)
        if self.threads is not None:
            _check_size("threads", self.threads, high=1 << 12)
        if self.gpu_layers is not None:
            _check_size("gpu_layers", self.gpu_layers, low=0, high=1 << 12)
        _check_size("tp", self.tp, high=1 << 10)
        if self.cpu_moe_layers is not None:
            _check_size("n_cpu_moe", self.cpu_moe_layers, low=0, high=1 << 12)
        util = self.gpu_memory_utilization
        if util is not None and not 0.0 < util <= 1.0:
            raise GpuwiseError(f"--gpu-memory-utilization must be in (0, 1], got "
                               f"{util}", "vLLM's default is 0.9")

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.new_tokens

    @cached_property
    def weight_format(self) -> WeightFormat:
        """The weights' format (bytes an element, compute dtype), looked up once a plan."""
        return weight_format(self.weights)

    @cached_property
    def compute_format(self) -> WeightFormat:
        """The format of the dtype the weights compute in (bf16 for int4, ...)."""
        return weight_format(self.weight_format.compute_dtype)

    @cached_property
    def kv_format(self) -> WeightFormat:
        """The KV cache's format: --kv-dtype, else the compute dtype."""
        return weight_format(self.kv_dtype or self.weight_format.compute_dtype)

    def kv_bytes_per_position(self, arch: Architecture) -> float:
        """Bytes of keys and values one position holds through every layer."""
        return arch.num_layers * arch.kv_cache_elements_per_token() * self.kv_format.bytes_per_element


@dataclass(frozen=True)
class TrainingPlan:
    """One optimiser step on `batch` sequences of `seq` tokens."""

    batch: int = 1
    seq: int = 2048
    dtype: str = "mixed-bf16"
    optimizer: str = "adamw"
    finetune: str = "full"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = LORA_TARGETS
    checkpointing: bool = False
    attention: str = "sdpa"
    gpus: int = 1
    zero: int = 0
    tp: int = 1
    runtime: str = "transformers"  # whose time model: transformers (eager) or compiled
    allocator: str = "glibc"  # the host allocator of a CPU process (ALLOCATORS)
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    loss: str = "full"  # LOSSES
    loss_chunks: int = 8  # torchtune LinearCrossEntropyLoss(num_output_chunks)
    optimizer_in_backward: bool = False  # torchtune optimizer_in_bwd: a step per parameter
    offload: tuple[str, ...] = ()  # OFFLOADS: what lives in host memory
    sharding: str = "zero"  # SHARDINGS: how --zero's shards are laid out
    reshard_after_forward: bool = True  # FSDP2 fully_shard(reshard_after_forward=)
    checkpointing_policy: str = "full"  # full, op (torchtitan's selective op) or N (every Nth)
    double_quant: bool = True  # QLoRA: bnb_4bit_use_double_quant
    quant_compute_dtype: str | None = None  # QLoRA: bnb_4bit_compute_dtype; None: the plan's
    kbit_prepare: bool = True  # QLoRA: peft's prepare_model_for_kbit_training (fp32 non-nf4)
    adapter_dtype: str = "fp32"  # LoRA adapters: fp32 (peft's default) or the base's (torchtune)

    def __post_init__(self) -> None:
        if self.runtime in SERVING_RUNTIMES and self.runtime not in TRAINING_RUNTIMES:
            raise GpuwiseError(f"{self.runtime} does not train: it serves models",
                               f"train with --runtime {' or '.join(TRAINING_RUNTIMES)}")
        _check_choice("runtime", self.runtime, TRAINING_RUNTIMES)
        _check_choice("allocator", self.allocator, ALLOCATORS)
        _check_size("batch", self.batch, high=1 << 16)
        _check_size("seq", self.seq)
        _check_choice("dtype", self.dtype, TRAIN_DTYPES)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("finetune", self.finetune, FINETUNES)
        _check_choice("attention", self.attention, ATTENTIONS)
        _check_size("lora_rank", self.lora_rank, high=1 << 14)
        _check_size("tp", self.tp, high=1 << 10)  # first: --gpus defaults to it
        _check_size("gpus", self.gpus, high=1 << 16)
        if self.zero not in (0, 1, 2, 3):
            raise GpuwiseError(f"--zero must be 0, 1, 2 or 3, got {self.zero}",
                               "ZeRO stages: 1 shards optimizer states, 2 also gradients, "
                               "3 also weights (FSDP full shard)")
        if self.gpus % self.tp:
            raise GpuwiseError(f"--gpus {self.gpus} is not a multiple of --tp {self.tp}",
                               "tensor parallel groups must divide the GPU count")
        for target in self.lora_targets:
            _check_choice("LoRA target", target, LORA_TARGETS)
        _check_stack_options(self)

    @property
    def data_parallel(self) -> int:
        return self.gpus // self.tp

    @property
    def compute_dtype(self) -> str:
        return self.dtype.removeprefix("mixed-")

    @property
    def mixed(self) -> bool:
        return self.dtype.startswith("mixed-")


def _check_stack_options(plan: TrainingPlan) -> None:
    """The training stacks' memory options (LOSSES, OFFLOADS, SHARDINGS, the policy)."""
    _check_choice("loss", plan.loss, LOSSES)
    _check_choice("sharding", plan.sharding, SHARDINGS)
    for part in plan.offload:
        _check_choice("offload", part, OFFLOADS)
    _check_size("loss_chunks", plan.loss_chunks, high=1 << 16)
    policy = plan.checkpointing_policy
    if policy not in ("full", "op") and not (policy.isdigit() and int(policy) >= 1):
        raise GpuwiseError(f"unknown checkpointing policy {policy!r}",
                           "choose full (every layer), op (torchtitan's selective op policy) "
                           "or a number N (every Nth layer, torchtune/torchtitan selective)")
    _check_choice("adapter dtype", plan.adapter_dtype, ("fp32", "bf16", "fp16"))
    if plan.quant_compute_dtype is not None:
        _check_choice("QLoRA compute dtype", plan.quant_compute_dtype, ("fp32", "bf16", "fp16"))
    if plan.optimizer_in_backward and plan.zero and plan.sharding == "zero":
        raise GpuwiseError("--optimizer-in-backward does not combine with --zero",
                           "torchtune steps each parameter in its gradient hook on one device "
                           "or under FSDP (--sharding fsdp2)")


def check_runnable(plan: InferencePlan | TrainingPlan) -> None:
    """What a real run (`gpuwise validate`) needs beyond an estimate: generate() makes at
    least one token (an estimate of the prompt alone takes --new-tokens 0)."""
    if isinstance(plan, InferencePlan):
        check_count(plan.new_tokens, "--new-tokens", MAX_TOKENS,
                    hint="a real run generates at least 1 token")


def check_experts(arch: Architecture, plan: InferencePlan) -> None:
    """The expert options need a mixture of experts, and --n-cpu-moe at most its layers."""
    name = shown(arch.name)
    if plan.expert_parallel and arch.moe is None:
        raise GpuwiseError(f"--expert-parallel splits a mixture of experts; {name} has no "
                           "experts", "drop it: --tp splits a dense model's layers")
    moved = plan.cpu_moe_layers
    if moved is not None and arch.moe is None:
        raise GpuwiseError(f"--cpu-moe keeps a mixture of experts' expert tensors in host "
                           f"memory; {name} has no experts",
                           "--gpu-layers N keeps whole layers in host memory")
    if moved is not None and moved > arch.num_layers:
        raise GpuwiseError(f"--n-cpu-moe {moved} is more than {name}'s {arch.num_layers} layers",
                           "--cpu-moe keeps every layer's experts in host memory")


def check_tensor_parallel(arch: Architecture, plan: TrainingPlan) -> None:
    """Tensor parallelism splits the attention heads across `plan.tp` devices: each must get
    whole heads, and whole key/value heads or, where --tp exceeds them, equal copies of them
    (vLLM replicates them so). No option splits layers (pipeline parallelism) yet."""
    check_tp_degree(arch, plan.tp)


def check_tp_degree(arch: Architecture, degree: int) -> None:
    """`check_tensor_parallel` for a tensor-parallel degree on its own (`infer --tp`)."""
    _check_size("tp", degree, high=1 << 10)
    if _splits_heads(arch, degree):
        return
    works = [tp for tp in range(1, min(arch.num_heads, 1 << 10) + 1) if _splits_heads(arch, tp)]
    raise GpuwiseError(
        f"--tp {degree} does not split {shown(arch.name)}'s {arch.num_heads} attention heads "
        f"({arch.num_kv_heads} key/value heads) evenly",
        f"tensor parallel sizes that work: {', '.join(map(str, works))} "
        "(with --gpus a multiple of it)")


def _splits_heads(arch: Architecture, tp: int) -> bool:
    kv = arch.num_kv_heads
    return arch.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)
