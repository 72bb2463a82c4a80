"""`pathbench bench train`: run-steps a second of the trainer, this tree's and another's.

A run-step is one optimizer step of one run; a pack of E runs makes E run-steps a step. Each
measurement trains a pack through the library's loop (`pathbench.runners.training.loop.train`),
with a validation check every ``interval`` steps on a single sequence, and reads the time per
step from the curve: the time between the first and the last check over the steps between them.
Compilation, CUDA-graph capture and the first checks fall before the first point, so they are
left out; the small checks in between stay in. Also recorded: the GPU memory each run takes at
its peak, and the model's arithmetic as a fraction of the device's own bf16 (CPU: float32)
matrix-multiply rate, measured in the same process.

`--against REV` measures the engine of git revision REV the same way, side by side: its tree is
unpacked from git (``git archive``) into a temporary folder, and the same measuring function
(this module's `measure`, run as a script) imports pathbench from there. REV may also be a
folder holding such a tree (for a machine without the repository's history). REV must have
the library layout this tree has (``pathbench.runners.training``).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pathbench import UserError


@dataclass(frozen=True)
class Shape:
    """What one run trains: a task setting and a model size."""

    task: str
    task_config: dict
    layers: int
    heads: int
    d_model: int
    batch: int


def _word_problems(length: int) -> dict[str, Shape]:
    return {f"a5-{length}-L{layers}": Shape("a5", {"length": length}, layers, 4, 128, 256)
            for layers in range(1, 7)}


# The shapes of the paper sweep (runners/sweep/files/), and one small enough for a CPU.
SHAPES = {
    "flipflop-L1": Shape("flipflop", {"length": 512}, 1, 2, 64, 64),
    "flipflop-L2": Shape("flipflop", {"length": 512}, 2, 2, 64, 64),
    **_word_problems(12),
    **_word_problems(32),
    "mqrar-2": Shape("mqrar", {"n_back": 2}, 2, 2, 256, 64),
    "smoke": Shape("flipflop", {"length": 16}, 1, 2, 16, 8),
}


def matmul_rate(device) -> float:
    """FLOP/s of a large square matrix product on ``device`` (bf16 on CUDA, float32 else)."""
    import torch

    cuda = device.type == "cuda"
    size, repeats = (8192, 20) if cuda else (512, 5)
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    a @ a  # warm-up
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ a
    if cuda:
        torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def flops_per_run_step(model, shape: Shape, length: int) -> float:
    """The arithmetic of one run's training step, forward and backward: 6 per weight per token,
    and 6 T^2 d per layer for the causal attention's two products."""
    weights = sum(p.numel() for name, p in model.named_parameters() if "embed" not in name)
    tokens = shape.batch * length
    return 6 * weights * tokens + 6 * shape.layers * shape.batch * length**2 * shape.d_model


def build_pack(shape: Shape, attention: str, pack: int, backend: str = "auto"):
    """(task, the ``pack`` models, seeded 0 onwards, and the model that trains them: their pack,
    or the one model). ``backend`` is the models' ``model.backend`` setting."""
    import torch

    from pathbench.models import build_model, model_config
    from pathbench.models.pack import pack_models
    from pathbench.tasks import make_task

    task = make_task(shape.task, shape.task_config)
    models = []
    for seed in range(pack):
        torch.manual_seed(seed)
        models.append(build_model(model_config({
            "attention": attention, "layers": shape.layers, "heads": shape.heads,
            "d_model": shape.d_model, "vocab_size": len(task.vocab), "backend": backend})))
    return task, models, pack_models(models) if pack > 1 else models[0]


def measure(shape: Shape, attention: str, pack: int, steps: int, interval: int,
            device: str) -> dict:
    """Train a pack of ``pack`` runs for ``steps`` steps; run-steps a second from the time
    between the first and last validation check, peak memory per run, arithmetic rate."""
    import torch

    from pathbench.runners.training.config import train_config
    from pathbench.runners.training.loop import Member, train

    device = torch.device(device)
    task, models, model = build_pack(shape, attention, pack)
    settings = train_config({"steps": steps, "batch_size": shape.batch, "warmup": 0,
                             "eval_every": interval, "eval_num": 1, "early_stop": None})
    curves = [[] for _ in range(pack)]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    train(model, task, settings, [Member(seed, 1e-4, curves[seed]) for seed in range(pack)],
          device, progress=False)
    first, last = curves[0][0], curves[0][-1]
    seconds_per_step = (last["elapsed_s"] - first["elapsed_s"]) / (last["step"] - first["step"])
    length = task.generate(1, 0, "train").inputs.shape[1]
    memory = (torch.cuda.max_memory_allocated(device) / pack / 2**20
              if device.type == "cuda" else None)
    return {"run_steps_per_s": pack / seconds_per_step, "ms_per_run_step":
            1e3 * seconds_per_step / pack, "memory_mb_per_run": memory,
            "flops_per_s": pack * flops_per_run_step(models[0], shape, length)
            / seconds_per_step}


def _measure_all(plan: dict) -> list[dict]:
    """Every measurement of ``plan`` (its "todo": [shape, attention, pack] triples; steps,
    interval, device), in this process, with the device's matmul rate."""
    import torch

    rate = matmul_rate(torch.device(plan["device"]))
    rows = []
    for name, attention, pack in plan["todo"]:
        row = {"shape": name, "attention": attention, "pack": pack}
        try:
            row.update(measure(Shape(**plan["shape_of"][name]), attention, pack,
                               plan["steps"], plan["interval"], plan["device"]))
            row["fraction_of_matmul_rate"] = row["flops_per_s"] / rate
        except Exception as exc:  # out of memory at a large pack, say: the row says so
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            if "out of memory" in str(exc).lower():
                torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _tree_of(revision: str, folder: Path) -> Path:
    """Revision ``revision`` of this git checkout, unpacked into ``folder``, or the checkout in
    the folder ``revision`` (one without git, say), laid out as the package ``pathbench`` (its
    top-level folders as subpackages); the folder to import from."""
    tree = Path(revision)
    if not (tree / "pathbench" / "__init__.py").is_file():
        root = Path(__file__).resolve().parents[2]
        archive = subprocess.run(["git", "archive", "--format=tar", revision], cwd=root,
                                 capture_output=True, check=False)
        if archive.returncode:
            raise UserError(f"--against {revision}: neither a folder holding a pathbench "
                            f"checkout nor a revision git can archive: "
                            f"{archive.stderr.decode().strip().splitlines()[-1]}")
        tree = folder / "tree"
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tree, filter="data")
    tree = tree.resolve()
    package = folder / "site" / "pathbench"
    package.mkdir(parents=True)
    for path in (tree / "pathbench").iterdir():
        (package / path.name).symlink_to(path)
    for sub in ("tasks", "models", "kernels", "runners"):
        (package / sub).symlink_to(tree / sub)
    return folder / "site"


def run_engine(plan: dict, site: Path | None, echo, measured) -> list[dict]:
    """`_measure_all` in a fresh Python process, importing pathbench from ``site`` (None: this
    installation); each row is echoed and handed to ``measured`` as it comes."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    # -P: the script's folder stays off sys.path, so only ``site`` provides pathbench
    command = [sys.executable, "-P", __file__, json.dumps(plan)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True,
                               cwd=tempfile.gettempdir())
    rows = []
    for line in process.stdout:
        rows.append(json.loads(line))
        measured(rows[-1])
        echo(f"  {rows[-1]['shape']} {rows[-1]['attention']} pack {rows[-1]['pack']}: "
             + (rows[-1].get("error") or f"{rows[-1]['run_steps_per_s']:,.0f} run-steps/s"))
    if process.wait():
        raise UserError(f"the measuring process failed (exit status {process.returncode})")
    return rows


def bench_train(shapes, attentions, packs, steps, interval, device, against, out, echo=print):
    """Measure this tree's engine (and ``against``'s), print the table, write it as CSV.

    With ``out``, each row is written as soon as it is measured, and the rows ``out`` already
    holds (without an error) are kept and not measured again: a table too long for one sitting
    is finished by running the same command again. Rows of other shapes, attentions, packs or
    engines stay in ``out`` as they were, so that several commands fill one table."""
    from pathbench.files import write_text_atomic

    wanted = [(name, attention, pack) for name in shapes for attention in attentions
              for pack in packs]
    engines = {"new": [], **({"old": []} if against else {})}
    others = {}  # out's rows that this command neither measures nor keeps, by engine
    if out is not None and Path(out).exists():
        for row in read_csv_rows(Path(out)):
            engine = row.pop("engine")
            key = (row["shape"], row["attention"], row["pack"])
            if engine in engines and key in wanted:
                if not row.get("error"):  # an error is measured again
                    engines[engine].append(row)
            else:
                others.setdefault(engine, []).append(row)

    def write() -> None:
        if out is not None:
            merged = {engine: list(rows) for engine, rows in others.items()}
            for engine, rows in engines.items():
                merged.setdefault(engine, []).extend(rows)
            write_text_atomic(Path(out), csv_rows(merged))

    def measured(engine: str):
        def keep(row: dict) -> None:
            engines[engine].append(row)
            write()
        return keep

    with tempfile.TemporaryDirectory() as folder:
        site = _tree_of(against, Path(folder)) if against else None  # fails before measuring
        for engine, where in (("new", None), ("old", site)):
            if engine not in engines:
                continue
            done = {(r["shape"], r["attention"], r["pack"]) for r in engines[engine]}
            todo = [key for key in wanted if key not in done]
            kept = f" ({len(done)} kept from {out})" if done else ""
            echo(f"{'this tree' if where is None else against}, {device}{kept}:")
            if todo:
                plan = {"todo": todo, "steps": steps, "interval": interval, "device": device,
                        "shape_of": {name: asdict(SHAPES[name]) for name in shapes}}
                run_engine(plan, where, echo, measured(engine))
    order = {key: number for number, key in enumerate(wanted)}
    for rows in engines.values():
        rows.sort(key=lambda r: order.get((r["shape"], r["attention"], r["pack"]), len(order)))
    table = render_table(engines)
    echo(table)
    if out is not None:
        write()
        echo(f"wrote {out}")
    return engines


COLUMNS = ("run_steps_per_s", "ms_per_run_step", "memory_mb_per_run", "fraction_of_matmul_rate")


def _cell(value, digits=3) -> str:
    return "" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def render_table(engines: dict[str, list[dict]]) -> str:
    """A markdown table: a row per measurement, each engine's figures, and new / old."""
    header = ["shape", "attention", "pack"]
    for engine in engines:
        header += [f"{engine}: {column}" for column in COLUMNS]
    if "old" in engines:
        header.append("new / old run-steps/s")
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    old = {(r["shape"], r["attention"], r["pack"]): r for r in engines.get("old", [])}
    for row in engines["new"]:
        key = (row["shape"], row["attention"], row["pack"])
        cells = [*map(str, key)]
        for engine in engines:
            found = row if engine == "new" else old.get(key, {})
            cells += ([found["error"]] + [""] * (len(COLUMNS) - 1) if "error" in found
                      else [_cell(found.get(column)) for column in COLUMNS])
        if "old" in engines:
            both = row.get("run_steps_per_s"), old.get(key, {}).get("run_steps_per_s")
            cells.append(f"{both[0] / both[1]:.2f}" if None not in both else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def read_csv_rows(path: Path) -> list[dict]:
    """The rows `csv_rows` wrote: numbers as numbers, empty cells left out."""
    import csv

    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    numbers = {"pack": int, **{column: float for column in COLUMNS}}
    return [{key: numbers.get(key, str)(value) for key, value in row.items() if value != ""}
            for row in rows]


def csv_rows(engines: dict[str, list[dict]]) -> str:
    columns = ["engine", "shape", "attention", "pack", *COLUMNS, "error"]
    lines = [",".join(columns)]
    for engine, rows in engines.items():
        for row in rows:
            values = {"engine": engine, **row}
            lines.append(",".join(_cell(values.get(c), 6).replace(",", ";") for c in columns))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # run by run_engine, with pathbench importable from the tree measured
    _measure_all(json.loads(sys.argv[1]))
