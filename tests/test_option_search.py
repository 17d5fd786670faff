"""advise sizes only the candidates that can change its answer (estimate/cost/option_search.py):
the options shown, the recommendation and every reason are those of sizing every candidate,
and each candidate left unsized has a floor above the last option shown."""

from __future__ import annotations

import pytest

from gpuwise.app.cost import candidates
from gpuwise.catalog import resolve_model
from gpuwise.catalog.costs import load_costs
from gpuwise.estimate.cost.advise import ROWS_SHOWN, Job, advise, serving_options
from gpuwise.estimate.cost.option_search import Floor, Priced, Unsized, sized_cheapest_first
from gpuwise.workload import from_config
from gpuwise.workload.deployments import ServeLoad

LOADS = [  # (model, requests a day, prompt, output, ms/token, TTFT ms)
    ("qwen2.5-1.5b", 50_000, 512, 256, 50.0, 1000.0),
    ("qwen2.5-1.5b", 2_000, 256, 128, None, None),
    ("qwen2.5-7b", 400_000, 1024, 256, 30.0, 800.0),
]


def _answer(model: str, load: ServeLoad, rows: int | None) -> tuple[object, list[Unsized[Job]]]:
    arch = from_config(resolve_model(model).config)
    a, unsized = load_costs(), []
    options = serving_options(arch, load, candidates(None, None, None), a, rows=rows,
                              unsized=unsized)
    return advise(options, a, unsized=unsized), unsized


def _row(o: object) -> tuple[object, ...]:
    return (o.label, round(o.cost.usd_per_month, 6), o.meets)  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", LOADS)
def test_the_answer_is_that_of_sizing_every_candidate(case: tuple) -> None:
    model, per_day, prompt, output, tpot, ttft = case
    load = ServeLoad(per_day, prompt, output, tpot, ttft)
    full, none_left = _answer(model, load, None)
    searched, left = _answer(model, load, ROWS_SHOWN)
    assert not none_left
    shown = [_row(o) for o in full.options[:ROWS_SHOWN]]  # type: ignore[attr-defined]
    assert [_row(o) for o in searched.options[:ROWS_SHOWN]] == shown  # type: ignore[attr-defined]
    assert searched.reasons == full.reasons  # type: ignore[attr-defined]
    assert searched.unsized == tuple((f"{u.job[0].name} {u.job[1]}", u.floor.usd_per_month)
                                     for u in left)  # type: ignore[attr-defined]
    # a floor is a bound: no option of an unsized candidate, once sized, is cheaper
    for u in left:
        hw, fmt = u.job[0].hw, u.job[1]
        costs = [o.cost.usd_per_month for o in full.options  # type: ignore[attr-defined]
                 if o.sizing and o.sizing.candidate.hw.id == hw.id
                 and (hw.kind != "cpu" or o.sizing.precision.startswith(fmt))]
        assert costs and min(costs) >= u.floor.usd_per_month * (1 - 1e-9)


def test_a_busy_load_leaves_the_dear_candidates_unsized() -> None:
    load = ServeLoad(100_000, 512, 256, 50.0, 1000.0)
    searched, left = _answer("qwen2.5-7b", load, ROWS_SHOWN)
    assert len(left) >= 10
    last = searched.options[ROWS_SHOWN - 1].cost.usd_per_month  # type: ignore[attr-defined]
    assert all(u.floor.usd_per_month > last for u in left if not u.floor.cpu)


def _search(floors: list[Floor], results: list[list[Priced]], rows: int) -> list[int]:
    sized: list[int] = []

    def size(job: int) -> int:
        sized.append(job)
        return job

    sized_cheapest_first(list(range(len(floors))), floors, rows, size, lambda i: results[i])
    return sized


def test_a_cheaper_cpu_or_a_smaller_fleet_is_still_sized() -> None:
    cheap = [Priced(True, 4, 10.0), Priced(True, 4, 11.0)]
    floors = [Floor(4, 9.0), Floor(4, 10.0), Floor(8, 50.0, cpu=True), Floor(1, 60.0),
              Floor(2, 70.0), Floor(4, 80.0)]
    results = [cheap, cheap, [Priced(True, 8, 55.0, cpu=True)], [Priced(True, 1, 65.0)],
               [Priced(True, 2, 75.0)], [Priced(True, 4, 85.0)]]
    # two rows: both filled by the first two; the CPU (started first: it is always sized),
    # the 1-device fleet (smaller than any) are sized; 2 devices after 1 cannot be
    # smallest, nor can 4
    assert _search(floors, results, 2) == [2, 0, 1, 3]
    # a CPU that meets cheaper than another CPU's floor leaves that one unsized
    floors[4] = Floor(8, 70.0, cpu=True)
    results[4] = [Priced(True, 8, 71.0, cpu=True)]
    assert _search(floors, results, 2) == [2, 0, 1, 3]
    # with more rows than options that meet, every candidate is sized
    assert _search(floors, results, 20) == [2, 0, 1, 3, 4, 5]
