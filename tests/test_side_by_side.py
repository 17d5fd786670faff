"""advise's sizings run side by side (app/side_by_side.py): the same answers, in the same
order, as run in turn; a worker's error reaches the caller."""

from __future__ import annotations

from functools import partial

import pytest

from gpuwise.app.cost import candidate, candidates
from gpuwise.app.side_by_side import Workers, side_by_side
from gpuwise.catalog import find_hardware, resolve_model
from gpuwise.catalog.costs import load_costs
from gpuwise.estimate.cost.advise import ROWS_SHOWN, serving_options
from gpuwise.estimate.in_turn import one_by_one
from gpuwise.workload import from_config
from gpuwise.workload.deployments import ServeLoad


def _square(x: int) -> int:
    return x * x


def _fails(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    return x


def test_results_come_back_in_the_items_order() -> None:
    seen: list[float] = []
    items = list(range(40))
    assert side_by_side(_square, items, "item", lambda _, done: seen.append(done)) == [
        x * x for x in items]
    assert len(seen) == len(items) and max(seen) < 1


def test_a_workers_error_reaches_the_caller() -> None:
    with pytest.raises(ValueError, match="three"):
        side_by_side(_fails, list(range(8)), "item")


def test_advise_options_side_by_side_are_those_in_turn() -> None:
    arch = from_config(resolve_model("qwen2.5-1.5b").config)
    cands = [candidate(find_hardware(d)) for d in ("t4", "l4", "rtx-4090", "a10", "h100-sxm")]
    load = ServeLoad(requests_per_day=20_000, prompt_tokens=256, output_tokens=128,
                     tpot_ms=40.0, ttft_ms=800.0)
    a = load_costs()
    run = partial(serving_options, arch, load, cands, a)
    with Workers("sizing") as workers:
        assert run(stream=workers.stream) == run(stream=one_by_one)


def test_advise_searched_side_by_side_keeps_what_it_keeps_in_turn() -> None:
    """The search's next candidate is chosen as a worker comes free, so more may be sized
    side by side than in turn; what is kept is what matters once every result is in."""
    arch = from_config(resolve_model("qwen2.5-7b").config)
    load = ServeLoad(requests_per_day=100_000, prompt_tokens=512, output_tokens=256,
                     tpot_ms=50.0, ttft_ms=1000.0)
    a = load_costs()
    cands = candidates(None, None, None)
    answers = []
    for stream in (one_by_one, None):
        unsized: list = []
        with Workers("sizing") as workers:
            options = serving_options(arch, load, cands, a, rows=ROWS_SHOWN, unsized=unsized,
                                      stream=stream or workers.stream)
        answers.append(([o.label for o in options], [u.floor for u in unsized]))
    assert answers[0] == answers[1] and answers[0][1]


def test_a_stream_takes_the_next_item_only_once_a_worker_is_free() -> None:
    taken: list[int] = []

    def items():
        for x in range(12):
            taken.append(x)
            yield x

    with Workers("item") as workers:
        for x, y in workers.stream(_square, items()):
            assert y == x * x
            assert len(taken) <= x + 1 + 2  # never more than the workers ahead
