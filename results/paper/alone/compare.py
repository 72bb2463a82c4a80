"""The published sweep (results/paper/runs, trained in packs) against the same configurations
trained one run at a time (results/paper/alone/runs), run by run and cell by cell; its output
is compare.md.

Run from the repository root:
    python3 results/paper/alone/compare.py > results/paper/alone/compare.md
Runs are matched by run id, which names the whole configuration including the seed.
"""

from pathlib import Path

import pandas as pd

from pathbench.kernels import VARIANTS
from pathbench.runners.report import aggregate, load_frame

ALONE, PACKED = Path("results/paper/alone/runs"), Path("results/paper/runs")


def headline(frame: pd.DataFrame) -> pd.Series:
    """Each run's primary metric on its first evaluation split (flip-flop: test error)."""
    values = []
    for _, row in frame.iterrows():
        metric = "error" if row["task"] == "flipflop" else row["primary_metric"]
        values.append(row[f"{row['splits'][0]}:{metric}"])
    return pd.Series(values, index=frame.index)


def main():
    alone, packed = load_frame(ALONE), load_frame(PACKED)
    both = alone.merge(packed, on="run_id", suffixes=("_alone", "_packed"))
    both["alone"] = headline(alone.set_index("run_id").loc[both["run_id"]].reset_index())
    both["packed"] = headline(packed.set_index("run_id").loc[both["run_id"]].reset_index())
    print(f"{len(packed)} runs published (flip-flop and word problems trained in packs, MQRAR "
          f"alone), {len(both)} of them also in alone/.\n")
    print("| task | runs | same stopping step | mean abs. difference | largest | runs within 0.01 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for task, runs in both.groupby("task_alone"):
        difference = (runs["packed"] - runs["alone"]).abs()
        same_steps = int((runs["steps_alone"] == runs["steps_packed"]).sum())
        print(f"| {task} | {len(runs)} | {same_steps} | {difference.mean():.3f} | "
              f"{difference.max():.3f} | {int((difference <= 0.01).sum())} |")
    print("\n(flip-flop: test read error in %; word problems: test accuracy.)\n")

    print("Mean over seeds at the best learning rate, alone / published:\n")
    for task in ("a5", "z60"):
        cells = {}
        for name, frame in (("alone", alone), ("packed", packed)):
            table = aggregate(frame[frame["task"] == task])
            for _, row in table.iterrows():
                cells.setdefault((row["model"], row["layers"]), {})[name] = row["test"]
        layers = sorted({depth for _, depth in cells})
        print(f"| {task} | " + " | ".join(str(depth) for depth in layers) + " |")
        print("| --- |" + " --- |" * len(layers))
        for model in VARIANTS:
            entries = []
            for depth in layers:
                cell = cells.get((model, depth), {})
                entries.append(" / ".join(f"{cell[name]:.3f}" if name in cell else "-"
                                          for name in ("alone", "packed")))
            print(f"| {model} | " + " | ".join(entries) + " |")
        print()


if __name__ == "__main__":
    main()
