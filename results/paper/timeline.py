"""When each part of the published sweep ran on the GPU (its output is timeline.md).

Run from the repository root:
    python3 results/paper/timeline.py > results/paper/timeline.md
Reads each record's start time and wall time (provenance) under results/paper/runs; times are
seconds from the first run's start.
"""

from datetime import datetime
from pathlib import Path

from pathbench.kernels import VARIANTS
from pathbench.runners.store import find_run_dirs, read_result

RUNS = Path("results/paper/runs")


def main():
    spans = []
    for run_dir in find_run_dirs(RUNS):
        record = read_result(run_dir)
        config, provenance = record["config"], record["provenance"]
        start = datetime.fromisoformat(provenance["started_at"]).timestamp()
        spans.append((config["task"]["name"], config["model"]["attention"],
                      config["model"]["layers"], start, start + provenance["wall_time_s"]))
    origin = min(span[3] for span in spans)
    spans = [(task, model, layers, start - origin, end - origin)
             for task, model, layers, start, end in spans]
    print(f"{len(spans)} runs; the last ends at {max(span[4] for span in spans):.0f} s.\n")
    print("| task | runs | first start (s) | last end (s) |")
    print("| --- | --- | --- | --- |")
    for task in ("flipflop", "a5", "z60", "mqrar"):
        own = [span for span in spans if span[0] == task]
        print(f"| {task} | {len(own)} | {min(s[3] for s in own):.0f} | {max(s[4] for s in own):.0f} |")
    for task in ("a5", "z60"):
        print(f"\n{task}: each model's packs, layers: start-end (s)\n")
        print("| model | " + " | ".join(str(layers) for layers in range(1, 7)) + " |")
        print("| --- |" + " --- |" * 6)
        for model in VARIANTS:
            cells = []
            for layers in range(1, 7):
                own = [s for s in spans if s[:3] == (task, model, layers)]
                cells.append(f"{min(s[3] for s in own):.0f}-{max(s[4] for s in own):.0f}"
                             if own else "-")
            print(f"| {model} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
