"""A grid of runs over one task, and the sweep files that define grids.

The grid is the product of models x layers x heads x learning rates x seeds (x any ``--grid``
key). Every grid point is resolved up front, so a typo fails before anything runs.

A sweep file (TOML; the shipped ones are in runners/sweep/files/) holds ``[[sweep]]`` tables, one
grid each, whose keys are the `Grid` fields (``set`` for ``--set`` items), and may set ``out``,
``workers``, ``device`` and ``executor`` for the whole file and ``include`` other files. In a
file, ``lrs`` may also be a table from layer counts to their rates, ``{"1-3" = [1e-3], "4-6" =
[3e-4]}``: a depth search then trains each depth at the rates of its own layer count.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from pathbench import UserError
from pathbench.runners.training.config import (
    PRESETS,
    SECTIONS,
    parse_float_list,
    parse_int_list,
    parse_sets,
    Run,
    resolve_run,
)

SWEEPS_DIR = Path(__file__).parent / "files"
MAX_GRID_RUNS = 100_000  # the most runs one grid may plan: far above any real sweep


@dataclass
class Grid:
    """One grid of runs over a single task; None means the task's default."""

    task: str
    models: list[str] | None = None
    layers: list[int] | None = None
    heads: list[int] | None = None
    # the rates of every grid point, or (from a sweep file) per layer count
    lrs: list[float] | dict[int, list[float]] | None = None
    seeds: list[int] = field(default_factory=lambda: [0])
    d_model: int | None = None
    steps: int | None = None
    batch_size: int | None = None
    preset: str | None = None
    sets: list[str] = field(default_factory=list)
    grid: dict[str, list[str]] = field(default_factory=dict)  # "task.n_back" -> ["1", "2"]
    until_solved: bool = False
    # until_solved: a depth whose seeds disagree on val gets seeds added, up to this many
    max_seeds: int | None = None
    # until_solved: a depth cut short by its budget trains again with twice the steps, to this
    max_steps: int | None = None
    # runs trained as one model (those differing only in seed and lr); None: chosen per cell
    # (schedule.auto_pack_size)
    pack: int | None = None

    def runs(self, device: str) -> list[Run]:
        """Every grid point, resolved; duplicates (same run id) appear once."""
        for key in ("max_seeds", "max_steps"):
            if getattr(self, key) is not None and not self.until_solved:
                raise UserError(f"{key} extends a depth search; it needs until_solved")
        if self.max_seeds is not None and self.max_seeds < len(self.seeds):
            raise UserError(f"max_seeds ({self.max_seeds}) is below the {len(self.seeds)} seeds "
                            f"every depth runs")
        if self.until_solved:
            from pathbench.tasks import make_task

            if make_task(self.task).solved_threshold is None:
                raise UserError(f"until_solved needs a task with a solved threshold; "
                                f"{self.task!r} has none")
        if isinstance(self.lrs, dict):
            uncovered = sorted(set(self.layers or []) - set(self.lrs))
            if self.layers is None or uncovered:
                raise UserError(f"lrs by layer count gives no rates for "
                                f"{uncovered[0] if uncovered else 'the default'} layers; "
                                f"give every layer count of 'layers' its rates")
        extra_keys = list(self.grid)
        axes = [self.models or [None], self.layers or [None], self.heads or [None]]
        widest = max(len(self.rates(layers)) for layers in axes[1])
        size = widest * math.prod(len(axis) for axis in [*axes, self.seeds,
                                                         *self.grid.values()])
        if size > MAX_GRID_RUNS:
            raise UserError(f"the grid over {self.task} has {size:,} runs; a grid may have at "
                            f"most {MAX_GRID_RUNS:,}")
        on_both = sorted(set(self.grid) & {item.partition("=")[0].strip() for item in self.sets})
        if on_both:
            raise UserError(f"{on_both[0]} is both swept (--grid) and set (--set); give one")
        runs = {}
        points = (
            (model, layers, heads, lr, seed, *extra)
            for model, layers, heads in itertools.product(*axes)
            for lr in self.rates(layers)
            for seed, *extra in itertools.product(self.seeds,
                                                  *(self.grid[key] for key in extra_keys))
        )
        for model, layers, heads, lr, seed, *extra in points:
            sets = parse_sets([*self.sets, *(f"{k}={v}" for k, v in zip(extra_keys, extra))])
            run = resolve_run(
                self.task,
                options={"model": model, "layers": layers, "heads": heads, "lr": lr,
                         "d_model": self.d_model, "steps": self.steps,
                         "batch_size": self.batch_size},
                sets=sets, seed=seed, device=device, preset=self.preset,
            )
            if self.max_steps is not None and self.max_steps < run.train.steps:
                raise UserError(f"max_steps ({self.max_steps}) is below the {run.train.steps} "
                                f"steps every run trains")
            runs.setdefault(run.run_id, run)
        return list(runs.values())

    def rates(self, layers: int | None) -> list[float | None]:
        """The learning rates of the grid's points with ``layers`` layers (None: the preset's
        rate)."""
        return self.lrs[layers] if isinstance(self.lrs, dict) else self.lrs or [None]


def parse_grid_options(items) -> dict[str, list[str]]:
    """``["task.n_back=1,2,3"]`` -> ``{"task.n_back": ["1", "2", "3"]}``."""
    grid = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not _is_setting_key(key.strip()) or not values.strip():
            raise UserError(f"--grid expects SECTION.KEY=V1,V2,... with SECTION one of "
                            f"{', '.join(SECTIONS)}, got {item!r}")
        grid[key.strip()] = [value.strip() for value in values.split(",")]
    return grid


def _is_setting_key(key: str) -> bool:
    section, dot, name = key.partition(".")
    return bool(dot and name) and section in SECTIONS


@dataclass
class ConstructionEntry:
    """A model with set weights (``pathbench.models.constructions``) that a sweep scores beside
    its trained runs: the task's construction under these evaluation settings."""

    task: str
    preset: str | None = None
    sets: list[str] = field(default_factory=list)


FILE_KEYS = {"include", "sweep", "construct", "out", "workers", "device", "executor"}
TABLE_KEYS = {f.name for f in fields(Grid)} - {"sets"} | {"set"}
CONSTRUCT_KEYS = {"task", "preset", "set"}


def find_sweep_file(name: str) -> Path:
    """A path, or the name of a file shipped in runners/sweep/files/ (``paper``, ``flipflop.toml``)."""
    for candidate in (Path(name), SWEEPS_DIR / name, SWEEPS_DIR / f"{name}.toml"):
        if candidate.is_file():
            return candidate
    shipped = ", ".join(sorted(path.stem for path in SWEEPS_DIR.glob("*.toml")))
    raise UserError(f"sweep file {name!r} not found; shipped sweep files: {shipped}")


def load_sweep_file(path: Path, seen: tuple = ()) -> tuple[dict, list[Grid]]:
    """(top-level settings, grids) of a sweep file and the files it includes; the settings'
    "construct" lists the constructions ([[construct]] tables) of them all."""
    import tomllib

    path = Path(path).resolve()
    if path in seen:
        raise UserError(f"sweep file {path} includes itself")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"cannot read sweep file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"sweep file {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"sweep file {path} is not valid TOML: {exc}") from None
    unknown = set(data) - FILE_KEYS
    if unknown:
        raise UserError(f"sweep file {path}: unknown key {sorted(unknown)[0]!r}; valid keys: "
                        f"{', '.join(sorted(FILE_KEYS))}")
    settings = {key: data[key] for key in ("out", "workers", "device", "executor") if key in data}
    for key, value in settings.items():
        wanted = int if key == "workers" else str
        if isinstance(value, bool) or not isinstance(value, wanted) or value in ("", 0):
            kind = "a positive integer" if key == "workers" else "a non-empty string"
            raise UserError(f"sweep file {path}: {key} must be {kind}, got {value!r}")
    if not (isinstance(data.get("include", []), list)
            and all(isinstance(name, str) for name in data.get("include", []))):
        raise UserError(f"sweep file {path}: include must be a list of file names, got "
                        f"{data['include']!r}")
    for key in ("sweep", "construct"):
        if not isinstance(data.get(key, []), list):
            raise UserError(f"sweep file {path}: {key} must be [[{key}]] tables")
    grids, constructions = [], []
    for included in data.get("include", []):
        included_settings, included_grids = load_sweep_file(path.parent / included,
                                                            (*seen, path))
        constructions += included_settings.pop("construct")
        settings = {**included_settings, **settings}
        grids += included_grids
    for number, table in enumerate(data.get("sweep", []), start=1):
        grids.append(_grid_from_table(table, f"sweep file {path}, [[sweep]] #{number}"))
    for number, table in enumerate(data.get("construct", []), start=1):
        constructions.append(_construction_from_table(
            table, f"sweep file {path}, [[construct]] #{number}"))
    settings["construct"] = constructions
    if not grids:
        raise UserError(f"sweep file {path} defines no [[sweep]] table")
    return settings, grids


def _construction_from_table(table: dict, where: str) -> ConstructionEntry:
    if not isinstance(table, dict) or set(table) - CONSTRUCT_KEYS or "task" not in table:
        raise UserError(f"{where}: a [[construct]] table has a task, and may have preset and "
                        f"set; got {table!r}")
    sets, preset = table.get("set", []), table.get("preset")
    if not (isinstance(sets, list) and all(isinstance(item, str) for item in sets)):
        raise UserError(f'{where}: set must be a list like ["task.eval_lengths=4096"], got '
                        f"{sets!r}")
    if preset is not None and preset not in PRESETS:
        raise UserError(f"{where}: preset: unknown preset {preset!r}; valid choices: "
                        f"{', '.join(PRESETS)}")
    return ConstructionEntry(task=str(table["task"]), preset=preset, sets=sets)


def _grid_from_table(table: dict, where: str) -> Grid:
    unknown = set(table) - TABLE_KEYS
    if unknown:
        raise UserError(f"{where}: unknown key {sorted(unknown)[0]!r}; valid keys: "
                        f"{', '.join(sorted(TABLE_KEYS))}")
    if "task" not in table:
        raise UserError(f"{where}: 'task' is required")

    def listed(key):  # a TOML list or the command line's comma-separated text
        value = table.get(key)
        return None if value is None else ",".join(map(str, value)) if isinstance(
            value, list) else str(value)

    sets, grid_table = table.get("set", []), table.get("grid", {})
    if not (isinstance(sets, list) and all(isinstance(item, str) for item in sets)):
        raise UserError(f'{where}: set must be a list like ["task.length=64"], got {sets!r}')
    if not isinstance(grid_table, dict):
        raise UserError(f'{where}: grid must be a table like {{"task.n_back" = [1, 2]}}, '
                        f"got {grid_table!r}")
    by_layers = isinstance(table.get("lrs"), dict)
    grid = Grid(task=table["task"], lrs=_lrs_by_layers(table["lrs"], where) if by_layers else None)
    return apply_values(grid, f"{where}: ", models=listed("models"), layers=listed("layers"),
                  heads=listed("heads"), lrs=None if by_layers else listed("lrs"),
                  seeds=listed("seeds"),
                  d_model=table.get("d_model"), steps=table.get("steps"),
                  batch_size=table.get("batch_size"), preset=table.get("preset"),
                  sets=sets,
                  grid={key: [str(v) for v in (values if isinstance(values, list) else [values])]
                        for key, values in grid_table.items()},
                  until_solved=table.get("until_solved"), max_seeds=table.get("max_seeds"),
                  max_steps=table.get("max_steps"), pack=table.get("pack"))


def _lrs_by_layers(table: dict, where: str) -> dict[int, list[float]]:
    """``{"1-3": [1e-3], "4-6": [3e-4]}`` -> ``{1: [1e-3], 2: [1e-3], ..., 6: [3e-4]}``."""
    rates = {}
    for key, values in table.items():
        values = ",".join(map(str, values)) if isinstance(values, list) else str(values)
        for layers in parse_int_list(key, f"{where}: lrs key"):
            if layers in rates:
                raise UserError(f"{where}: lrs gives {layers} layers rates twice; give each "
                                f"layer count once")
            rates[layers] = parse_float_list(values, f"{where}: lrs for {key} layers")
    return rates


def apply_values(target: Grid, prefix: str, **values) -> Grid:
    """Set the given (not None) values on a grid, parsing the comma-separated list options.
    ``prefix`` + key names a value in messages: "--layers" or "sweep file F: layers"."""
    parsers = {
        "models": lambda text: [name.strip() for name in text.split(",") if name.strip()],
        "layers": lambda text: parse_int_list(text, f"{prefix}layers"),
        "heads": lambda text: parse_int_list(text, f"{prefix}heads"),
        "seeds": lambda text: parse_int_list(text, f"{prefix}seeds"),
        "lrs": lambda text: parse_float_list(text, f"{prefix}lrs"),
    }
    for key, value in values.items():
        if value is None:
            continue
        if key in parsers:
            value = parsers[key](value)
        elif key == "pack":
            if value != "auto" and (isinstance(value, bool) or not isinstance(value, int)
                                    or value < 1):
                raise UserError(f'{prefix}pack must be "auto" or an integer >= 1, got {value!r}')
            value = None if value == "auto" else value
        elif key in ("d_model", "steps", "batch_size", "max_seeds", "max_steps") and (
                isinstance(value, bool) or not isinstance(value, int)):
            raise UserError(f"{prefix}{key} must be an integer, got {value!r}")
        elif key == "preset" and value not in PRESETS:
            raise UserError(f"{prefix}preset: unknown preset {value!r}; valid choices: "
                            f"{', '.join(PRESETS)}")
        elif key == "until_solved" and not isinstance(value, bool):
            raise UserError(f"{prefix}until_solved must be true or false, got {value!r}")
        elif key == "grid" and not all(_is_setting_key(name) for name in value):
            raise UserError(f"{prefix}grid keys must be SECTION.KEY with SECTION one of "
                            f"{', '.join(SECTIONS)}, got {', '.join(value)}")
        setattr(target, key, value)
    return target
