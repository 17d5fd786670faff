"""A model that ships quantised is estimated as it ships (catalog/formats.py `shipped_weights`,
app/checkpoint_weights.py): gpt-oss in MXFP4, DeepSeek-V3 in block-scaled fp8, where
--weights is not given; where its format has no kernel on the device, its weights
dequantised, said so; --weights still wins."""

from __future__ import annotations

import json

import pytest
from cli_run import run_cli as run

from gpuwise.catalog.formats import shipped_weights


@pytest.mark.parametrize(("quant", "expected"), [
    ({"quant_method": "mxfp4"}, "mxfp4"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8-block"),
    ({"quant_method": "fp8"}, "fp8"),
    ({"quant_method": "awq", "bits": 4}, "int4"),
    ({"quant_method": "gptq", "bits": 8}, "int8"),
    ({"quant_method": "bitnet"}, None),
    (None, None),
])
def test_the_format_a_config_ships_in(quant: dict | None, expected: str | None) -> None:
    config = {"model_type": "x"} if quant is None else {"quantization_config": quant}
    assert shipped_weights(config) == expected


def _infer(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code, out, err = run(["infer", *args, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def test_gpt_oss_is_estimated_in_mxfp4_and_fits_a_16_gb_card(capsys) -> None:
    rec = _infer(capsys, "gpt-oss-20b", "--on", "rtx-4090")
    assert rec["plan"]["weights"] == "mxfp4"
    assert "quantization_config" in rec["weights_source"]
    # the model card: "gpt-oss-20b ... run within 16GB of memory"
    assert rec["memory"]["total_bytes"] < 16 * 2**30
    given = _infer(capsys, "gpt-oss-20b", "--on", "rtx-4090", "--weights", "bf16")
    assert given["plan"]["weights"] == "bf16"
    assert given["memory"]["total_bytes"] > 2.5 * rec["memory"]["total_bytes"]


def test_without_a_kernel_for_its_format_the_weights_are_dequantised(capsys) -> None:
    rec = _infer(capsys, "gpt-oss-20b", "--on", "v100-sxm2-32gb")
    assert rec["plan"]["weights"] == "fp16"  # no bf16 on a V100 either
    assert "mxfp4 it ships in does not run here" in rec["weights_source"]
    code, _, err = run(["infer", "gpt-oss-20b", "--on", "v100-sxm2-32gb", "--weights",
                        "mxfp4"], capsys)
    assert code == 2 and "compute capability 7.5" in err  # asked for: refused, said why


def test_deepseek_ships_block_fp8_and_check_lists_the_shipped_format_first(capsys) -> None:
    rec = _infer(capsys, "deepseek-v3", "--on", "h200", "--runtime", "vllm", "--tp", "8")
    assert rec["plan"]["weights"] == "fp8-block"
    code, out, err = run(["check", "gpt-oss-20b", "--on", "h100", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["precisions"][0]["weights"] == "mxfp4"
