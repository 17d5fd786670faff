"""Measure what transformers keeps for backward, per family, and write the profiles to
gpuwise/catalog/data/activation_profiles.json (or to the path given), which the training
memory estimate reads. See gpuwise/measure/profiles/activations.py for the method.

Run: .venv/bin/python tools/write_activation_profiles.py [OUT.json]   (needs torch and
transformers; about a minute on a CPU)
"""

from __future__ import annotations

from catalog_data import write_data

from gpuwise.measure.profiles.activations import profile_all


def main() -> None:
    data = profile_all()
    target = write_data("activation_profiles.json", data)
    print(f"wrote {len(data['profiles'])} profiles to {target}")


if __name__ == "__main__":
    main()
