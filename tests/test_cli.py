"""The command contract: JSON keys, one-line errors with exit code 2, light imports."""

import json

import pytest

from gpuwise.cli import main


def run(args, capsys):
    code = 0
    try:
        main(args)
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def test_infer_json_contract(capsys):
    code, out, _ = run(
        [
            "infer",
            "llama-3.1-8b",
            "--on",
            "h100",
            "--batch",
            "2",
            "--prompt",
            "1024",
            "--new-tokens",
            "64",
            "--weights",
            "int4",
            "--kv-dtype",
            "fp8",
            "--attention",
            "eager",
            "--json",
        ],
        capsys,
    )
    assert code == 0
    obj = json.loads(out)
    mem = obj["memory"]
    for key in ("weights", "kv_cache", "activations", "logits", "overhead"):
        assert key in mem["breakdown"]
    assert sum(mem["breakdown"].values()) == mem["total_bytes"]
    assert mem["capacity_bytes"] > 0 and mem["fits"] is True
    assert obj["params"] == 8_030_261_248
    assert obj["model"]["name"] == "llama-3.1-8b" and obj["hardware"]["id"] == "h100-sxm"
    assert "Hugging Face transformers" in mem["runtime"]


def test_train_json_contract(capsys):
    code, out, _ = run(
        [
            "train",
            "qwen2.5-7b",
            "--on",
            "a100-80gb",
            "--batch",
            "2",
            "--seq",
            "1024",
            "--dtype",
            "bf16",
            "--optimizer",
            "adamw8bit",
            "--finetune",
            "lora",
            "--checkpointing",
            "--gpus",
            "4",
            "--zero",
            "2",
            "--tp",
            "2",
            "--json",
        ],
        capsys,
    )
    assert code == 0, out
    mem = json.loads(out)["memory"]
    for key in ("weights", "gradients", "optimizer", "activations", "logits", "overhead"):
        assert key in mem["breakdown"]
    assert sum(mem["breakdown"].values()) == mem["total_bytes"]


def test_check_and_lists(capsys):
    code, out, _ = run(["check", "gpt2", "--on", "t4", "--json"], capsys)
    assert code == 0
    rec = json.loads(out)
    # a T4 has no bf16 matrix units: fp16 takes bf16's row, and fp8 under transformers
    # (FBGEMM, compute capability 9.0) is not offered, said why
    assert {r["weights"] for r in rec["precisions"]} == {"fp32", "fp16", "int8", "int4", "nf4"}
    assert any(n.startswith("fp8: not offered") for n in rec["notes"])
    code, out, _ = run(["check", "gpt2", "--on", "h100", "--json"], capsys)
    assert {r["weights"] for r in json.loads(out)["precisions"]} >= {"bf16", "fp8", "int4"}
    code, out, _ = run(["hardware", "--json"], capsys)
    assert code == 0 and len(json.loads(out)) >= 20
    code, out, _ = run(["models", "--json"], capsys)
    assert code == 0 and len(json.loads(out)) >= 25


def test_main_job_json(capsys):
    code, out, _ = run(["--json"], capsys)
    assert code == 0
    obj = json.loads(out)
    assert obj["hardware"]["source"] == "detected"
    assert obj["models"] and {"model", "weights", "total_bytes", "fits", "max_context"} <= set(
        obj["models"][0]
    )


def test_root_json_before_a_command_is_the_commands_json(capsys):
    code, out, _ = run(["--json", "infer", "gpt2", "--on", "h100", "--new-tokens", "4"], capsys)
    assert code == 0 and json.loads(out)["model"]["name"] == "gpt2"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["check", "lama-3.1-8b"], "did you mean"),
        (["infer", "gpt2", "--on", "h1000"], "did you mean"),
        (["infer", "gpt2", "--batch", "0"], "batch"),
        (["infer", "gpt2", "--prompt", "-3"], "prompt"),
        (["infer", "gpt2", "--weights", "int3"], "precision"),
        (["train", "gpt2", "--zero", "7"], "zero"),
        (["train", "gpt2", "--gpus", "3", "--tp", "2"], "multiple"),
        (["infer", "gpt2", "--batch", "abc"], "batch"),
        (["infer", "gpt2", "--bacth", "2"], "bacth"),
        (["check", "./missing/config.json"], "no such file"),
        (["frobnicate"], "frobnicate"),
    ],
)
def test_bad_input_is_one_clear_line(args, needle, capsys):
    code, out, err = run(args, capsys)
    assert code == 2
    assert err.startswith("error: ")
    assert needle in err.lower()
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2


def test_malformed_config_names_the_missing_field(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 100,
            }
        )
    )
    code, _, err = run(["check", str(cfg), "--on", "t4"], capsys)
    assert code == 2 and "intermediate_size" in err
    cfg.write_text("{not json")
    code, _, err = run(["check", str(cfg), "--on", "t4"], capsys)
    assert code == 2 and "not valid JSON" in err
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": -64}))
    code, _, err = run(["check", str(tmp_path), "--on", "t4"], capsys)
    assert code == 2 and err.startswith("error: ")


def test_model_folder_and_unknown_family(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    code, _, err = run(["check", str(tmp_path), "--on", "t4"], capsys)
    assert code == 2 and "mamba" in err


def test_hub_id_without_network_or_cache_says_so(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    code, _, err = run(["check", "someone/not-a-real-model-xyz", "--on", "t4"], capsys)
    assert code == 2 and "local hub cache" in err


def test_estimate_path_imports_no_torch_or_numpy(heavy_imports):
    code = ("from gpuwise.cli import main\n"
            "try:\n    main(['check', 'llama-3.1-8b', '--on', 'h100', '--json'])\n"
            "except SystemExit: pass")
    assert heavy_imports(code) == []


def test_train_time_to_train_tokens(capsys):
    code, out, _ = run(["train", "smollm2-135m", "--on", "h100-sxm", "--train-tokens", "2e9",
                        "--json"], capsys)
    t = json.loads(out)["time"]
    assert code == 0 and t["train_tokens"] == 2e9
    assert t["time_to_train_s"] == pytest.approx(2e9 / t["tokens_per_s"])
    code, _, err = run(["train", "smollm2-135m", "--train-tokens", "-1"], capsys)
    assert code == 2 and err.startswith("error: --train-tokens")
