"""`gpuwise serve`: the serving simulation's properties, its schedulers, and bad input."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from catalogue_archs import arch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwise.catalog import find_hardware
from gpuwise.errors import GpuwiseError
from gpuwise.estimate.serve.metrics import Slo, summary
from gpuwise.estimate.serve.replica import ReplicaOptions, build_engine, no_load_latency
from gpuwise.estimate.serve.simulate import simulate
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.workload.plans import InferencePlan
from gpuwise.workload.requests import Lengths, Request, parse_trace, poisson_requests

LLAMA = arch("llama-3.1-8b")
H100 = find_hardware("h100-sxm")
LENGTHS = Lengths(512, 128)
NO_TARGETS = Slo()


def engine(runtime="vllm", hw=H100, **opts):
    plan = InferencePlan(prompt_tokens=512, new_tokens=128, runtime=runtime,
                         weights="q4_k_m" if runtime == "llama.cpp" else "bf16")
    return build_engine(LLAMA, plan, hw, rates_from_spec(hw), ReplicaOptions(**opts))


def run(eng, rate, count=300, lengths=LENGTHS, slo=NO_TARGETS):
    return summary(simulate(eng, poisson_requests(rate, count, lengths, seed=1)), slo)


@settings(max_examples=8, deadline=None, derandomize=True)
@given(st.floats(2.0, 20.0), st.floats(1.2, 3.0))
def test_more_load_never_lowers_the_latency_percentiles(rate, more):
    eng = engine()
    light, heavy = run(eng, rate), run(eng, rate * more)
    # The same arrival draws, compressed: a percentile may move by its rank's neighbour
    # (under 1%), never down by more; a time to first token also by where its arrival falls
    # in the step then running (rate 6.27 x 1.22 moves the p90 down 2.2%).
    assert heavy.ttft_s.p90 >= light.ttft_s.p90 * 0.97
    assert heavy.e2e_s.p90 >= light.e2e_s.p90 * 0.99
    assert heavy.tpot_s.p50 >= light.tpot_s.p50 * 0.99


def test_more_kv_memory_never_adds_preemptions():
    base = engine()
    long = Lengths(2048, 1024)
    counts = []
    for blocks in (3000, 6000, 12000, 48000):
        small = replace(base, kv_blocks=blocks)
        counts.append(run(small, 30.0, 200, long).preemptions)
    assert counts == sorted(counts, reverse=True) and counts[0] > 0 == counts[-1]


def test_a_rate_past_saturation_grows_the_queue_and_says_so():
    eng = engine()
    assert not run(eng, 10.0).saturated
    over = run(eng, 200.0, 1000)
    assert over.saturated and over.ttft_s.p90 > 10 * run(eng, 10.0).ttft_s.p90


def test_one_client_at_a_time_sees_the_no_load_latency():
    eng = engine()
    reqs = [Request(0.0, 512, 128) for _ in range(20)]
    rec = summary(simulate(eng, reqs, clients=1), Slo())
    ttft, tpot = no_load_latency(eng, 512, 128)
    assert rec.ttft_s.p50 == pytest.approx(ttft, rel=0.02)
    assert rec.tpot_s.p50 == pytest.approx(tpot, rel=0.05)
    assert not rec.saturated and rec.preemptions == 0


def test_llama_cpp_with_one_slot_answers_one_request_at_a_time():
    eng = engine("llama.cpp", find_hardware("rtx-4090"), max_seqs=1)
    reqs = [Request(0.0, 512, 128) for _ in range(4)]
    trace = simulate(eng, reqs)
    starts = sorted(s.first_token_s for s in trace.seqs)
    ends = sorted(s.done_s for s in trace.seqs)
    assert all(start >= end for start, end in zip(starts[1:], ends[:-1], strict=True))


def test_llama_server_runs_its_four_default_slots_together():
    eng = engine("llama.cpp", find_hardware("rtx-4090"))
    assert eng.limits.max_seqs == 4  # llama-server's --parallel auto
    trace = simulate(eng, [Request(0.0, 512, 128) for _ in range(5)])
    firsts = sorted(s.first_token_s for s in trace.seqs)
    dones = sorted(s.done_s for s in trace.seqs)
    assert firsts[3] < dones[0] <= firsts[4]  # four run at once, the fifth waits for a slot


def test_a_static_batch_gives_its_requests_one_first_token_time():
    eng = engine("transformers")
    reqs = [Request(0.0, p, o) for p, o in ((100, 10), (400, 50), (200, 30))]
    trace = simulate(eng, reqs)
    assert len({s.first_token_s for s in trace.seqs}) == 1
    assert len({s.done_s for s in trace.seqs}) == 3  # each answer done at its own last token


def test_sglang_runs_prompts_before_decodes():
    vllm, sglang = run(engine("vllm"), 20.0), run(engine("sglang"), 20.0)
    assert sglang.ttft_s.p90 <= vllm.ttft_s.p90 * 1.05


def test_traces_of_the_common_benchmarks_read_in_seconds():
    text = "\n".join(json.dumps({"timestamp": 1_700_000_000_000 + 250 * i, "input_length": 100,
                                 "output_length": 20}) for i in range(5))
    reqs = parse_trace(text)
    assert [r.arrival_s for r in reqs] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert {(r.prompt, r.output) for r in reqs} == {(100, 20)}


@pytest.mark.parametrize("text,message", [
    ("not json", "not JSON"), ('{"arrival_s": 0}', "no prompt length"),
    ('{"arrival_s": -1, "prompt_tokens": 5, "output_tokens": 5}', "arrivals at 0"), ("", "no requests"),
])
def test_a_bad_trace_is_one_line(text, message):
    with pytest.raises(GpuwiseError) as err:
        parse_trace(text)
    assert message in str(err.value) + (err.value.hint or "")


def serve_cli(*args):
    from gpuwise.cli import main

    try:
        main(["serve", "llama-3.1-8b", "--on", "h100", *args])
    except SystemExit as exc:
        return exc.code
    return 0


@pytest.mark.parametrize("args,message", [
    (["--rate", "-1"], "positive number"),
    (["--rate", "5", "--ttft-ms", "1"], "can never be met"),
    (["--rate", "5", "--concurrency", "2"], "one of --rate"),
    (["--rate", "1", "--prompt", "200000"], "positions the model takes"),
    (["--rate", "1", "--prompt", "100000", "--runtime", "sglang", "--gpu-memory-utilization",
      "0.3"], "KV cache holds"),
    (["--rate", "1", "--runtime", "vlm"], "did you mean"),
])
def test_bad_serving_input_is_one_line_and_exit_2(args, message, capsys):
    assert serve_cli(*args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_json_has_what_a_capacity_plan_reads(capsys):
    assert serve_cli("--rate", "8", "--requests", "200", "--ttft-ms", "500", "--tpot-ms", "40",
                     "--sweep", "--json") == 0
    rec = json.loads(capsys.readouterr().out)
    for key in ("ttft_s", "tpot_s", "e2e_s", "itl_s"):
        assert set(rec[key]) == {"mean", "p50", "p90", "p99"}
    for key in ("output_tokens_per_s", "requests_per_s", "goodput_requests_per_s",
                "preemptions", "kv_peak_fraction", "runtime", "curve", "max_rate_meeting_slo"):
        assert key in rec, key
    assert rec["runtime"] == "vllm" and rec["max_rate_meeting_slo"] > 8
    assert rec["energy"]["per_million_tokens_j"] > 0


@pytest.mark.parametrize("runtime,rate", [("vllm", 5.0), ("sglang", 10.0), ("llama.cpp", 0.05),
                                          ("transformers", 1.0)])
def test_steady_decode_runs_simulated_as_one_give_the_step_by_step_answer(runtime, rate,
                                                                          monkeypatch):
    import gpuwise.estimate.serve.steady as steady

    hw = find_hardware("rtx-4090") if runtime == "llama.cpp" else H100
    eng = engine(runtime, hw)
    fast = run(eng, rate, 120)
    monkeypatch.setattr(steady, "RUNS", False)
    slow = run(eng, rate, 120)
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        one, other = getattr(fast, key), getattr(slow, key)
        for p in ("p50", "p90"):
            assert getattr(one, p) == pytest.approx(getattr(other, p), rel=1e-6)
    assert fast.output_tokens_per_s == pytest.approx(slow.output_tokens_per_s, rel=1e-6)


def test_the_prefix_cache_computes_a_shared_system_prompt_once():
    lengths = Lengths(2048, 64)
    on = engine()
    off = replace(on, prefix_cache=False)
    shared_on, shared_off = replace(on, shared_prefix=1536), replace(off, shared_prefix=1536)
    cached, uncached = run(shared_on, 12.0, 200, lengths), run(shared_off, 12.0, 200, lengths)
    assert cached.ttft_s.p50 < 0.5 * uncached.ttft_s.p50
    assert cached.kv_peak_fraction < uncached.kv_peak_fraction
    # Without a shared prefix the cache changes nothing.
    assert run(on, 12.0, 200, lengths).ttft_s == run(off, 12.0, 200, lengths).ttft_s


def test_energy_charges_the_hosts_gaps_at_the_memory_power_and_only_idle_time_at_idle():
    from gpuwise.estimate.serve.metrics import Power, busy_joules, energy
    from gpuwise.estimate.serve.simulate import Trace

    trace = Trace([], busy_s=10.0, compute_s=4.0, host_s=2.0)
    power = Power(busy_w=700.0, idle_w=100.0, memory_w=500.0)
    # compute-bound 4 s at 700 W; memory-bound 4 s and the host's 2 s between steps at 500 W
    assert busy_joules(trace, power) == pytest.approx(4 * 700 + 6 * 500)
    rec = energy(trace, window_s=15.0, requests=10, tokens=1000, power=power)
    assert rec.joules == pytest.approx(4 * 700 + 6 * 500 + 5 * 100)  # 5 s with no step


def _second_ttft(eng, arrival_s):
    """TTFT of a request that arrives while another one decodes (or, at 0, with it idle)."""
    reqs = [Request(0.0, 512, 400), Request(arrival_s, 256, 8)]
    return simulate(eng, reqs).seqs[1]


def test_sglangs_overlap_scheduler_admits_a_request_arriving_mid_step_a_step_later():
    eng = engine("sglang")
    assert eng.limits.overlap
    serial = replace(eng, limits=replace(eng.limits, overlap=False))
    late, now = _second_ttft(eng, 0.5), _second_ttft(serial, 0.5)
    decode_step = eng.step_seconds(1, 0, 512 + 100, 0.0)
    ttft_late = late.first_token_s - late.req.arrival_s
    ttft_now = now.first_token_s - now.req.arrival_s
    # the step it arrived in, then the one already chosen, then its prompt
    assert ttft_late - ttft_now == pytest.approx(decode_step, rel=0.1)


def test_an_idle_overlap_scheduler_takes_a_request_at_once():
    eng = engine("sglang")
    serial = replace(eng, limits=replace(eng.limits, overlap=False))
    rec_on = summary(simulate(eng, [Request(0.0, 512, 64)]), Slo())
    rec_off = summary(simulate(serial, [Request(0.0, 512, 64)]), Slo())
    assert rec_on.ttft_s.p50 == pytest.approx(rec_off.ttft_s.p50, rel=1e-9)


def test_only_sglang_picks_its_next_step_during_the_running_one():
    for runtime in ("vllm", "llama.cpp", "transformers"):
        hw = find_hardware("rtx-4090") if runtime == "llama.cpp" else H100
        assert not engine(runtime, hw).limits.overlap


@settings(max_examples=6, deadline=None)
@given(st.floats(2.0, 20.0), st.floats(1.2, 3.0))
def test_more_load_never_lowers_sglangs_latency_percentiles(rate, more):
    eng = engine("sglang")
    light, heavy = run(eng, rate), run(eng, rate * more)
    for key in ("ttft_s", "e2e_s"):
        assert getattr(heavy, key).p90 >= getattr(light, key).p90 * 0.99


def test_a_prompt_passes_over_the_running_requests_cells_not_the_finished_ones():
    """llama.cpp's shared cache: a prompt's attention spans the cells up to the highest in
    use, the running requests' included; llama-server clears every idle slot's cells when a
    new request starts (`cache_idle_slots`), so finished requests' cells add nothing."""
    seen: list[float] = []
    eng = engine("llama.cpp", find_hardware("rtx-4090"))
    assert eng.shared_cells and not engine("vllm").shared_cells

    def parts(tokens, prompt, kv_read, flops, masked):
        if prompt:
            seen.append(masked)
        return 0.01, 0.0, 0.0

    eng = replace(eng, step_parts=parts)
    # the second arrives while the first decodes (its 300 cells below); the third after both
    simulate(eng, [Request(0.0, 300, 100), Request(0.5, 100, 10), Request(10.0, 100, 10)])
    assert seen == [300 * (512 - 300), 100 * (512 - 100), 100 * (256 - 100)]


def test_a_new_request_clears_every_idle_slots_cells():
    from gpuwise.estimate.serve.cells import SharedCells

    cells = SharedCells(1024)
    for seq in (0, 1):
        cells.start(seq)
        cells.take([(seq, 300)])
    cells.finish(0)
    assert cells.span() == 768 and cells.used == 600  # finished, its cells kept till then
    cells.start(2)  # slot 0 idle: saved to the prompt cache and cleared; 1 still runs
    assert 0 not in cells.owned and cells.used == 300 and cells.span() == 768
    cells.take([(2, 100)])  # the head (600) is over twice 100 past the 300 in use: from 0
    assert cells.cells(2)[0] == 0
    cells.take([(2, 100)])  # from the head now (100)
    assert cells.cells(2)[100] == 100


def test_on_a_cpu_a_decoding_sequence_in_a_prompts_first_tile_makes_its_tiles_computed():
    """ggml-cpu's flash attention computes whole 64x64 tiles: a tile where any query sees any
    cell is computed, the rest skipped after reading the mask (cells.py)."""
    from gpuwise.estimate.serve.cells import SharedCells

    def prompt_beside(decoding: bool) -> list:
        cells = SharedCells(8192, tiled=True)
        cells.start(0)
        cells.take([(0, 1024)])  # another sequence's 1024 cells: KV tiles 0-15
        cells.start(1)
        return cells.take(([(0, 1)] if decoding else []) + [(1, 512)])

    [alone], (mixed, rest) = prompt_beside(False), prompt_beside(True)
    assert alone.span == mixed.span == 1536
    assert alone.computed == 4096 * 36  # the prompt's own causal tiles only
    assert alone.skipped == 512 * 1536 - alone.computed
    # the decoding token (cell 1024, tile 16 beside the prompt's first cells) sees tiles 0-16
    assert mixed.computed == alone.computed + 4096 * 16
    assert (rest.parts, rest.computed) == ([(1, 511, 1)], 0)  # a 1-token ubatch: per query
    # off a CPU (or without tiles) nothing is counted in tiles
    assert SharedCells(8192).take([(0, 512)])[0].computed == 0


def test_decode_runs_place_cells_as_step_by_step_ubatches_do():
    """take_run places whole runs of decode steps at once (contiguous free cells, or scattered
    ones in order); it must leave the cache exactly as one ubatch a step does."""
    import random

    from gpuwise.estimate.serve.cells import SharedCells

    def scenario(seed: int, runs: bool) -> tuple:
        rng = random.Random(seed)
        cells, running, nxt = SharedCells(rng.choice([512, 1000, 2048])), [], 0
        for _ in range(60):
            r = rng.random()
            if r < 0.3 and len(running) < 4:
                cells.start(nxt)
                cells.take([(nxt, rng.randint(1, 300))])
                running.append(nxt)
                nxt += 1
            elif r < 0.5 and running:
                cells.finish(running.pop(rng.randrange(len(running))))
            elif running:
                k = rng.randint(1, 80)
                if runs:
                    cells.take_run(list(running), k)
                else:
                    for _ in range(k):
                        cells.take([(s, 1) for s in running])
        return (bytes(cells.free), {s: cells.cells(s) for s in cells.owned}, cells.head, cells.used,
                cells.top)

    for seed in range(300):
        assert scenario(seed, True) == scenario(seed, False), seed


@pytest.mark.parametrize("runtime,device,load,opts,clients", [
    ("vllm", "l4", 1.4, {}, 0),  # preemptions: the group written back, stepped one by one
    ("vllm", "h100-sxm", 0.9, {"shared_prefix": 256}, 0),
    ("sglang", "a10g", 1.4, {}, 0),  # the first in line waits for blocks: long steady runs
    ("sglang", "h100-sxm", 0.8, {"shared_prefix": 128}, 8),
])
def test_the_decoding_group_gives_the_answer_of_stepping_each_sequence(runtime, device, load,
                                                                       opts, clients,
                                                                       monkeypatch):
    """decoding.py steps the running sequences past their prompts as one group; stepped one by
    one instead, every request's times, every gap between tokens, the steps, preemptions and
    the cache's peak are the same (to rounding: sums in another order)."""
    import gpuwise.estimate.serve.decoding as decoding
    from gpuwise.estimate.serve.replica import rate_ceiling

    eng = engine(runtime, find_hardware(device), **opts)
    rate = load * rate_ceiling(eng, 512, 128)
    reqs = poisson_requests(rate, 300, Lengths(512, 128, "normal", "normal"), seed=4)

    def outcome() -> tuple:
        tr = simulate(eng, reqs, clients=clients)
        times = [t for s in tr.seqs for t in (s.first_token_s, s.last_token_s, s.done_s,
                                              s.generated)]
        return tr, times

    grouped, times = outcome()
    monkeypatch.setattr(decoding, "GROUPED", False)
    each, each_times = outcome()
    assert (grouped.steps, grouped.preemptions, grouped.kv_peak_fraction) == (
        each.steps, each.preemptions, each.kv_peak_fraction)
    assert grouped.itl.bins == each.itl.bins
    assert times == pytest.approx(each_times, rel=1e-9)
    assert grouped.end_s == pytest.approx(each.end_s, rel=1e-12)
    if runtime == "vllm" and device == "l4":
        assert grouped.preemptions > 0
