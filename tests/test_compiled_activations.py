"""Saved activations under torch.compile (`--runtime compiled`): a decoder layer saves what
AOTAutograd's min-cut partitioner keeps (catalog/data/stacks.toml [compiled_layer]), checked
against the partitioner itself on a real transformers layer; other families, eager attention
and the eager runtime keep the measured eager profile."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.runtimes import compiled_layer_profile
from gpuwise.estimate.memory.activations import saved_for_backward, saved_with_policy, term_units
from gpuwise.estimate.memory.training import estimate_training
from gpuwise.workload import count_params, from_config
from gpuwise.workload.plans import TrainingPlan

H100 = find_hardware("h100-sxm")
LLAMA3 = from_config(resolve_model("llama-3.2-3b").config)
GPT2 = from_config(resolve_model("gpt2").config)


def test_compiled_llama_layer_keeps_matmul_and_sdpa_tensors_only():
    """Per layer, bf16: input, both norms' outputs and o_proj's output (4 x b.s.d), rotated q
    and the attention output, rotated k and v, gate, up and SiLU(gate) x up, the fp32
    logsumexp and the two norms' rsqrt."""
    b, s = 2, 4096
    u = term_units(LLAMA3, b, s)
    per_layer = (2 * (4 * u["bsd"] + 2 * u["bsq"] + 2 * u["bskv"] + 3 * u["bsi"])
                 + 4 * u["bhs"] + 4 * 2 * u["bs"])
    got = saved_for_backward(LLAMA3, b, s, "bf16", "sdpa", False, compiled=True)
    assert got["compiled_layer"]
    assert got["layers"] == pytest.approx(per_layer * LLAMA3.num_layers)
    eager = saved_for_backward(LLAMA3, b, s, "bf16", "sdpa", False)
    # each norm: eager keeps the fp32 upcast and the normalised copy (6 bytes), compiled the
    # bf16 norm input or o_proj's output (2); and eager keeps SiLU(gate)
    saved_less = (8 * u["bsd"] + 2 * u["bsi"]) * LLAMA3.num_layers
    assert eager["layers"] - got["layers"] == pytest.approx(saved_less)
    assert (got["logits"], got["other"]) == (eager["logits"], eager["other"])


def test_checkpointed_compiled_layer_recomputes_the_compiled_set():
    args = (LLAMA3, 2, 4096, "bf16", "sdpa", True, "full")
    compiled = saved_with_policy(*args, compiled=True)
    eager = saved_with_policy(*args)
    full = saved_for_backward(LLAMA3, 2, 4096, "bf16", "sdpa", False, compiled=True)
    assert compiled["layers"] == eager["layers"]  # the checkpoint keeps each layer's input
    assert compiled["recompute"] == pytest.approx(full["layers"] / LLAMA3.num_layers)
    assert compiled["recompute"] < eager["recompute"]
    op = saved_with_policy(LLAMA3, 2, 4096, "bf16", "sdpa", True, "op", compiled=True)
    assert op["layers"] == saved_with_policy(LLAMA3, 2, 4096, "bf16", "sdpa", True, "op")["layers"]


@pytest.mark.parametrize("model,attention", [(GPT2, "sdpa"), (LLAMA3, "eager")])
def test_compiled_falls_back_to_the_eager_profile_where_not_derived(model, attention):
    eager = saved_for_backward(model, 2, 512, "bf16", attention, False)
    compiled = saved_for_backward(model, 2, 512, "bf16", attention, False, compiled=True)
    assert not compiled["compiled_layer"]
    assert compiled["layers"] == eager["layers"]
    plan = TrainingPlan(batch=2, seq=512, dtype="bf16", attention=attention, runtime="compiled")
    assert any("eager profile stands in" in n for n in estimate_training(model, plan, H100).notes)


def test_compiled_runtime_lowers_training_activations():
    plan = TrainingPlan(batch=2, seq=4096, dtype="bf16", optimizer="adamw_fused")
    eager = estimate_training(LLAMA3, plan, H100)
    compiled = estimate_training(LLAMA3, replace(plan, runtime="compiled"), H100)
    u = term_units(LLAMA3, 2, 4096)
    less = (8 * u["bsd"] + 2 * u["bsi"]) * LLAMA3.num_layers
    assert eager.breakdown["activations"] - compiled.breakdown["activations"] == pytest.approx(less)


# The partitioner itself, on a real transformers Llama layer (CPU, no Inductor code: the
# forward graph's extra outputs are what it saves for backward).
VIEWS = {"view", "_unsafe_view", "alias", "permute", "transpose", "expand", "t", "reshape",
         "unsqueeze", "squeeze", "slice", "select"}


def _is_view(node) -> bool:
    packet = getattr(node.target, "_overloadpacket", None)
    return node.op == "call_function" and getattr(packet, "__name__", "") in VIEWS


def _partitioner_saved_bytes(mode: str, dims: dict[str, int]) -> float:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("networkx")
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    b, s, d = dims["b"], dims["s"], dims["d"]
    cfg = LlamaConfig(hidden_size=d, num_attention_heads=dims["h"], head_dim=dims["hd"],
                      num_key_value_heads=dims["kv"], intermediate_size=dims["i"],
                      vocab_size=101, num_hidden_layers=1)
    cfg._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    layer = LlamaDecoderLayer(cfg, 0).to(dtype)
    graphs = []

    def fw_compiler(gm, _inputs):
        graphs.append(gm)
        return gm

    def backend(gm, inputs):
        return aot_module_simplified(gm, inputs, fw_compiler=fw_compiler,
                                     bw_compiler=lambda g, _i: g,
                                     partition_fn=min_cut_rematerialization_partition,
                                     decompositions=select_decomp_table())

    x = torch.randn(b, s, d, dtype=dtype, requires_grad=True)
    cos, sin = LlamaRotaryEmbedding(cfg)(x, torch.arange(s)[None].expand(b, s))

    def run(x, cos, sin):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "mixed-bf16"):
            return layer(x, position_embeddings=(cos, sin), attention_mask=None)

    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    try:
        torch.compile(run, backend=backend)(x, cos, sin)
    finally:  # later tests in this process must not see a compiled graph (gpuwise.watch
        torch._dynamo.reset()  # leaves operator counting off when dynamo has compiled one)
        counters.clear()
    (gm,) = graphs
    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    bases = {}
    for node in outputs[1:]:  # the first output is the layer's own
        base = node
        while _is_view(base):
            base = base.args[0]
        val = node.meta["val"]
        if base.op == "placeholder" and tuple(val.shape) != (b, s, d):
            continue  # parameters and the rotary tables (model-level) are not layer activations
        bases[base] = max(bases.get(base, 0), val.numel() * val.element_size())
    return float(sum(bases.values()))


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["bf16", "fp32", "mixed-bf16"])
def test_compiled_profile_is_what_the_min_cut_partitioner_saves(mode):
    dims = {"b": 2, "s": 13, "d": 40, "h": 4, "kv": 2, "hd": 12, "i": 88}
    saved = _partitioner_saved_bytes(mode, dims)
    arch = from_config({"model_type": "llama", "hidden_size": dims["d"], "head_dim": dims["hd"],
                        "num_attention_heads": dims["h"], "num_key_value_heads": dims["kv"],
                        "intermediate_size": dims["i"], "num_hidden_layers": 1,
                        "vocab_size": 101, "max_position_embeddings": 64})
    prof = compiled_layer_profile("llama", mode, "sdpa", False)
    assert prof is not None
    units = term_units(arch, dims["b"], dims["s"])
    linear = count_params(arch).linear
    est = sum(c * (linear if t == "weight_cast" else units[t]) for t, c in prof.items())
    assert est == pytest.approx(saved)
