"""A transformers prefill's tensors as the host allocator sees them (workload.prefill_heap),
the faults their replay finds, and how the prefill estimate charges them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from catalogue_archs import arch
from heap_walk import held_at_end, peak_bytes

from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.allocators import host_allocator
from gpuwise.estimate import InferencePlan
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.estimate.speed.inference_time import estimate_inference_time
from gpuwise.estimate.speed.page_faults import replay
from gpuwise.estimate.speed.probed_kernels import KernelRates
from gpuwise.estimate.speed.step import prefill_fault_bytes
from gpuwise.workload import from_config
from gpuwise.workload.ops import Shape
from gpuwise.workload.prefill_heap import prefill_heap_events

MIB = 2**20
SMALL = host_allocator().untracked_below_bytes
CPU = replace(rates_from_spec(find_hardware("h100-sxm")), kind="cpu", kernel_latency_s=0.0)


def _shape(batch: int, tokens: int, c: int = 4, attention: str = "sdpa") -> Shape:
    return Shape(batch, tokens, tokens, c, c, c, attention, 1)


@pytest.mark.parametrize("name", ["smollm2-135m", "gpt2", "pythia-160m", "phi-2"])
def test_every_tensor_taken_is_given_back_once_and_none_is_small(name):
    events = prefill_heap_events(arch(name), _shape(1, 256))
    taken = [e.key for e in events if e.nbytes]
    given = [e.key for e in events if not e.nbytes]
    assert sorted(taken) == sorted(given) and len(set(taken)) == len(taken)
    assert all(e.nbytes >= SMALL for e in events if e.nbytes)
    held_at_end(events)  # given back only while it is held


def test_the_cache_keeps_every_layer_keys_and_values_to_the_end():
    a = arch("smollm2-135m")
    s = _shape(1, 512)
    events = prefill_heap_events(a, s)
    peak = peak_bytes(events)
    kv = a.num_layers * 2 * s.rows * a.kv_dim * s.compute_bytes
    assert peak >= kv  # the cache's keys and values, all of them live at the end
    assert peak < kv + 12 * s.rows * a.intermediate_size * 4  # plus one layer's temporaries


def test_a_bf16_rmsnorm_upcasts_and_a_python_gelu_makes_a_tensor_per_step():
    bf16 = prefill_heap_events(arch("smollm2-135m"), _shape(1, 256, c=2))
    fp32 = prefill_heap_events(arch("smollm2-135m"), _shape(1, 256, c=4))
    assert len(bf16) > len(fp32)  # fp32 RMSNorm needs no upcast nor downcast
    gpt2 = arch("gpt2")
    inner = 256 * gpt2.intermediate_size * 4
    per_layer = sum(1 for e in prefill_heap_events(gpt2, _shape(1, 256)) if e.nbytes == inner)
    assert per_layer == gpt2.num_layers * 9  # c_fc, 0.5 x, six steps, the product


def test_long_prompts_fault_more_and_a_decode_sized_pass_faults_nothing():
    a = arch("qwen2.5-0.5b")
    short, long = (replay(prefill_heap_events(a, _shape(1, n, c=2))).get("forward", 0)
                   for n in (128, 512))
    assert long > short > 0
    assert replay(prefill_heap_events(a, _shape(1, 1, c=2))) == {}


def test_prefill_pays_its_faults_on_a_probed_cpu_and_nowhere_else():
    record = {"fresh": {"bytes_per_s": 2e9, "threshold": 32 * MIB}}
    probed = replace(CPU, kernels=KernelRates.from_record(record))
    a = arch("qwen2.5-0.5b")
    plan = InferencePlan(batch=1, prompt_tokens=512, new_tokens=8, weights="bf16")
    t = estimate_inference_time(a, plan, probed)
    faults = [o for o in t.prefill.ops if o.op.name == "page faults"]
    expected = prefill_fault_bytes(a, _shape(1, 512, c=2)) / 2e9
    assert len(faults) == 1 and faults[0].seconds == pytest.approx(expected) and expected > 0
    assert not [o for o in t.decode.ops if o.op.name == "page faults"]
    for rates in (CPU, replace(probed, kind="gpu")):  # not probed, or not a CPU
        other = estimate_inference_time(a, plan, rates)
        assert not [o for o in other.prefill.ops if o.op.name == "page faults"]
    compiled = estimate_inference_time(a, plan, probed, runtime="compiled")
    assert not [o for o in compiled.prefill.ops if o.op.name == "page faults"]


CASES = [("smollm2-135m", 1, 256, "fp32", "sdpa"), ("qwen2.5-0.5b", 1, 256, "bf16", "sdpa"),
         ("gpt2", 2, 128, "fp32", "eager"), ("tinyllama-1.1b", 1, 128, "bf16", "sdpa"),
         ("phi-2", 1, 128, "fp32", "sdpa")]


@pytest.mark.torch
@pytest.mark.parametrize(("name", "batch", "tokens", "dtype", "attention"), CASES)
def test_the_sequence_faults_as_the_traced_model_does(name, batch, tokens, dtype, attention):
    """The same replay over the model's own ops, traced on the meta device (4 layers):
    the written sequence faults within 15% of it (measured 0.93-1.10; GPT-NeoX's 1.27 is
    left out: two more tensors per layer in the trace, not found)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from gpuwise.estimate.traced_module import heap_faults
    from gpuwise.measure.module.trace import trace_module

    config = dict(resolve_model(name).config)
    for key in ("num_hidden_layers", "n_layer"):
        if key in config:
            config[key] = 4
    cfg = transformers.AutoConfig.for_model(**config)
    cfg._attn_implementation = attention
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()

    class Prefill(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids):  # type: ignore[no-untyped-def]
            return self.model(input_ids=ids, use_cache=True, logits_to_keep=1).logits

    traced = trace_module(Prefill(), torch.zeros(batch, tokens, dtype=torch.long), dtype=dtype)
    c = 4 if dtype == "fp32" else 2
    written = prefill_fault_bytes(from_config(config, name), _shape(batch, tokens, c, attention))
    assert written == pytest.approx(heap_faults(traced)["forward"], rel=0.15)


@pytest.mark.parametrize(("name", "tokens", "c"), [("qwen2.5-0.5b", 512, 2),
                                                   ("smollm2-135m", 256, 4),
                                                   ("llama-3.1-8b", 128, 2)])
def test_a_deep_model_is_replayed_from_a_few_layers_within_five_percent(name, tokens, c):
    a = arch(name)
    s = _shape(1, tokens, c)
    whole = replay(prefill_heap_events(a, s), passes=2)["forward"]
    assert a.num_layers > 8 and prefill_fault_bytes(a, s) == pytest.approx(whole, rel=0.05)
