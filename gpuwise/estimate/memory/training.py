"""Training memory per device: weights, gradients, optimizer states, saved activations,
logits, and the temporaries of backward and of the optimizer step.

The peak is the largest of three moments: the end of the forward pass (every saved
activation alive), the start of backward (plus the gradient of the logits and the LM head's
weight gradient), and the optimizer step (all gradients, all states and the step's
temporaries, with activations already freed).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.optimizers import optimizer_spec
from gpuwise.catalog.runtimes import runtime
from gpuwise.estimate.memory.activations import saved_for_backward
from gpuwise.estimate.memory.breakdown import MemoryEstimate, make_estimate
from gpuwise.estimate.memory.weights import weight_bytes
from gpuwise.workload import Architecture, count_params
from gpuwise.workload.plans import TrainingPlan


@dataclass(frozen=True)
class ParamBytes:
    """Per-device bytes of weights, gradients and optimizer states, and the trainable count."""

    weights: float
    gradients: float
    optimizer: float
    trainable: float
    largest_trainable: float  # elements of the largest trainable tensor (step temporaries)


def lora_dims(arch: Architecture, plan: TrainingPlan) -> dict[str, tuple[int, int]]:
    """(in, out) of each matrix of a layer that the plan's LoRA targets."""
    d, q, kv, i = arch.hidden_size, arch.q_dim, arch.kv_dim, arch.intermediate_size
    if arch.moe:
        i = arch.moe.expert_intermediate
    dims = {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d),
            "gate_proj": (d, i), "up_proj": (d, i), "down_proj": (i, d)}  # fmt: skip
    if not arch.gated_mlp:
        dims.pop("gate_proj")
    return {t: dim for t, dim in dims.items() if t in plan.lora_targets}


# The matrices of a layer that read the same input tensor (a full fine-tune saves it once
# for their weight gradients).
SHARED_INPUTS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"),
                 ("down_proj",))  # fmt: skip


def lora_cast_bytes(arch: Architecture, plan: TrainingPlan) -> float:
    """Activation memory peft's fp32 adapters on a 16-bit base add: each targeted matrix's
    input cast to fp32 and saved for its adapter's weight gradient (q, k and v each cast
    their own), less the 16-bit inputs a full fine-tune saves for its weight gradients
    (the saved-activation profile's), which a frozen base does not. Without it an 8B
    model's LoRA step (b4 s1024, rank 16, all seven matrices) was 25% low on an H200."""
    c = weight_format(plan.compute_dtype).bytes_per_element
    if plan.finetune not in ("lora", "qlora") or c >= 4:
        return 0.0
    dims = lora_dims(arch, plan)
    cast = sum(k for k, _ in dims.values()) * 4.0
    saved = sum(next((dims[t][0] for t in group if t in dims), 0) for group in SHARED_INPUTS) * c
    layers = 1 if plan.checkpointing else arch.num_layers
    return max(0.0, cast - saved) * plan.batch * plan.seq * layers / plan.tp


def lora_params(arch: Architecture, plan: TrainingPlan) -> float:
    """Adapter parameters: rank x (in + out) for every targeted matrix of every layer."""
    per_layer = sum(plan.lora_rank * (a + b) for a, b in lora_dims(arch, plan).values())
    return per_layer * arch.num_layers


def _optimizer_bytes(plan: TrainingPlan, trainable: float, state_bytes: float,
                     arch: Architecture) -> float:  # fmt: skip
    """The optimizer's states (catalog/data/optimizers.toml): full states in the state dtype,
    8-bit states with an fp32 (4-byte) absmax per block, or a factored second moment."""
    spec = optimizer_spec(plan.optimizer)
    if spec.quantisation_block:
        n = spec.quantised_states
        return trainable * (n * spec.quantised_state_bytes + n * 4 / spec.quantisation_block)
    if spec.factored:
        # Rows + columns per matrix in fp32: about 2 / hidden of the params.
        return trainable * 2 / arch.hidden_size * 4
    return trainable * spec.states_per_param * state_bytes


def param_bytes(arch: Architecture, plan: TrainingPlan) -> ParamBytes:
    """Weights, gradients and optimizer states on one device after sharding."""
    counts = count_params(arch)
    total = counts.total
    compute = weight_format(plan.compute_dtype).bytes_per_element
    dp, tp = plan.data_parallel, plan.tp
    if plan.finetune == "full":
        trainable = float(total)
        largest = float(max(counts.embedding, counts.lm_head))
        if plan.zero and plan.mixed:
            # ZeRO mixed precision: low-precision weights and gradients, fp32 master copy
            # plus states in the optimizer partition (ZeRO paper, K = 12 for Adam).
            weights, grad_bytes, state_bytes, master = total * compute, compute, 4.0, 4.0
        else:
            param = 4.0 if plan.mixed else compute
            weights, grad_bytes, state_bytes, master = total * param, param, param, 0.0
        gradients = trainable * grad_bytes
        optimizer = _optimizer_bytes(plan, trainable, state_bytes, arch) + trainable * master
    else:
        trainable = lora_params(arch, plan)
        largest = trainable / max(1, arch.num_layers * len(plan.lora_targets))
        base = "nf4" if plan.finetune == "qlora" else plan.compute_dtype
        weights = weight_bytes(arch, base) + trainable * 4  # adapters kept in fp32 (peft)
        gradients = trainable * 4
        optimizer = _optimizer_bytes(plan, trainable, 4.0, arch)
    weights /= tp
    gradients /= tp
    optimizer /= tp
    if plan.zero >= 1:
        optimizer /= dp
    if plan.zero >= 2:
        gradients /= dp
    if plan.zero >= 3:
        weights /= dp
    return ParamBytes(weights, gradients, optimizer, trainable / tp, largest / tp)


def step_temporary(plan: TrainingPlan, pb: ParamBytes, foreach: bool, state: float) -> float:
    """Scratch memory of optimizer.step(): foreach kernels work on whole lists at once, the
    single-tensor loop on one tensor at a time (catalog/data/optimizers.toml)."""
    spec = optimizer_spec(plan.optimizer)
    copies = spec.step_temporaries_foreach if foreach else spec.step_temporaries_loop
    if not copies:  # in place, or one fused kernel
        return 0.0
    elements = pb.trainable if foreach else pb.largest_trainable
    if plan.zero >= 1:
        elements /= plan.data_parallel
    return elements * state * copies


def estimate_training(arch: Architecture, plan: TrainingPlan, hw: Hardware) -> MemoryEstimate:
    """Peak memory of one training step under PyTorch/transformers on each device."""
    rt = runtime(hw.kind)
    pb = param_bytes(arch, plan)
    compute = weight_format(plan.compute_dtype).bytes_per_element
    mode = "mixed-bf16" if plan.mixed else ("fp32" if plan.dtype == "fp32" else "bf16")
    saved = saved_for_backward(arch, plan.batch, plan.seq, mode, plan.attention,
                               plan.checkpointing, plan.tp)  # fmt: skip
    acts = saved["layers"] + saved["other"] + lora_cast_bytes(arch, plan)
    logits = saved["logits"]
    tokens = plan.batch * plan.seq
    # Backward starts with the gradients of the loss w.r.t. the log-probabilities and the
    # logits (fp32, both alive in log_softmax's backward); later the LM head's weight gradient
    # is allocated while the logits' gradient is alive. Under checkpointing one layer is
    # recomputed while its gradients flow.
    logits_grad = tokens * arch.vocab_size / plan.tp * 8
    head_grad = pb.gradients * (count_params(arch).lm_head or count_params(arch).embedding) / max(
        1, count_params(arch).total) if plan.finetune == "full" else 0.0  # fmt: skip
    backward_extra = max(logits_grad, head_grad) + saved["recompute"]
    state = 4.0 if (plan.mixed or plan.finetune != "full") else compute
    step_temp = step_temporary(plan, pb, rt.optimizer_foreach, state)
    base = pb.weights + pb.optimizer
    phases = {
        "forward": base + acts + logits,
        "backward": base + acts + logits + backward_extra,
        "optimizer step": base + pb.gradients + step_temp,
    }
    phase = max(phases, key=lambda k: phases[k])
    if phase == "optimizer step":
        parts = {"weights": pb.weights, "gradients": pb.gradients, "optimizer": pb.optimizer,
                 "activations": 0.0, "logits": 0.0, "workspace": step_temp}  # fmt: skip
    else:
        extra = backward_extra if phase == "backward" else 0.0
        parts = {"weights": pb.weights, "gradients": 0.0, "optimizer": pb.optimizer,
                 "activations": acts, "logits": logits, "workspace": extra}  # fmt: skip
    dynamic = sum(v for k, v in parts.items() if k not in ("weights", "optimizer"))
    overhead = rt.baseline_bytes + rt.allocator_fraction * dynamic
    parts["overhead"] = overhead
    notes = [f"{saved['attention']} attention; saved activations from the measured "
             f"{arch.model_type} profile of the transformers runtime"]  # fmt: skip
    if saved["attention"] != plan.attention:
        notes.append(f"{arch.model_type} has no {plan.attention} path in transformers: "
                     f"{saved['attention']} assumed")  # fmt: skip
    if plan.gpus > 1:
        notes.append(f"{plan.gpus} devices: tensor parallel {plan.tp}, data parallel "
                     f"{plan.data_parallel}, ZeRO stage {plan.zero}")  # fmt: skip
    total_phases = {k: v + overhead for k, v in phases.items()}
    return make_estimate(parts, hw.memory_bytes, rt.name, phase, total_phases, tuple(notes))
