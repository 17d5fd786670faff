"""Training memory per device: weights, gradients, optimizer states, saved activations,
logits, and the temporaries of backward and of the optimizer step.

The peak is the largest of three moments: the end of the forward pass (every saved
activation alive), the backward (the larger of the loss's turn, with the logits' gradients
and the LM head's weight gradient, and the layers' turn, with a recomputed layer; or its end,
every gradient taken), and the optimizer step (all gradients, all states and the step's
temporaries, with activations already freed).

The stacks' memory features (the loss, optimizer in backward, paged states, offload, FSDP2,
selective checkpointing, QLoRA's settings) change these terms as stack_features.py says; on
a GPU the CUDA rows (cuda_rows.py) replace the runtime's fixed overhead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwise.catalog.formats import weight_format
from gpuwise.catalog.hardware import Hardware
from gpuwise.catalog.optimizers import optimizer_spec
from gpuwise.catalog.runtimes import profile_family, runtime
from gpuwise.estimate.memory.activations import saved_with_policy
from gpuwise.estimate.memory.breakdown import MemoryEstimate, make_estimate
from gpuwise.estimate.memory.cuda_rows import (
    device_rows,
    device_slack,
    training_peak,
    uses_cuda_allocator,
)
from gpuwise.estimate.memory.host_allocator import host_allocator_rows
from gpuwise.estimate.memory.host_memory import host_capacity, host_note, paged_note
from gpuwise.estimate.memory.stack_features import (
    LOSS_STACKS,
    LossMemory,
    deepspeed_bucket,
    fsdp2_working_set,
    loss_memory,
    offloaded_activations,
    qlora_dequant_bytes,
    qlora_weights,
)
from gpuwise.estimate.memory.weights import weight_bytes
from gpuwise.estimate.runtimes import runtime_unit
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
            "gate_proj": (d, i), "up_proj": (d, i), "down_proj": (i, d)}
    if not arch.gated_mlp:
        dims.pop("gate_proj")
    return {t: dim for t, dim in dims.items() if t in plan.lora_targets}


# The matrices of a layer that read the same input tensor (a full fine-tune saves it once
# for their weight gradients).
SHARED_INPUTS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"),
                 ("down_proj",))


def lora_cast_bytes(arch: Architecture, plan: TrainingPlan) -> float:
    """Activation memory peft's fp32 adapters on a 16-bit base add: each targeted matrix's
    input cast to fp32 and saved for its adapter's weight gradient (q, k and v each cast
    their own), less the 16-bit inputs a full fine-tune saves for its weight gradients
    (the saved-activation profile's), which a frozen base does not. Without it an 8B
    model's LoRA step (b4 s1024, rank 16, all seven matrices) was 25% low on an H200."""
    c = weight_format(plan.compute_dtype).bytes_per_element
    if plan.finetune not in ("lora", "qlora") or c >= 4 or plan.adapter_dtype != "fp32":
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
                     arch: Architecture) -> float:
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
    """Weights, gradients and optimizer states on one device after sharding (DeepSpeed ZeRO's
    layout, or FSDP2's: every parameter, gradient and state sharded over the data-parallel
    ranks, in the parameter's own dtype)."""
    counts = count_params(arch)
    total = counts.total
    compute = weight_format(plan.compute_dtype).bytes_per_element
    dp, tp = plan.data_parallel, plan.tp
    fsdp2 = plan.sharding == "fsdp2"
    if plan.finetune == "full":
        trainable = float(total)
        largest = float(max(counts.embedding, counts.lm_head))
        if plan.zero and plan.mixed and not fsdp2:
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
        base = (qlora_weights(arch, plan) if plan.finetune == "qlora"
                else weight_bytes(arch, plan.compute_dtype))
        adapter = weight_format(plan.adapter_dtype).bytes_per_element  # peft: fp32
        weights = base + trainable * adapter
        gradients = trainable * adapter
        optimizer = _optimizer_bytes(plan, trainable, adapter, arch)
    weights /= tp
    gradients /= tp
    optimizer /= tp
    zero = 3 if fsdp2 and dp > 1 else plan.zero
    if zero >= 1:
        optimizer /= dp
    if zero >= 2:
        gradients /= dp
    if zero >= 3:
        weights /= dp
    return ParamBytes(weights, gradients, optimizer, trainable / tp, largest / tp)


def step_temporary(plan: TrainingPlan, pb: ParamBytes, foreach: bool, state: float) -> float:
    """Scratch memory of optimizer.step(): foreach kernels work on whole lists at once, the
    single-tensor loop on one tensor at a time (catalog/data/optimizers.toml)."""
    spec = optimizer_spec(plan.optimizer)
    copies = spec.step_temporaries_foreach if foreach else spec.step_temporaries_loop
    if not copies:  # in place, or one fused kernel
        return 0.0
    elements = pb.trainable if foreach and not plan.optimizer_in_backward else pb.largest_trainable
    if plan.zero >= 1 or plan.sharding == "fsdp2":
        elements /= plan.data_parallel
    return elements * state * copies


@dataclass(frozen=True)
class _Placed:
    """Per-device bytes after the stack's placement rules, what went to the host, and why."""

    pb: ParamBytes
    host: float
    notes: tuple[str, ...]
    paged: float = 0.0  # optimizer states in unified memory (bitsandbytes' paged optimizers)


def _placed(arch: Architecture, plan: TrainingPlan, pb: ParamBytes) -> _Placed:
    """Paged states, offload and the optimizer in backward (catalog/data/stacks.toml)."""
    weights, grads, opt, host, notes = pb.weights, pb.gradients, pb.optimizer, 0.0, []
    paged = 0.0
    if optimizer_spec(plan.optimizer).paged:  # where they live: said once the total is known
        paged, opt = opt, 0.0
    if "params" in plan.offload:  # FSDP2 CPUOffloadPolicy / ZeRO-3 offload_param
        host, weights, grads, opt = weights + grads + opt, 0.0, 0.0, 0.0
    elif "optimizer" in plan.offload:  # DeepSpeed ZeRO-Offload
        host, opt = opt, 0.0
        if plan.sharding == "zero":
            per = pb.gradients / max(1.0, pb.trainable)
            kept = min(grads, deepspeed_bucket(plan, per))
            host, grads = host + grads - kept, kept
    if plan.optimizer_in_backward:  # torchtune optimizer_in_bwd: step and free each gradient
        grads = pb.largest_trainable * pb.gradients / max(1.0, pb.trainable)
        notes.append("optimizer step fused into backward (torchtune optimizer_in_bwd): one "
                     "parameter's gradient at a time")
    placed = ParamBytes(weights, grads, opt, pb.trainable, pb.largest_trainable)
    return _Placed(placed, host, tuple(notes), paged)


def _activations(arch: Architecture, plan: TrainingPlan, mode: str) -> dict[str, float | str]:
    """Saved activations under the checkpointing policy and activation offload."""
    saved = saved_with_policy(arch, plan.batch, plan.seq, mode, plan.attention,
                              plan.checkpointing, plan.checkpointing_policy, plan.tp,
                              runtime_unit(plan.runtime).torch_compile)
    layers = saved["layers"]
    if "activations" in plan.offload:
        layers = offloaded_activations(layers, arch)
    return {**saved, "acts": layers + saved["other"] + lora_cast_bytes(arch, plan),
            "offloaded": saved["layers"] - layers}


def _gpu_rows(arch: Architecture, plan: TrainingPlan, hw: Hardware, tensors: float,
              vocab_rows: float, attention: str, replayed: bool = True) -> dict[str, float]:
    """The CUDA rows (cuda_rows.py): slack from a replay of the step, workspace, context,
    and one NCCL communicator per parallel dimension."""
    rows = device_rows(hw, 0.0, int(plan.data_parallel > 1) + int(plan.tp > 1))
    if not replayed:  # no slack: a lower bound (fits.py rules plans out without the replay)
        return {**rows, "allocator_slack": 0.0}
    compute = weight_format(plan.compute_dtype).bytes_per_element
    full = plan.finetune == "full"
    peak = training_peak(arch, plan.batch, plan.seq, compute, 4.0 if plan.mixed else compute,
                         attention, plan.checkpointing, vocab_rows,
                         full and not plan.optimizer_in_backward and "params" not in plan.offload,
                         plan.expandable_segments)
    rows["allocator_slack"] = device_slack(peak, hw.memory_bytes, tensors + sum(rows.values()))
    return rows


def estimate_training(arch: Architecture, plan: TrainingPlan, hw: Hardware, *,
                      held_slack: float | None = None,
                      without_slack: bool = False) -> MemoryEstimate:
    """Peak memory of one training step on each device under the plan's stack.
    `without_slack`: the CUDA allocator's slack left out, not replayed (a lower bound: the
    slack is never negative). `held_slack`:
    the host allocator's slack from an earlier replay, held while a search narrows (fits.py)."""
    rt = runtime(hw.kind)
    placed = _placed(arch, plan, param_bytes(arch, plan))
    pb = placed.pb
    compute = weight_format(plan.compute_dtype).bytes_per_element
    mode = "mixed-bf16" if plan.mixed else ("fp32" if plan.dtype == "fp32" else "bf16")
    saved = _activations(arch, plan, mode)
    full = plan.finetune == "full"
    loss = loss_memory(arch, plan, float(saved["logits"]), compute,
                       4.0 if plan.mixed and full else compute)
    counts = count_params(arch)
    head = (counts.lm_head or counts.embedding) / max(1, counts.total)
    head_grad = pb.gradients * head if full and not loss.head_grad_in_forward else 0.0
    if plan.optimizer_in_backward:
        head_grad = pb.gradients  # the largest parameter's gradient, stepped at once
    dequant = qlora_dequant_bytes(arch, plan) if plan.finetune == "qlora" else 0.0
    adapter = weight_format(plan.adapter_dtype).bytes_per_element
    state = 4.0 if plan.mixed and full else (compute if full else adapter)
    step_temp = step_temporary(plan, pb, rt.optimizer_foreach, state)
    logits_in_bwd, extra = _backward_extra(plan, loss, head_grad,
                                           float(saved["recompute"]) + dequant)
    if plan.optimizer_in_backward:
        extra += step_temp
    on_host = "params" in plan.offload  # the step runs on the host (FSDP2 CPUOffloadPolicy)
    working = 0.0
    if plan.data_parallel > 1 and (plan.sharding == "fsdp2" or plan.zero >= 3):
        param = compute  # gathered in the compute dtype (FSDP2 MixedPrecisionPolicy param_dtype)
        if plan.finetune == "qlora":  # the nf4 shards are gathered as they are stored
            param = qlora_weights(arch, plan) / count_params(arch).total
        grad = (4.0 if plan.mixed else compute) if full else 0.0  # a frozen base has none
        working = fsdp2_working_set(arch, plan, param, grad)
    acts, base = float(saved["acts"]), pb.weights + pb.optimizer
    phases = {"forward": base + working + acts + loss.saved,
              "backward": base + working + acts + logits_in_bwd + extra}
    at_end = _backward_end(arch, plan, pb.gradients, state if full else 0.0)
    ends = not plan.optimizer_in_backward and base + working + at_end > phases["backward"]
    if ends:  # the backward peaks at its end, every gradient taken (checkpointing)
        phases["backward"] = base + working + at_end
    if not plan.optimizer_in_backward and not on_host:
        phases["optimizer step"] = base + pb.gradients + step_temp
    phase = max(phases, key=lambda k: phases[k])
    parts = {"weights": pb.weights, "gradients": 0.0, "optimizer": pb.optimizer,
             "activations": acts,
             "logits": logits_in_bwd if phase == "backward" else loss.saved,
             "workspace": extra if phase == "backward" else 0.0}
    if phase == "optimizer step":
        parts.update(gradients=pb.gradients, activations=0.0, logits=0.0, workspace=step_temp)
    elif phase == "backward" and ends:
        parts.update(gradients=pb.gradients, activations=0.0, logits=0.0,
                     workspace=at_end - pb.gradients)
    if working and phase != "optimizer step":
        parts["fsdp_unsharded"] = working
    tensors = sum(parts.values())
    if uses_cuda_allocator(hw):
        rows = _gpu_rows(arch, plan, hw, tensors, loss.vocab_rows, str(saved["attention"]),
                         replayed=not without_slack)
    else:
        dynamic = tensors - pb.weights - pb.optimizer
        rows = {**host_allocator_rows(arch, plan, hw, held_slack),  # glibc's heap on a CPU
                "overhead": rt.baseline_bytes + rt.allocator_fraction * dynamic}
    parts.update(rows)
    notes = _notes(arch, plan, str(saved["attention"]), bool(saved["compiled_layer"]))
    notes += placed.notes
    total_phases = {k: v + sum(rows.values()) for k, v in phases.items()}
    est = make_estimate(parts, hw.memory_bytes, _runtime_name(rt.name, plan), phase,
                        total_phases, notes, host=hw.kind == "cpu")
    host = placed.host + float(saved["offloaded"])
    if not (placed.paged or host) or hw.kind == "cpu":
        return est
    est = replace(est, paged_bytes=int(round(placed.paged)), host_bytes=int(round(host)),
                  host_capacity_bytes=host_capacity(hw, plan.gpus))
    more = (paged_note(est),) if placed.paged else ()
    return replace(est, notes=(*est.notes, *more, host_note(est, plan)))


def _backward_end(arch: Architecture, plan: TrainingPlan, gradients: float,
                  grad_bytes: float) -> float:
    """What the backward holds at its end beyond the weights and the optimizer's states:
    every gradient, and a tied weight's two addends: the head's gradient waits for the
    embedding's dense vocabulary x hidden one, taken last, and their sum is a new tensor
    (`process_heap.tied_sum`). No logits: the loop holds only the loss (`model(...).loss`;
    transformers' Trainer.compute_loss returns the loss alone), and log_softmax's saved
    output goes once its backward has run, as traced (docs/memory.md, "On a CPU"). Without
    checkpointing the saved activations outweigh it; with it, this is the backward's peak."""
    tied = arch.tie_embeddings and plan.finetune == "full"
    return gradients + (2 * arch.vocab_size * arch.hidden_size * grad_bytes / plan.tp if tied
                        else 0.0)


def _backward_extra(plan: TrainingPlan, loss: LossMemory, head_grad: float,
                    layer_work: float) -> tuple[float, float]:
    """The logits still held and the workspace at the backward's peak. The loss's saved
    logits go as its backward finishes, before the layers' (recomputed) backward starts, so
    the peak is the larger of the two: transformers' Trainer holds only the loss
    (Trainer.compute_loss returns it alone), torchtune's recipes `del logits` before
    `loss.backward()` (recipes/full_finetune_single_device.py, "free logits otherwise it
    peaks backward memory"), torchtitan's train step `del pred`; traced on a CPU, the fp32
    log-probabilities are given back before the first layer's backward (docs/memory.md, "On
    a CPU"). A fused loss's head gradient, taken in its forward, counts with the layers'."""
    if plan.loss == "fused":
        return loss.saved, max(loss.turn, head_grad) + layer_work
    at_loss = loss.saved + max(loss.turn, head_grad)
    in_layers = head_grad + layer_work
    if at_loss >= in_layers:
        return loss.saved, max(loss.turn, head_grad)
    return 0.0, in_layers


def _runtime_name(base: str, plan: TrainingPlan) -> str:
    """The runtime with the stacks whose memory rules the plan takes."""
    named = []
    if plan.loss != "full":
        named.append(LOSS_STACKS[plan.loss])
    if plan.sharding == "fsdp2":
        named.append("FSDP2" + ("" if plan.reshard_after_forward else " (no reshard)"))
    if plan.checkpointing and plan.checkpointing_policy != "full":
        named.append("torchtitan selective op checkpointing" if plan.checkpointing_policy == "op"
                     else f"selective checkpointing every {plan.checkpointing_policy} layers")
    return base + (f" + {', '.join(named)}" if named else "")


def _notes(arch: Architecture, plan: TrainingPlan, attention: str,
           compiled_layer: bool) -> tuple[str, ...]:
    family = profile_family(arch.model_type)
    whose = f"{family} profile" + ("" if family == arch.model_type else f" (for {arch.model_type})")
    notes = [f"{attention} attention; saved activations from the measured {whose} of the "
             "transformers runtime"]
    if compiled_layer:
        notes[0] = (f"{attention} attention; each decoder layer saves what torch.compile's "
                    f"min-cut partitioner keeps, the rest the measured {whose}")
    elif runtime_unit(plan.runtime).torch_compile:
        notes.append(f"torch.compile's saved tensors are not derived for {arch.model_type} "
                     "with this attention/dropout: the eager profile stands in")
    if attention != plan.attention:
        notes.append(f"{arch.model_type} has no {plan.attention} path in transformers: "
                     f"{attention} assumed")
    if plan.gpus > 1:
        notes.append(f"{plan.gpus} devices: tensor parallel {plan.tp}, data parallel "
                     f"{plan.data_parallel}, "
                     + ("FSDP2 fully_shard" if plan.sharding == "fsdp2" else
                        f"ZeRO stage {plan.zero}"))
    if plan.loss == "chunked":
        notes.append(f"loss in {min(plan.loss_chunks, plan.batch * plan.seq)} chunks "
                     "(torchtune LinearCrossEntropyLoss)")
    if plan.finetune == "qlora":
        notes.append(f"QLoRA: nf4 base{' double-quantised' if plan.double_quant else ''}, "
                     f"compute in {plan.quant_compute_dtype or plan.compute_dtype}"
                     + (", other parameters fp32 (peft prepare_model_for_kbit_training)"
                        if plan.kbit_prepare else ""))
    return tuple(notes)
