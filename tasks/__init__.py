"""Tasks: sequence generators with strict configurations, found by name in a registry.

`make_task(name, overrides)` returns a configured `Task`; `TASKS` lists every registered task,
the built-ins below and those of installed packages that declare an entry point in the group
``pathbench.tasks`` (the value names a `Task` subclass, e.g. ``parity = "my_pkg:Parity"``).
"""

from pathbench.tasks.base import (
    IGNORE_INDEX,
    PRESETS,
    TASKS,
    Dataset,
    Task,
    default_config,
    make_task,
    option,
)

# Importing the built-in task modules registers them.
from pathbench.tasks import flipflop, word_problems, mqrar  # noqa: E402,F401  isort: skip

__all__ = ["IGNORE_INDEX", "PRESETS", "TASKS", "Dataset", "Task", "default_config", "make_task", "option"]
