"""The user's own config files (issue 40 item 5; docs/configs.md): each stack's own example
config, as shipped in its repository (tests/fixtures/configs/, each file's first line names
its source), read with `--config` gives the plan the equivalent options give, lists every
setting it holds (applied, not modelled or of no effect: none dropped), and names the stack;
options typed on the command line win; a bad file is one `error:` line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
import typer
import yaml
from test_cli import run

from gpuwise.app.config_files import read_config
from gpuwise.cli.common import app
from gpuwise.errors import GpuwiseError
from gpuwise.workload.configs.reading import catalogue_id, flatten
from gpuwise.workload.configs.torchtune import builder_name

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "configs"


def fixture(name: str) -> str:
    return str(FIXTURES / name)


class Captured(Exception):
    """Raised by a spy in place of the app's estimate: the plan is what is compared."""


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every plan the commands hand the app (train, infer, serve), the estimate left out."""
    import gpuwise.app.infer as infer_module
    import gpuwise.app.serve as serve_module
    import gpuwise.app.train as train_module

    seen: list[tuple[Any, ...]] = []

    def train(model: Any, arch: Any, hw: Any, plan: Any, tokens: float = 0.0) -> Any:
        seen.append((model.name, plan))
        raise Captured

    def infer(model: Any, arch: Any, hw: Any, plan: Any, *rest: Any) -> Any:
        seen.append((model.name, plan, *rest))
        raise Captured

    def serve(model: Any, arch: Any, hw: Any, plan: Any, opts: Any, load: Any, slo: Any,
              gpus: int, *rest: Any) -> Any:
        seen.append((model.name, plan, opts, gpus))
        raise Captured

    monkeypatch.setattr(train_module, "train", train)
    monkeypatch.setattr(infer_module, "infer", infer)
    monkeypatch.setattr(serve_module, "serve", serve)
    return seen


def planned(args: list[str], plans: list[tuple[Any, ...]], capsys: Any) -> tuple[Any, ...]:
    """The plan `gpuwise ARGS` builds."""
    before = len(plans)
    with pytest.raises(Captured):
        run(args, capsys)
    capsys.readouterr()
    assert len(plans) == before + 1
    return plans[-1]


# (fixture, the options that say the same, as a user would type them)
TRAINING = [
    ("torchtune_llama3_1_8B_full_single_device.yaml",
     "llama-3.1-8b --batch 2 --dtype bf16 --optimizer paged_adamw8bit --loss chunked "
     "--loss-chunks 8 --optimizer-in-backward --checkpointing"),
    ("torchtune_llama3_1_8B_lora_single_device.yaml",
     "llama-3.1-8b --finetune lora --lora-rank 8 --lora-targets "
     "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --adapter-dtype bf16 --no-kbit-prepare "
     "--batch 2 --dtype bf16 --optimizer adamw_fused --loss chunked --checkpointing"),
    ("torchtune_llama3_1_8B_qlora_single_device.yaml",
     "llama-3.1-8b --finetune qlora --lora-rank 8 --lora-targets "
     "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --adapter-dtype bf16 --no-kbit-prepare "
     "--batch 2 --dtype bf16 --optimizer adamw_fused --loss chunked --checkpointing"),
    ("axolotl_llama-3_lora-8b.yml",
     "llama-3.1-8b --finetune lora --lora-rank 32 --batch 2 --seq 4096 --dtype bf16 "
     "--checkpointing --optimizer adamw8bit --attention flash"),
    ("axolotl_llama-3_qlora.yml",
     "llama-3.1-8b --finetune qlora --lora-rank 32 --batch 2 --seq 4096 --dtype bf16 "
     "--checkpointing --attention flash"),
    ("litgpt_llama-3.1-8b_lora.yaml",
     "llama-3.1-8b --finetune lora --dtype bf16 --lora-rank 32 --lora-targets q_proj,v_proj "
     "--adapter-dtype bf16 --batch 1 --seq 512 --gpus 1"),
    ("alignment-handbook_zephyr-7b-beta_sft_config_qlora.yaml",
     "mistral-7b --finetune qlora --batch 4 --seq 2048 --dtype bf16 --lora-rank 16 "
     "--no-double-quant --checkpointing --attention flash"),
    # accelerate and DeepSpeed configs name no model: it is given beside them
    ("accelerate_fsdp.yaml", "llama-3.2-1b --gpus 2 --sharding fsdp2 --dtype mixed-bf16"),
    ("alignment-handbook_accelerate_zero3.yaml", "llama-3.2-1b --gpus 8 --zero 3 "
     "--dtype mixed-bf16"),
    ("deepspeed_zero_stage3_offload_config.json",
     "llama-3.2-1b --zero 3 --offload optimizer,params --dtype mixed-fp16 --optimizer adamw"),
]
NAMES_NO_MODEL = ("accelerate_fsdp.yaml", "alignment-handbook_accelerate_zero3.yaml",
                  "deepspeed_zero_stage3_offload_config.json")


@pytest.mark.parametrize(("name", "flags"), TRAINING, ids=[t[0] for t in TRAINING])
def test_a_training_config_plans_what_its_options_plan(name, flags, plans, capsys):
    given = ["llama-3.2-1b"] if name in NAMES_NO_MODEL else []
    from_file = planned(["train", *given, "--config", fixture(name), "--on", "h100"], plans,
                        capsys)
    from_flags = planned(["train", *flags.split(), "--on", "h100"], plans, capsys)
    assert from_file == from_flags


# (fixture, command, the options that say the same)
SERVING = [
    ("vllm_serve_config.yaml", "serve", "llama-3.1-8b --runtime vllm"),
    ("vllm_serve_config.yaml", "infer", "llama-3.1-8b --runtime vllm"),
    ("vllm_serve_tp_pp.sh", "serve", "gpt2 --runtime vllm --tp 4"),
    ("sglang_config.yaml", "serve", "llama-3.1-8b --runtime sglang --tp 2"),
    ("sglang_mem_fraction_static.sh", "infer",
     "llama-3.1-8b --runtime sglang --gpu-memory-utilization 0.7"),
    ("llama_server_function_calling.sh", "infer", "qwen2.5-7b --runtime llama.cpp "
     "--weights q4_k_m"),
    ("llama_server_router_defaults.sh", "serve", "llama-3.2-1b --runtime llama.cpp --ctx 8192 "
     "--max-seqs 2"),
]
LOAD = ["--rate", "1", "--requests", "10"]


@pytest.mark.parametrize(("name", "command", "flags"), SERVING,
                         ids=[f"{s[0]}-{s[1]}" for s in SERVING])
def test_a_servers_config_plans_what_its_options_plan(name, command, flags, plans, capsys):
    load = LOAD if command == "serve" else []
    given = ["llama-3.2-1b"] if name == "llama_server_router_defaults.sh" else []
    from_file = planned([command, *given, "--config", fixture(name), "--on", "h100", *load],
                        plans, capsys)
    from_flags = planned([command, *flags.split(), "--on", "h100", *load], plans, capsys)
    assert from_file == from_flags


def test_llama_servers_model_file_is_the_model_and_the_typed_model_wins(plans, capsys):
    args = ["infer", "--config", fixture("llama_server_quick_start.sh"), "--on", "h100"]
    code, _, err = run(args, capsys)  # the file's -m models/7B/ggml-model.gguf is not here
    assert code == 2 and err.startswith("error: no such file: ./models/7B/ggml-model.gguf")
    typed = planned(["infer", "llama-3.2-1b", *args[1:]], plans, capsys)
    assert typed == planned(["infer", "llama-3.2-1b", "--runtime", "llama.cpp", "--ctx", "2048",
                             "--on", "h100"], plans, capsys)


def test_torchtune_full_finetune_is_named_torchtune_not_transformers(capsys):
    code, out, err = run(["train", "--config",
                          fixture("torchtune_llama3_1_8B_full_single_device.yaml"), "--on",
                          "h100", "--json"], capsys)
    assert code == 0, err
    obj = json.loads(out)
    config = obj["config"]
    assert config["format"] == "torchtune"
    assert config["stack"] == "torchtune full_finetune_single_device recipe"
    assert obj["memory"]["runtime"].startswith("torchtune full_finetune_single_device recipe")
    assert "transformers" not in obj["memory"]["runtime"]
    assert "torchtune" in obj["time"]["runtime"]
    assert obj["plan"]["loss"] == "chunked" and obj["plan"]["optimizer_in_backward"]
    assert {s["key"] for s in config["not_modelled"]} == {"tokenizer.max_seq_len"}
    code, text, _ = run(["train", "--config",
                         fixture("torchtune_llama3_1_8B_full_single_device.yaml"), "--on",
                         "h100"], capsys)
    flat = " ".join(text.split())
    assert "config: torchtune full_finetune_single_device recipe" in flat
    assert "runtime: torchtune full_finetune_single_device recipe" in flat
    assert "tokenizer.max_seq_len: null" in flat


def every_setting(name: str) -> set[str]:
    """The keys of a YAML or JSON fixture, nested ones dotted."""
    return set(flatten(yaml.safe_load((FIXTURES / name).read_text())))


MAPPINGS = [n for n, _ in TRAINING] + ["vllm_serve_config.yaml", "sglang_config.yaml"]


@pytest.mark.parametrize("name", MAPPINGS)
def test_every_setting_of_a_file_is_listed_none_dropped(name):
    read = read_config(FIXTURES / name, None, "advise", ("train", "serve"))
    listed = {s.key for s in (*read.applied, *read.not_modelled, *read.no_effect)}
    parts = [key.split(".") for key in every_setting(name)]  # a section may be listed whole
    dropped = {".".join(p) for p in parts
               if not any(".".join(p[:i]) in listed for i in range(1, len(p) + 1))}
    assert not dropped
    assert read.stack and read.format


# (fixture, settings it has that gpuwise does not model)
NOT_MODELLED = [
    ("axolotl_llama-3_lora-8b.yml", {"load_in_8bit", "lora_modules_to_save",
                                     "gradient_accumulation_steps"}),
    ("axolotl_llama-3_qlora.yml", {"optimizer", "gradient_accumulation_steps"}),
    ("torchtune_llama3_1_8B_lora_single_device.yaml", {"tokenizer.max_seq_len",
                                                       "gradient_accumulation_steps"}),
    ("litgpt_llama-3.1-8b_lora.yaml", {"train.global_batch_size"}),
    ("alignment-handbook_zephyr-7b-beta_sft_config_qlora.yaml", {"gradient_accumulation_steps"}),
    ("vllm_serve_tp_pp.sh", {"--pipeline-parallel-size"}),
    ("llama_server_function_calling.sh", {"--flash-attn"}),
    ("llama_server_router_defaults.sh", {"--n-predict"}),
]


@pytest.mark.parametrize(("name", "keys"), NOT_MODELLED, ids=[n for n, _ in NOT_MODELLED])
def test_settings_gpuwise_does_not_model_are_listed_with_why(name, keys):
    read = read_config(FIXTURES / name, None, "advise", ("train", "serve"))
    listed = {s.key: s for s in read.not_modelled}
    assert keys <= set(listed)
    assert all(s.why and s.value for s in read.not_modelled)


def test_every_fixture_names_its_source_on_its_first_line():
    for path in FIXTURES.iterdir():
        first = path.read_text().splitlines()[0]
        assert first.startswith("# Source: ") and "unmodified below this line" in first, path


def test_a_flag_typed_over_the_file_wins_and_the_answer_says_so(capsys):
    name = fixture("torchtune_llama3_1_8B_full_single_device.yaml")
    code, out, err = run(["train", "--config", name, "--batch", "8", "--on", "h100", "--json"],
                         capsys)
    assert code == 0, err
    obj = json.loads(out)
    assert obj["plan"]["batch"] == 8
    assert obj["config"]["overridden"] == [{"flag": "--batch 8", "setting": "batch_size: 2"}]
    assert "--batch 8" not in obj["config"]["flags"]
    code, text, _ = run(["train", "--config", name, "--batch", "8", "--on", "h100"], capsys)
    assert "typed:   --batch 8 over the file's batch_size: 2" in " ".join(text.split()) \
        or "--batch 8 over the file's batch_size: 2" in " ".join(text.split())


def test_a_setting_the_command_has_no_option_for_is_said_unused(capsys):
    code, out, err = run(["check", "--config", fixture("llama_server_function_calling.sh"),
                          "--on", "rtx-4090", "--json"], capsys)
    assert code == 0, err
    unused = json.loads(out)["config"]["not_used"]
    assert [u["flags"] for u in unused] == [["--weights q4_k_m"]]
    assert "check has no --weights" in unused[0]["why"]


def test_training_arguments_as_json_read_as_the_yaml(tmp_path, plans, capsys):
    name = "alignment-handbook_zephyr-7b-beta_sft_config_qlora.yaml"
    data = yaml.safe_load((FIXTURES / name).read_text())
    as_json = tmp_path / "training_args.json"
    as_json.write_text(json.dumps(data, indent=2))
    assert planned(["train", "--config", str(as_json), "--on", "h100"], plans, capsys) == \
        planned(["train", "--config", fixture(name), "--on", "h100"], plans, capsys)


def test_a_deepspeed_file_an_accelerate_config_names_is_read_beside_it(tmp_path, plans, capsys):
    (tmp_path / "ds.json").write_text(json.dumps(
        {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
         "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto"}))
    config = tmp_path / "accelerate.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                      "deepspeed_config:\n  deepspeed_config_file: ds.json\n"
                      "mixed_precision: bf16\nnum_processes: 4\n")
    assert planned(["train", "llama-3.2-1b", "--config", str(config), "--on", "h100"], plans,
                   capsys) == planned(["train", "llama-3.2-1b", "--gpus", "4", "--zero", "2",
                                       "--offload", "optimizer", "--dtype", "mixed-bf16",
                                       "--on", "h100"], plans, capsys)


def test_a_command_lines_environment_and_exports_are_read(tmp_path, plans, capsys):
    script = tmp_path / "serve.sh"
    script.write_text("#!/bin/sh\nexport PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
                      "CUDA_VISIBLE_DEVICES=0,1 VLLM_ATTENTION_BACKEND=FLASHINFER vllm serve \\\n"
                      "  gpt2 --max-model-len 1k --kv-cache-dtype fp8_e4m3  # the server\n")
    read = read_config(script, None, "infer", ("serve",))
    assert read.options == {"runtime": "vllm", "expandable_segments": True, "model": "gpt2",
                            "ctx": 1000, "kv_dtype": "fp8"}
    assert [s.key for s in read.no_effect] == ["CUDA_VISIBLE_DEVICES"]
    assert [s.key for s in read.not_modelled] == ["VLLM_ATTENTION_BACKEND"]
    assert planned(["infer", "--config", str(script), "--on", "h100"], plans, capsys) == \
        planned(["infer", "gpt2", "--runtime", "vllm", "--expandable-segments", "--ctx", "1000",
                 "--kv-dtype", "fp8", "--on", "h100"], plans, capsys)


def test_the_format_can_be_named_and_a_named_format_is_checked(tmp_path, capsys):
    read = read_config(FIXTURES / "vllm_serve_config.yaml", "vllm", "serve", ("serve",))
    assert read.options["model"] == "llama-3.1-8b"
    with pytest.raises(GpuwiseError, match="is a vllm command line, not"):
        read_config(FIXTURES / "vllm_serve_tp_pp.sh", "sglang", "serve", ("serve",))


BAD = [
    ("missing.yaml", None, "cannot read config file"),
    ("bad.yaml", "a: [1, 2\nb: 3\n", "is not valid YAML: line 2"),
    ("bad.json", '{"a": 1,}', "is not valid JSON: line 1"),
    ("unknown.yaml", "foo: 1\nbar: 2\n", "cannot tell which stack wrote"),
    ("list.yaml", "- a\n- b\n", "is neither a config"),
    ("empty.yaml", "\n", "is empty"),
    ("two.sh", "vllm serve gpt2\nvllm serve gpt2 --tp 2\n", "holds 2 server commands"),
]


@pytest.mark.parametrize(("name", "text", "says"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_file_is_one_error_line_and_exit_2(name, text, says, tmp_path, capsys):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    code, out, err = run(["serve", "gpt2", "--config", str(path), "--rate", "1"], capsys)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith("error: ") and says in lines[0], err
    assert len(lines) == 2 and lines[1].startswith("hint: ") and "Traceback" not in err


@pytest.mark.parametrize(("args", "says"), [
    (["serve", "--config", fixture("torchtune_llama3_1_8B_full_single_device.yaml"), "--rate",
      "1"], "describes a training run, which gpuwise serve does not estimate"),
    (["train", "--config", fixture("vllm_serve_tp_pp.sh")], "describes a server"),
    (["train", "gpt2", "--config", fixture("accelerate_fsdp.yaml"), "--config-format",
      "torchtun"], "unknown config format 'torchtun'"),
    (["train", "gpt2", "--config-format", "axolotl"], "no --config was given"),
])
def test_a_config_the_command_cannot_take_is_one_error_line(args, says, capsys):
    code, _, err = run(args, capsys)
    assert code == 2 and err.startswith("error: ") and says in err.splitlines()[0], err


def test_config_is_declared_once_on_every_command_that_takes_one():
    group = typer.main.get_command(app)
    assert isinstance(group, click.Group)
    helps = set()
    for name in ("train", "serve", "infer", "check", "advise"):
        opts = {o.opts[0]: o for o in group.commands[name].params if isinstance(o, click.Option)}
        assert {"--config", "--config-format"} <= set(opts), name
        helps.add((opts["--config"].help, opts["--config-format"].help))
    assert len(helps) == 1


def test_advise_reads_a_config_and_says_so(capsys):
    code, out, err = run(["advise", "--config", fixture("vllm_serve_config.yaml"),
                          "--requests-per-day", "1000", "--no-local", "--on", "h100", "--json"],
                         capsys)
    assert code == 0, err
    config = json.loads(out)["config"]
    assert config["stack"] == "vLLM (vllm serve)" and config["options"]["runtime"] == "vllm"


@pytest.mark.parametrize(("builder", "model"), [
    ("llama3_1_8b", "llama-3.1-8b"), ("lora_llama3_2_1b", "llama-3.2-1b"),
    ("qwen2_5_0_5b", "qwen2.5-0.5b"), ("qlora_llama3_1_70b", "llama-3.1-70b"),
    ("mistral_7b", "mistral-7b"), ("gemma2_2b", "gemma-2-2b"), ("qwen3_8b", "qwen3-8b"),
])
def test_torchtunes_builders_are_catalogue_models(builder, model):
    assert catalogue_id(builder_name(builder)) == model


@pytest.mark.parametrize(("name", "model"), [
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("/tmp/Meta-Llama-3.1-8B-Instruct/", "llama-3.1-8b"),
    ("checkpoints/meta-llama/Meta-Llama-3.1-8B", "llama-3.1-8b"),
    ("bartowski/Qwen2.5-7B-Instruct-GGUF", "qwen2.5-7b"),
    ("mistralai/Mistral-7B-v0.1", "mistral-7b"), ("someone/unknown-model", None),
])
def test_a_files_model_name_is_found_in_the_catalogue(name, model):
    assert catalogue_id(name) == model
