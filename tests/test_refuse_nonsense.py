"""Nonsense is refused in one line, never answered (issue 21): config.json values outside the
ranges real models have, and numeric options that are NaN, infinite, zero or of the wrong
sign, or far beyond any real machine or workload.

Only input that must be refused before anything runs is given to `repro` and `validate`; the
functions that would start processes are replaced by ones that fail the test."""

from __future__ import annotations

import contextlib
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import run  # the CLI contract's runner: exit code, stdout, stderr

from gpuwise.catalog import find_hardware, load_models, resolve_model
from gpuwise.catalog.config_ranges import config_ranges
from gpuwise.cli import common
from gpuwise.errors import GpuwiseError
from gpuwise.estimate import InferencePlan, TrainingPlan, estimate_inference, estimate_training
from gpuwise.workload import count_params, from_config
from gpuwise.workload.config_ranges import COMMON_KEYS, FAMILY_KEYS

H100 = find_hardware("h100-sxm")
MODELS = ("gpt2", "mixtral-8x7b", "deepseek-v2-lite", "qwen1.5-moe-a2.7b", "pythia-70m",
          "mistral-7b", "gemma-2-2b", "falcon-7b", "phi-2")
CONFIGS = {m: resolve_model(m).config for m in MODELS}


def _numeric_keys(cfg: dict) -> list[str]:
    """The config's numeric fields, and every field a reader takes (present or not)."""
    present = [k for k, v in cfg.items() if isinstance(v, int | float)]
    read = [*COMMON_KEYS, *FAMILY_KEYS.get(cfg["model_type"], {})]
    return sorted({*present, *read, "hidden_act", "layer_types", "mlp_only_layers"})


KEYS = {m: _numeric_keys(c) for m, c in CONFIGS.items()}
# An error about a key may name the fact it broke rather than the key (a hidden size smaller
# than the heads leaves no head_dim; fewer experts than a token uses).
NAMED_BY = {
    "n_embd": ("hidden_size",), "n_head": ("attention heads",),
    "num_attention_heads": ("attention heads",), "num_key_value_heads": ("num_attention_heads",),
    "num_kv_heads": ("num_attention_heads",), "num_experts_per_tok": ("experts",),
    "num_local_experts": ("num_experts_per_tok",), "num_experts": ("num_experts_per_tok",),
    "n_routed_experts": ("num_experts_per_tok",), "n_inner": ("intermediate_size",),
    "multi_query": ("num_attention_heads",),
}
hostile = st.one_of(
    st.sampled_from([0, -1, -5, 1, 2, 3, 10**9, 10**12, 10**18, 10**30, 0.5, 1e12,
                     math.nan, math.inf, -math.inf, True, "64", None, [], {}]),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True, allow_infinity=True),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(MODELS), st.data(), hostile)
def test_a_config_field_is_refused_by_name_or_read_into_a_sane_architecture(model, data, value):
    key = data.draw(st.sampled_from(KEYS[model]))
    cfg = {**CONFIGS[model], key: value}
    try:
        arch = from_config(cfg, model)
    except GpuwiseError as err:
        assert any(name in err.message for name in (key, *NAMED_BY.get(key, ()))), err.message
        assert len(err.message) < 400 and "\n" not in err.message
        return
    counts = count_params(arch)
    assert 0 < counts.active <= counts.total
    assert arch.max_position >= 0 and (arch.sliding_window is None or arch.sliding_window > 0)
    if arch.moe:
        assert 1 <= arch.moe.experts_per_token <= arch.moe.num_experts
    # what was accepted can be estimated without a traceback
    for estimate, plan in ((estimate_inference, InferencePlan(prompt_tokens=64, new_tokens=8)),
                           (estimate_training, TrainingPlan(seq=64))):
        with contextlib.suppress(GpuwiseError):
            assert estimate(arch, plan, H100).total_bytes > 0  # type: ignore[operator]


@pytest.mark.parametrize("model, key, value, named", [
    ("gpt2", "n_embd", 10**12, "n_embd 1000000000000 is outside 1..1,048,576 (the largest "
                               "real models use 16,384"),
    ("llama-3.1-8b", "hidden_size", 1e12, "hidden_size 1000000000000.0 must be an integer"),
    ("gpt2", "n_layer", 10**9, "n_layer 1000000000 is outside 1..16,384"),
    ("gpt2", "vocab_size", 10**18, "vocab_size"),
    ("mixtral-8x7b", "num_local_experts", 10**9, "num_local_experts 1000000000 is outside"),
    ("mixtral-8x7b", "num_local_experts", 0, "num_local_experts 0 is outside 1..65,536"),
    ("mixtral-8x7b", "num_experts_per_tok", 9, "num_experts_per_tok 9 is more than the 8"),
    ("llama-3.1-8b", "max_position_embeddings", -1, "max_position_embeddings -1 is outside"),
    ("mistral-7b", "sliding_window", -5, "sliding_window -5 is outside"),
    ("llama-3.1-8b", "head_dim", 0, "head_dim 0 is outside 1..4,096"),
    ("pythia-70m", "rotary_pct", 0, "rotary_pct 0 is outside (0, 1]"),
    ("deepseek-v2-lite", "kv_lora_rank", 0, "kv_lora_rank 0 is outside"),
    ("llama-3.1-8b", "rope_theta", math.nan, "rope_theta nan is outside"),
    ("llama-3.1-8b", "hidden_act", 3, "hidden_act must be a string"),
])
def test_the_issue_s_configs_are_refused_naming_the_limit(model, key, value, named):
    with pytest.raises(GpuwiseError) as err:
        from_config({**resolve_model(model).config, key: value}, model)
    assert named in err.value.message


def test_zero_or_null_sliding_window_means_none():
    for value in (0, None):
        arch = from_config({**resolve_model("mistral-7b").config, "sliding_window": value})
        assert arch.sliding_window is None and arch.sliding_layers == 0


def test_every_catalogue_model_lies_inside_the_ranges_and_each_range_has_a_source():
    for entry in load_models():
        from_config(entry.load_config(), entry.id)  # raises if any field is outside
    for rng in config_ranges().values():
        assert len(rng.source) > 20 and rng.real and rng.low < rng.high


# --- options -------------------------------------------------------------------------------

BAD = ("nan", "inf", "-1", "0", "1e30")
ADVISE = ["advise", "qwen2.5-0.5b", "--no-local"]
SERVE = ["--requests-per-day", "1000"]
COST = ["cost", "qwen2.5-0.5b", "--on", "h100", "--requests-per-day", "1000"]
REPRO_OUT = "--results"
# (the command before the option, the option, the values that are fine there, what the
# error line must contain: by default the option's name)
OPTIONS: list[tuple[list[str], str, tuple[str, ...], str]] = [
    *[(["check", "gpt2", "--on", "h100"], o, ok, "")
      for o, ok in (("--prompt", ()), ("--new-tokens", ("0",)), ("--batch", ()), ("--ctx", ()),
                    ("--gpu-memory-utilization", ()))],
    *[(["infer", "gpt2", "--on", "h100"], o, ok, "")
      for o, ok in (("--prompt", ()), ("--new-tokens", ("0",)), ("--batch", ()), ("--ctx", ()),
                    ("--gpu-memory-utilization", ()))],
    *[(["train", "gpt2", "--on", "h100"], o, ok, "")
      for o, ok in (("--batch", ()), ("--seq", ()), ("--lora-rank", ()), ("--gpus", ()),
                    ("--zero", ("0",)), ("--tp", ()), ("--train-tokens", ("0",)))],
    *[([*ADVISE, *SERVE], o, (), "") for o in (
        "--prompt", "--output", "--latency-ms", "--ttft-ms", "--hours-per-day", "--batch",
        "--seq", "--lora-rank", "--api-price-per-mtok", "--max-kw", "--local-power-w",
        "--pue", "--depreciation-years", "--deadline-hours")],
    ([*ADVISE, *SERVE], "--utilisation", (), "utilisation"),
    ([*ADVISE, "--train-tokens", "1e9"], "--measured-util", (), "utilisation"),
    ([*ADVISE, *SERVE], "--local-price", ("0",), ""),
    *[([*ADVISE, *SERVE], o, ("0",), "") for o in (
        "--electricity", "--hosting-per-kw-month", "--ops-per-year", "--idle-power",
        "--busy-power", "--memory-power", "--grid-co2", "--reserved-discount", "--host-power-fraction",
        "--host-price-fraction")],
    *[(ADVISE, o, (), "") for o in ("--requests-per-day", "--tokens-per-day",
                                    "--train-tokens", "--hours-per-month")],
    *[(COST, o, (), "") for o in ("--price", "--rate", "--latency-ms", "--pue")],
    *[(["repro"], o, ok, "") for o, ok in (("--runs", ()), ("--parallel", ()), ("--timeout", ()),
                                           ("--alpha", ()), ("--power", ()),
                                           ("--detect", ("1e30",)))],
    *[(["validate", "infer", "gpt2"], o, (), "") for o in ("--batch", "--prompt", "--new-tokens")],
    *[(["validate", "train", "gpt2"], o, (), "") for o in ("--batch", "--seq")],
]
CASES = [(cmd, opt, bad, needle) for cmd, opt, ok, needle in OPTIONS for bad in BAD
         if bad not in ok]


def _words(text: str) -> str:
    return text.lower().replace("-", " ").replace("_", " ")


@pytest.fixture
def nothing_runs(monkeypatch, tmp_path):
    """repro and validate fail the test if they get as far as starting anything."""
    from gpuwise.app import repro, validate

    def started(*args, **kwargs):
        raise AssertionError("a refused input got as far as a run")

    monkeypatch.setattr(repro, "has_gpu", lambda: False)
    monkeypatch.setattr(repro, "run_study", started)
    monkeypatch.setattr(validate, "detect_local", started)
    monkeypatch.chdir(tmp_path)  # a results file, if any, lands here


def _refused_naming(args: list[str], option: str, needle: str, capsys) -> None:
    """Exit 2, one error line naming the option (by its old name or its new one), no
    traceback; a renamed option's note on stderr is not an error line."""
    if args[0] == "repro":
        args = [*args, REPRO_OUT, "study.jsonl", "--", "true"]
    code, out, err = run(args, capsys)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2, (args, out[-300:], err)
    assert len(errors) == 1 and "Traceback" not in err, (args, err)
    names = (needle,) if needle else (option, getattr(common, "RENAMED", {}).get(option, option))
    assert any(_words(n.lstrip("-")) in _words(errors[0]) for n in names), (args, errors[0])


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0][0]} {c[1]}={c[2]}")
def test_nan_inf_negative_zero_or_huge_is_one_error_line_naming_the_option(capsys, nothing_runs,
                                                                          case):
    cmd, option, value, needle = case
    _refused_naming([*cmd, f"{option}={value}"], option, needle, capsys)


# Every option refuses a negative number, and one beyond 1e16 (--detect aside: a difference
# in the metric's own units).
beyond = st.one_of(st.floats(max_value=-1e-6), st.floats(min_value=1e16),
                   st.integers(max_value=-1), st.integers(min_value=10**16))


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([o for o in OPTIONS if o[1] != "--detect"]), beyond)
def test_any_negative_or_huge_number_is_refused(capsys, nothing_runs, option, value):
    cmd, name, _, needle = option
    _refused_naming([*cmd, f"{name}={value!r}"], name, needle, capsys)


def test_tensor_parallel_that_splits_no_heads_names_the_sizes_that_work(capsys):
    code, _, err = run(["train", "qwen2.5-0.5b", "--on", "h100", "--gpus", "3", "--tp", "3"],
                       capsys)
    assert code == 2 and "--tp 3 does not split" in err and "14 attention heads" in err
    assert "that work: 1, 2, 14" in err
    code, _, _ = run(["train", "qwen2.5-0.5b", "--on", "h100", "--gpus", "2", "--tp", "2",
                      "--json"], capsys)
    assert code == 0


def test_repro_runs_are_capped_before_anything_is_planned(capsys, nothing_runs):
    code, _, err = run(["repro", "--runs", "1000000000", "--", "true"], capsys)
    assert code == 2 and "--runs must be an integer from 1 to 10,000" in err
