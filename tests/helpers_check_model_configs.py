"""Check the embedded model catalogue against transformers (a plain script, not a test).

For every entry of gpuwise/catalog/data/models.toml this builds the model from its config.json
with transformers on the meta device (no weights are allocated, nothing is downloaded), counts
its parameters and compares the count with the entry's published_params. It prints a table and
exits non-zero when a published count disagrees or a config fails to build.

    python tests/helpers_check_model_configs.py            # every model
    python tests/helpers_check_model_configs.py gpt2 phi-2 # some of them

Needs torch and transformers (the `torch` extra). Run from anywhere.
"""

from __future__ import annotations

import json
import sys
import tomllib
import warnings
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "gpuwise" / "catalog" / "data"


def build_param_count(config: dict) -> int:
    """transformers' count; for a vision-language config (llama4, gemma3, mistral3), its
    language model's (text_config), which is what gpuwise counts."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if "text_config" in config and "hidden_size" not in config:
        config = config["text_config"]
    cfg = CONFIG_MAPPING[config["model_type"]](**{k: v for k, v in config.items()
                                                   if k != "model_type"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors count once


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        print("transformers is not installed: pip install -e '.[torch]'", file=sys.stderr)
        return 2

    entries = tomllib.loads((DATA / "models.toml").read_text())["model"]
    wanted = set(argv)
    if wanted:
        entries = [e for e in entries if e["id"] in wanted]
        missing = wanted - {e["id"] for e in entries}
        if missing:
            print(f"unknown ids: {', '.join(sorted(missing))}", file=sys.stderr)
            return 2

    print(f"transformers {transformers.__version__}")
    header = f"{'id':<20} {'family':<12} {'built params':>17} {'published':>17}  match"
    print(header)
    print("-" * len(header))
    failures = unverified = 0
    for entry in entries:
        config = json.loads((DATA / "models" / entry["config"]).read_text())
        published = int(entry.get("published_params", 0))
        problems = []
        if "auto_map" in config:
            problems.append("config has auto_map")
        model_type = config.get("model_type")
        if model_type != entry["family"]:
            problems.append(f"family {entry['family']!r} != model_type {model_type!r}")
        try:
            built = build_param_count(config)
            built_s = f"{built:,}"
        except Exception as exc:  # report and go on with the others
            built, built_s = None, "ERROR"
            problems.append(f"{type(exc).__name__}: {exc}"[:200])
        if built is None or problems:
            verdict = "FAIL"
        elif not published:
            verdict = "unverified (no published count)"
        elif built == published:
            verdict = "yes"
        else:
            verdict = f"NO (diff {built - published:+,})"
        failures += verdict.startswith(("FAIL", "NO"))
        unverified += verdict.startswith("unverified")
        pub_s = f"{published:,}" if published else "-"
        print(f"{entry['id']:<20} {entry['family']:<12} {built_s:>17} {pub_s:>17}  {verdict}")
        for p in problems:
            print(f"    {p}")
    print("-" * len(header))
    print(f"{len(entries)} models: {len(entries) - failures - unverified} match, "
          f"{unverified} without a published count, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
