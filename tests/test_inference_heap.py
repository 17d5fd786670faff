"""An inference's tensor list for the host replay (workload/process_heap.generate_events) against
what LD_PRELOAD traces of generate() showed (docs/memory.md, "The CPU process")."""

from gpuwise.catalog import resolve_model
from gpuwise.workload import from_config
from gpuwise.workload.ops import Shape
from gpuwise.workload.prefill_heap import prefill_heap_events
from gpuwise.workload.process_heap import generate_events


def _lifetimes(events):
    """(size, taken at, given back at) of every tensor, in the order taken."""
    taken, out = {}, []
    for n, e in enumerate(events):
        if e.nbytes:
            taken[e.key] = (e.nbytes, n)
        else:
            size, at = taken.pop(e.key)
            out.append((size, at, n))
    return sorted(out, key=lambda t: t[1])


def test_the_prefill_fills_a_fresh_cache_with_copies():
    """DynamicLayer.update cats k and v onto empty tensors: a copy each a layer, held to the
    end of generate(), and GPT-2's fused projection output goes within its layer."""
    s = Shape(2, 512, 512, 4, 4, 4, "sdpa")
    smollm2 = from_config(resolve_model("smollm2-135m").config)  # k and v narrower than x
    kv = 2 * 512 * smollm2.kv_dim * 4
    events = generate_events(smollm2, s, 1)  # the prefill and the first token only
    last_taken = max(n for n, e in enumerate(events) if e.nbytes)
    held_to_end = [t for t in _lifetimes(events) if t[0] == kv and t[2] > last_taken]
    assert len(held_to_end) == 2 * smollm2.num_layers
    arch = from_config(resolve_model("gpt2").config)
    qkv = 2 * 512 * (arch.q_dim + 2 * arch.kv_dim) * 4
    events = generate_events(arch, s, 1)
    last_taken = max(n for n, e in enumerate(events) if e.nbytes)
    fused = [t for t in _lifetimes(events) if t[0] == qkv]
    assert len(fused) == arch.num_layers
    assert all(t[2] < last_taken for t in fused)


def test_eager_attention_probabilities_live_through_the_mlp():
    """The attention returns its weights and the decoder layer holds them in a local to its
    end: the last score-sized tensor of a layer goes after the MLP's intermediate."""
    arch = from_config(resolve_model("gpt2").config)
    s = Shape(2, 512, 512, 4, 4, 4, "eager")
    scores = 2 * arch.num_heads * 512 * 512 * 4
    inner = 2 * 512 * arch.intermediate_size * 4
    lives = _lifetimes(prefill_heap_events(arch, s))
    first_layer_scores = [t for t in lives if t[0] == scores][:4]
    probs = first_layer_scores[-1]
    mlp = [t for t in lives if t[0] == inner and t[1] > probs[1]][0]
    assert probs[2] > mlp[2]
    sdpa = _lifetimes(prefill_heap_events(arch, Shape(2, 512, 512, 4, 4, 4, "sdpa")))
    assert not [t for t in sdpa if t[0] == scores]
