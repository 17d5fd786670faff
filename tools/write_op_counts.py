"""Count the aten ops transformers dispatches per layer and per model, per family, and write
the counts to gpuwise/catalog/data/op_counts.json (or to the path given), which the time
model reads. See gpuwise/measure/profiles/op_counts.py for the method.

Run: .venv/bin/python tools/write_op_counts.py [OUT.json]   (needs torch and transformers)
"""

from __future__ import annotations

from catalog_data import write_data

from gpuwise.measure.profiles.op_counts import count_all


def main() -> None:
    data = count_all()
    target = write_data("op_counts.json", data)
    print(f"wrote {len(data['counts'])} op counts to {target}")


if __name__ == "__main__":
    main()
