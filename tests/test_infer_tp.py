"""`gpuwise infer --tp`: the time over tensor-parallel devices (train and serve take the same
option); what the time record carries for the validations (benchmarks/validate_*.py) to read:
the device rates it rests on and each phase's page faults; and `--fuse-layers` (AutoAWQ's fused
loader, a setting of the published runs validate_published_memory.py estimates)."""

import json

from cli_run import run_cli


def _infer(capsys, *options: str) -> dict:
    code, out, err = run_cli(["infer", "llama-3.1-70b", "--on", "h100-sxm", "--weights", "fp8",
                              "--prompt", "512", "--new-tokens", "64", "--runtime", "vllm", *options,
                              "--json"],
                             capsys)
    assert code == 0, err
    return json.loads(out)


def test_tp_splits_the_decode_and_vllms_memory_is_one_devices_share(capsys):
    one, four = _infer(capsys), _infer(capsys, "--tp", "4")
    assert (one["time"]["tp"], four["time"]["tp"]) == (1, 4)
    assert four["time"]["decode_s_per_token"] < one["time"]["decode_s_per_token"] / 2
    weights = (one["memory"]["breakdown"]["weights"], four["memory"]["breakdown"]["weights"])
    assert weights[1] == weights[0] / 4  # vLLM shards the weights (and the pool's heads)
    assert not one["memory"]["fits"] and four["memory"]["fits"]  # 70B fp8: 4 x H100, not 1
    assert any(n.startswith("--tp 4:") and "one device's share" in n for n in four["memory"]["notes"])
    assert not any(n.startswith("--tp") for n in one["memory"]["notes"])


def test_under_transformers_tp_times_and_keeps_the_whole_models_memory(capsys):
    code, out, _ = run_cli(["infer", "llama-3.1-8b", "--on", "h100-sxm", "--tp", "2", "--json"],
                           capsys)
    code1, out1, _ = run_cli(["infer", "llama-3.1-8b", "--on", "h100-sxm", "--json"], capsys)
    two, one = json.loads(out), json.loads(out1)
    assert two["memory"]["total_bytes"] == one["memory"]["total_bytes"]
    assert any("whole model's on one device" in n for n in two["memory"]["notes"])


def test_gpus_are_replicas_of_the_tp_deployment(capsys):
    code, out, err = run_cli(["infer", "llama-3.1-8b", "--on", "h100-sxm", "--runtime", "vllm",
                              "--tp", "2", "--gpus", "8", "--json"], capsys)
    assert code == 0, err
    assert any(n.startswith("--gpus: 4 replicas") for n in json.loads(out)["memory"]["notes"])
    code, _, err = run_cli(["infer", "llama-3.1-8b", "--on", "h100-sxm", "--tp", "4", "--gpus",
                            "6"], capsys)
    assert code == 2 and "--gpus 6 is not a multiple of --tp 4" in err


def test_tp_that_does_not_split_the_heads_is_one_clear_line(capsys):
    code, _, err = run_cli(["infer", "llama-3.1-70b", "--on", "h100-sxm", "--tp", "3"], capsys)
    assert code == 2
    assert "--tp 3 does not split" in err and "1, 2, 4, 8" in err


def test_time_record_carries_the_device_rates(capsys):
    rates = _infer(capsys)["time"]["device_rates"]
    assert rates["source"] == "spec" and rates["matmul_size"] == 8192
    assert 1e12 < rates["memory_bytes_per_s"] < 1e13
    assert rates["interconnect_bytes_per_s"] > 1e11
    assert 1e14 < rates["matmul_flops_per_s"]["bf16"] < rates["matmul_flops_per_s"]["fp8"]


def test_fuse_layers_is_autoawqs_fused_loader(capsys):
    args = ["infer", "mistral-7b", "--on", "rtx-4090", "--weights", "int4", "--quant-kernel",
            "awq-gemm", "--prompt", "64", "--new-tokens", "64", "--ctx", "2048", "--json"]
    code, plain, err = run_cli(args, capsys)
    assert code == 0, err
    code, fused, err = run_cli([*args, "--fuse-layers"], capsys)
    assert code == 0, err
    plain, fused = json.loads(plain), json.loads(fused)
    assert (plain["plan"]["fuse_layers"], fused["plan"]["fuse_layers"]) == (False, True)
    # the fused cache is allocated whole for --ctx positions, not for prompt + new tokens
    assert fused["memory"]["breakdown"]["kv_cache"] > plain["memory"]["breakdown"]["kv_cache"]


def test_time_record_carries_the_page_faults_of_each_phase(capsys):
    faults = _infer(capsys)["time"]["page_faults_s"]  # a catalogue GPU: no probed first touch
    assert faults == {"prefill": 0.0, "decode": 0.0}
