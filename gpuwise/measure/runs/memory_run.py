"""Run a memory plan for real (torch + transformers, random weights) and measure its peak.

The model is built from its `config.json` facts with random weights: nothing is downloaded and
no remote code is trusted. Each measurement runs in a fresh Python process
(`python -m gpuwise.measure.runs.memory_run`, the job as JSON on stdin, the result as one JSON line on
stdout) so that runs do not pollute each other's allocator state, caches or high-water marks.

Measurement method
------------------
In the child process the plan (a `generate` call, or `steps` training steps) runs twice: a
warm-up, which puts every lazily created thing in place (optimizer states, kernel caches,
thread pools), then the measured run with the same inputs.

CPU: the peak is the kernel's resident-set high-water mark (`VmHWM`), reset just before the
measured run by writing "5" to `/proc/self/clear_refs` (Linux >= 4.0). Where that is not
possible, a thread samples the resident set every millisecond instead (and the result says so).
For the resident set to track live tensors, the parent starts the child with

- ``MALLOC_MMAP_THRESHOLD_=65536``: a fixed threshold turns off glibc's dynamic one, which
  otherwise rises to 32 MiB after the first large free, so that later tensors up to 32 MiB are
  carved out of the heap and stay resident after they are freed. With it, every allocation
  above 64 KiB is its own mmap and goes back to the kernel on free.
- ``MALLOC_TRIM_THRESHOLD_=0``: free memory at the top of the heap is returned at once.

Without them the resident set keeps what was freed: training GPT-2 (124M) at batch 2, seq 256
gave a "baseline" of 1357-1503 MiB and a spread of 162 MiB over three runs; with them, 393 MiB
and 0.16 MiB. The price is page faults on every large allocation, which slows the run a little.
What is left is noise of up to about 1 MB between repeats, whatever the model: allocations under
64 KiB (and Python's object arenas) still live in heap pages that freeing may not return.

The baseline is what is resident at rest after the warm-up and is not a model or optimizer
tensor (interpreter, libraries, kernel caches): ``RSS_at_rest - bytes of tensors at rest``,
with tensors deduplicated by storage (tied embeddings share one). ``model_bytes = peak -
baseline``: the tensors at rest plus whatever the plan allocates on top of them.

CUDA: the peak is ``torch.cuda.max_memory_reserved()`` over the measured run (the caching
allocator's cache emptied and its peak reset first) plus the CUDA context; the context (the
baseline) is the process's device memory per NVML, or the device's used memory per
`cudaMemGetInfo`, less what torch has reserved, read at rest.

torch and transformers are imported only inside the functions that run in the child: this
module is imported by the CLI, which must stay light.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MeasuredMemory", "measure_inference", "measure_training"]

DTYPES = ("fp32", "bf16", "fp16")
TRAIN_DTYPES = DTYPES + ("mixed-bf16", "mixed-fp16")
ATTENTIONS = ("eager", "sdpa")
OPTIMIZERS = ("adamw", "sgd", "adafactor", "adamw8bit")
FINETUNES = ("full", "lora", "qlora")
# KV cache dtypes other than the compute dtype go through transformers' QuantizedCache.
KV_QUANTIZED = {"fp8": ("fp8", None), "int4": ("quanto", 4), "int2": ("quanto", 2)}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_CHILD_ENV = {
    "MALLOC_MMAP_THRESHOLD_": "65536",
    "MALLOC_TRIM_THRESHOLD_": "0",
    # MALLOC_ARENA_MAX is left alone: only allocations under the mmap threshold go to arenas,
    # and with 1, 2 or the default number of arenas the spread of three repeated runs was the
    # same (0.04-0.16 MiB on SmolLM2-135M inference and GPT-2 training), as was the baseline.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
}
_STDERR_LINES = 10
_ERROR_CHARS = 400


@dataclass(frozen=True)
class MeasuredMemory:
    """The real memory of one plan, measured in a fresh process.

    `peak_bytes` is the high-water mark of the measured run (CPU: `VmHWM` of the process;
    CUDA: `max_memory_reserved` plus the CUDA context). `baseline_bytes` is what the process
    holds that is not model or optimizer tensors (CPU: interpreter, libraries, caches; CUDA:
    the context), so `model_bytes = peak_bytes - baseline_bytes` is what the plan itself
    needs. `tensors_at_rest` has the bytes of "params", "buffers", "grads" and "optimizer"
    state held between steps, after the warm-up. `method` says how the peak was read.
    """

    peak_bytes: int
    baseline_bytes: int
    model_bytes: int
    device: str
    tensors_at_rest: dict[str, int]
    seconds: float
    torch_version: str
    transformers_version: str
    method: str = ""


def measure_inference(config: dict, *, timeout_s: float = 900, **plan: Any) -> MeasuredMemory:
    """Measure a greedy `generate` of `new_tokens` after a `prompt_tokens` prompt, `batch` rows.

    Plan keywords: batch, prompt_tokens, new_tokens, dtype ("bf16"), attention ("sdpa"),
    kv_dtype (None), device ("cpu"). `kv_dtype` None (or the compute dtype) keeps the KV cache
    in the compute dtype; "fp8", "int4" and "int2" use transformers' QuantizedCache (the int
    ones need optimum-quanto). Raises RuntimeError when the real run fails or takes longer
    than `timeout_s`.
    """
    return MeasuredMemory(**_run_child(inference_job(config, **plan), timeout_s))


def inference_job(
    config: dict,
    *,
    batch: int,
    prompt_tokens: int,
    new_tokens: int,
    dtype: str = "bf16",
    attention: str = "sdpa",
    kv_dtype: str | None = None,
    device: str = "cpu",
) -> dict:
    """The child's job for a generate() plan, checked before any process starts."""
    _check_choice("dtype", dtype, DTYPES)
    _check_choice("attention", attention, ATTENTIONS)
    if kv_dtype is not None and kv_dtype != dtype:
        _check_choice("kv_dtype", kv_dtype, (dtype, *KV_QUANTIZED))
        if KV_QUANTIZED[kv_dtype][0] == "quanto":
            _need_module("optimum.quanto", f"a {kv_dtype} KV cache needs optimum-quanto")
        kv_dtype_job: str | None = kv_dtype
    else:
        kv_dtype_job = None
    _check_positive(batch=batch, prompt_tokens=prompt_tokens, new_tokens=new_tokens)
    job = {
        "kind": "inference",
        "config": _checked_config(config),
        "batch": batch,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "dtype": dtype,
        "attention": attention,
        "kv_dtype": kv_dtype_job,
        "device": device,
    }
    return job


def measure_training(config: dict, *, timeout_s: float = 900, **plan: Any) -> MeasuredMemory:
    """Measure `steps` training steps (forward with labels, backward, optimizer step, zero_grad).

    Plan keywords: batch, seq, dtype ("fp32"), optimizer ("adamw"), checkpointing, attention,
    finetune ("full"), lora_rank, lora_targets, device ("cpu"), steps (2). `dtype`
    "mixed-bf16"/"mixed-fp16" keeps fp32 weights and runs the forward under torch.autocast.
    `finetune` "lora" needs peft; "qlora" and `optimizer` "adamw8bit" need bitsandbytes and a
    CUDA GPU. Raises RuntimeError when the real run fails or takes longer than `timeout_s`.
    """
    return MeasuredMemory(**_run_child(training_job(config, **plan), timeout_s))


def training_job(
    config: dict,
    *,
    batch: int,
    seq: int,
    dtype: str = "fp32",
    optimizer: str = "adamw",
    checkpointing: bool = False,
    attention: str = "sdpa",
    finetune: str = "full",
    lora_rank: int = 16,
    lora_targets: tuple[str, ...] = LORA_TARGETS,
    device: str = "cpu",
    steps: int = 2,
) -> dict:
    """The child's job for a training plan, checked before any process starts."""
    _check_choice("dtype", dtype, TRAIN_DTYPES)
    _check_choice("optimizer", optimizer, OPTIMIZERS)
    _check_choice("attention", attention, ATTENTIONS)
    _check_choice("finetune", finetune, FINETUNES)
    _check_positive(batch=batch, seq=seq, steps=steps)
    on_cuda = device.startswith("cuda")
    if optimizer == "adamw8bit":
        _need_module("bitsandbytes", "the adamw8bit optimizer needs bitsandbytes and a CUDA GPU")
    if finetune == "qlora":
        if not on_cuda:
            raise RuntimeError("QLoRA validation needs bitsandbytes and a CUDA GPU (device='cuda')")
        _need_module("bitsandbytes", "QLoRA validation needs bitsandbytes and a CUDA GPU")
    if finetune in ("lora", "qlora"):
        _need_module("peft", "LoRA validation needs peft")
        _check_positive(lora_rank=lora_rank)
    job = {
        "kind": "training",
        "config": _checked_config(config),
        "batch": batch,
        "seq": seq,
        "dtype": dtype,
        "optimizer": optimizer,
        "checkpointing": checkpointing,
        "attention": attention,
        "finetune": finetune,
        "lora_rank": lora_rank,
        "lora_targets": list(lora_targets),
        "device": device,
        "steps": steps,
    }
    return job


# ---------------------------------------------------------------- parent side


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _need_module(module: str, message: str) -> None:
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package
        found = False
    if not found:
        raise RuntimeError(f"{message} ({module} is not installed)")


def _checked_config(config: dict) -> dict:
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise RuntimeError(
            "real run: the model config must be a config.json dict with a 'model_type'"
        )
    return config


def _run_child(job: dict, timeout_s: float, allocator_env: bool = True,
               child: str = "gpuwise.measure.runs.memory_run",
               malloc_env: dict[str, str] | None = None) -> dict:  # fmt: skip
    """Run one job in a fresh process (`python -m child`) and return its result record.

    `allocator_env` sets the malloc variables that make the resident set track live tensors
    (memory measurements); timing runs leave the allocator as users have it, or as
    `malloc_env` sets it.
    """
    env = {**os.environ, **_CHILD_ENV}
    if not allocator_env:
        for key in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
            env.pop(key, None)
    env.update(malloc_env or {})
    # The child must import this very package, installed or not.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    what = f"real {job['kind']} run of {job['config'].get('model_type')} on {job['device']}"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", child],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = (
            exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        )
        raise RuntimeError(f"{what} took longer than {timeout_s:g} s{_tail(stderr)}") from None
    result = _last_json_line(proc.stdout)
    if proc.returncode != 0 or result is None or "error" in result:
        reason = result["error"] if result and "error" in result else f"exit code {proc.returncode}"
        raise RuntimeError(f"{what} failed: {reason}{_tail(proc.stderr)}")
    return result


def _last_json_line(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    return None


def _tail(stderr: str | None) -> str:
    lines = [line for line in (stderr or "").splitlines() if line.strip()][-_STDERR_LINES:]
    return "\n  child stderr (last lines):\n    " + "\n    ".join(lines) if lines else ""


# ---------------------------------------------------------------- child side: CPU memory


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil

        return int(psutil.Process().memory_info().rss)


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        match = re.search(r"^VmHWM:\s+(\d+)\s+kB", f.read(), re.MULTILINE)
    if match is None:
        raise OSError("no VmHWM in /proc/self/status")
    return int(match.group(1)) * 1024


def _reset_hwm() -> bool:
    """Reset the kernel's resident high-water mark to the current resident set."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _hwm_bytes()
    except OSError:
        return False
    return True


class _RssSampler:
    """Fallback peak reader: the largest resident set seen, sampled every millisecond."""

    def __init__(self) -> None:
        self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _rss_bytes())

    def __enter__(self) -> _RssSampler:
        self._old_interval = sys.getswitchinterval()
        sys.setswitchinterval(0.001)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        sys.setswitchinterval(self._old_interval)
        self.peak = max(self.peak, _rss_bytes())


# ---------------------------------------------------------------- child side: the plan


def _torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def _model_config(config: dict) -> Any:
    import transformers

    facts = dict(config)
    model_type = facts.pop("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise ValueError(
            f"unknown model_type {model_type!r}: transformers {transformers.__version__} has no "
            "such architecture (a newer transformers may; remote code is never run)"
        )
    # Never remote code; and the plan, not the file, says the dtype and quantization.
    for key in ("auto_map", "torch_dtype", "dtype", "quantization_config", "_name_or_path"):
        facts.pop(key, None)
    return transformers.AutoConfig.for_model(model_type, **facts)


def _build_model(job: dict) -> Any:
    import torch
    import transformers

    cfg = _model_config(job["config"])
    weight_dtype = "fp32" if job["dtype"].startswith("mixed-") else job["dtype"]
    if job.get("finetune") == "qlora":
        return _build_qlora_model(cfg, job)
    with torch.device(job["device"]):
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, dtype=_torch_dtype(weight_dtype), attn_implementation=job["attention"]
        )
    if job["kind"] == "inference":
        return model.eval()
    model.train()
    if job["checkpointing"]:
        _enable_checkpointing(model)
    if job["finetune"] == "lora":
        model = _with_lora(model, job)
    return model


def _enable_checkpointing(model: Any) -> None:
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _with_lora(model: Any, job: dict) -> Any:
    try:
        import peft
    except ImportError as exc:
        raise RuntimeError("LoRA validation needs peft") from exc
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in job["lora_targets"] if t in names]
    if not targets:
        raise RuntimeError(
            f"none of the LoRA targets {job['lora_targets']} is a module of this model "
            f"(its modules include {sorted(n for n in names if not n.isdigit())[:20]})"
        )
    lora = peft.LoraConfig(r=job["lora_rank"], target_modules=targets, task_type="CAUSAL_LM")
    return peft.get_peft_model(model, lora)


def _build_qlora_model(cfg: Any, job: dict) -> Any:
    """4-bit NF4 weights through the path users take: save random weights, load quantized."""
    import shutil
    import tempfile

    import peft
    import torch
    import transformers

    folder = tempfile.mkdtemp(prefix="gpuwise-qlora-")
    try:
        random = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        random.save_pretrained(folder)
        del random
        gc.collect()
        quant = transformers.BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder,
            quantization_config=quant,
            dtype=torch.bfloat16,
            attn_implementation=job["attention"],
            device_map={"": job["device"]},
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    model = peft.prepare_model_for_kbit_training(
        model,
        use_gradient_checkpointing=job["checkpointing"],
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )
    model.train()
    return _with_lora(model, job)


def _make_optimizer(name: str, params: list) -> Any:
    import torch

    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-3, scale_parameter=False, relative_step=False)
    try:
        import bitsandbytes
    except ImportError as exc:
        raise RuntimeError("the adamw8bit optimizer needs bitsandbytes and a CUDA GPU") from exc
    return bitsandbytes.optim.AdamW8bit(params, lr=1e-3)


def _vocab_size(model: Any) -> int:
    return int(model.config.get_text_config().vocab_size)


def _inference_plan(model: Any, job: dict) -> Callable[[], None]:
    import torch

    generator = torch.Generator().manual_seed(0)
    shape = (job["batch"], job["prompt_tokens"])
    ids = torch.randint(0, _vocab_size(model), shape, generator=generator).to(job["device"])
    mask = torch.ones_like(ids)
    extra: dict[str, Any] = {}
    if job["kv_dtype"] is not None:
        backend, nbits = KV_QUANTIZED[job["kv_dtype"]]
        cache_config: dict[str, Any] = {"backend": backend}
        if nbits is not None:
            cache_config["nbits"] = nbits
        extra = {"cache_implementation": "quantized", "cache_config": cache_config}

    def run() -> None:
        model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=job["new_tokens"],
            min_new_tokens=job["new_tokens"],
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
            **extra,
        )

    return run


def _training_plan(model: Any, job: dict) -> tuple[Callable[[], None], Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    shape = (job["batch"], job["seq"])
    ids = torch.randint(0, _vocab_size(model), shape, generator=generator).to(job["device"])
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _make_optimizer(job["optimizer"], params)
    device_type = "cuda" if job["device"].startswith("cuda") else "cpu"
    mixed = job["dtype"].startswith("mixed-")
    autocast_dtype = _torch_dtype(job["dtype"].removeprefix("mixed-")) if mixed else None
    # No GradScaler for mixed-fp16: its state is a few scalars, and with random weights it
    # could skip the first steps, which would leave the optimizer states uncreated.

    def step() -> None:
        with torch.autocast(device_type, dtype=autocast_dtype, enabled=mixed):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def run() -> None:
        for _ in range(job["steps"]):
            step()

    return run, optimizer


def _tensors_at_rest(model: Any, optimizer: Any | None) -> dict[str, int]:
    """Bytes held between steps, by kind; a storage shared by several tensors counts once."""
    import torch

    seen: set[tuple[str, int]] = set()

    def size(tensors: Iterator[Any]) -> int:
        total = 0
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = (str(t.device), storage.data_ptr())
            if storage.data_ptr() == 0 or key in seen:
                continue
            seen.add(key)
            total += storage.nbytes()
        return total

    params = list(model.parameters())
    state = optimizer.state.values() if optimizer is not None else []
    return {
        "params": size(iter(params)),
        "buffers": size(model.buffers()),
        "grads": size(p.grad for p in params if p.grad is not None),
        "optimizer": size(v for s in state for v in _state_tensors(s)),
    }


def _state_tensors(state: object) -> Iterator[Any]:
    if isinstance(state, dict):
        for value in state.values():
            yield from _state_tensors(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _state_tensors(value)
    else:
        yield state


# ---------------------------------------------------------------- child side: measuring


def _measure_cpu(run: Callable[[], None], at_rest: Callable[[], dict[str, int]]) -> dict:
    run()  # warm-up
    gc.collect()
    tensors = at_rest()
    baseline = _rss_bytes() - sum(tensors.values())
    if _reset_hwm():
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
        peak = _hwm_bytes()
        method = "VmHWM reset through /proc/self/clear_refs"
    else:
        with _RssSampler() as sampler:
            start = time.perf_counter()
            run()
            seconds = time.perf_counter() - start
        peak = sampler.peak
        method = "resident set sampled every 1 ms (clear_refs unavailable)"
    return {
        "peak_bytes": peak,
        "baseline_bytes": baseline,
        "model_bytes": peak - baseline,
        "device": "cpu",
        "tensors_at_rest": tensors,
        "seconds": seconds,
        "method": method,
    }


def _cuda_context_bytes(device: Any) -> tuple[int, str]:
    """Device memory this process holds beyond torch's reserved pool (the CUDA context)."""
    import torch

    reserved = torch.cuda.memory_reserved(device)
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(
                uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
            )
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory:
                    return int(proc.usedGpuMemory) - reserved, "NVML process memory"
        finally:
            pynvml.nvmlShutdown()
    free, total = torch.cuda.mem_get_info(device)
    return total - free - reserved, "cudaMemGetInfo (counts other processes on the device too)"


def _measure_cuda(
    run: Callable[[], None], at_rest: Callable[[], dict[str, int]], device_name: str
) -> dict:
    import torch

    device = torch.device(device_name)
    run()  # warm-up
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    tensors = at_rest()
    context, source = _cuda_context_bytes(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    run()
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    reserved_peak = torch.cuda.max_memory_reserved(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return {
        "peak_bytes": reserved_peak + context,
        "baseline_bytes": context,
        "model_bytes": reserved_peak,
        "device": f"cuda:{index} ({torch.cuda.get_device_name(index)})",
        "tensors_at_rest": tensors,
        "seconds": seconds,
        "method": f"torch.cuda.max_memory_reserved + context from {source}",
    }


def _run_job(job: dict) -> dict:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if job["device"].startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {job['device']!r} asked for, but torch sees no CUDA GPU")
    model = _build_model(job)
    if job.get("measure") == "time":
        from gpuwise.measure.runs.time_run import time_job

        result = time_job(model, job)
        result["torch_version"] = torch.__version__
        result["transformers_version"] = transformers.__version__
        return result
    optimizer = None
    if job["kind"] == "inference":
        run = _inference_plan(model, job)
    else:
        run, optimizer = _training_plan(model, job)

    def at_rest() -> dict[str, int]:
        return _tensors_at_rest(model, optimizer)

    if job["device"].startswith("cuda"):
        result = _measure_cuda(run, at_rest, job["device"])
    else:
        result = _measure_cpu(run, at_rest)
    result["torch_version"] = torch.__version__
    result["transformers_version"] = transformers.__version__
    return result


def _child_main(run_job: Callable[[dict], dict] | None = None) -> int:
    """The child process: the job from stdin, one JSON result line on stdout."""
    # Keep stdout for the one result line: anything the libraries print goes to stderr.
    result_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        job = json.loads(sys.stdin.read())
        result = (run_job or _run_job)(job)
        if job.get("measure") != "time":
            MeasuredMemory(**result)  # the parent builds one from it: fail here if it would not
        payload, code = json.dumps(result), 0
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent as text
        import traceback

        traceback.print_exc()
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        if len(message) > _ERROR_CHARS:
            message = message[: _ERROR_CHARS - 3] + "..."
        payload, code = json.dumps({"error": message}), 1
    result_out.write(payload + "\n")
    result_out.flush()
    return code


if __name__ == "__main__":
    sys.exit(_child_main())
