"""Name -> object registries that built-ins fill by decorator and other packages by entry point.

One mechanism serves tasks (entry-point group ``pathbench.tasks``) and attention variants
(``pathbench.attention``). Plugins are discovered lazily: a plugin that fails to import breaks
only a lookup of its own name, with an error naming the plugin package. Built-in names win
collisions, so an installed package can never silently replace a built-in.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Callable

from pathbench import UserError

BUILTIN = "built-in"


class NameCollision(UserWarning):
    """A plugin registers a name that a built-in or an earlier plugin already has."""


@dataclass
class Entry:
    name: str
    origin: str  # "built-in" or the distribution name of the plugin package
    load: Callable[[], Any]


class Registry:
    """Names of subclasses of ``base``: built-ins are checked when registered, plugins when
    first looked up, so a plugin that names anything else is a one-line error naming it."""

    def __init__(self, kind: str, group: str, base: type):
        self.kind = kind  # "task" or "attention", used in messages
        self.group = group
        self.base = base
        self._builtins: dict[str, Entry] = {}
        self._plugins: dict[str, Entry] | None = None
        self._loaded: dict[str, Any] = {}

    def register(self, name: str):
        """Decorator for built-ins: ``@TASKS.register("flipflop")``."""

        def decorate(obj):
            if name in self._builtins:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            if not self._accepts(obj):
                raise TypeError(f"{self.kind} {name!r} is not a {self._base_name} subclass")
            self._builtins[name] = Entry(name, BUILTIN, lambda: obj)
            self._loaded[name] = obj
            return obj

        return decorate

    def _discover_plugins(self) -> dict[str, Entry]:
        if self._plugins is None:
            self._plugins = {}
            for ep in entry_points(group=self.group):
                origin = ep.dist.name if ep.dist is not None else ep.value
                taken = self._builtins.get(ep.name) or self._plugins.get(ep.name)
                if taken is not None:  # built-ins (and the first plugin seen) win collisions
                    owner = ("pathbench (built-in)" if taken.origin == BUILTIN
                             else f"plugin package {taken.origin!r}")
                    warnings.warn(f"plugin package {origin!r} registers {self.kind} "
                                  f"{ep.name!r}, which {owner} already registers; the name "
                                  f"stays {owner}'s", NameCollision, stacklevel=2)
                    continue
                self._plugins[ep.name] = Entry(ep.name, origin, ep.load)
        return self._plugins

    def entries(self) -> dict[str, Entry]:
        """Every registered name, built-ins first, without importing any plugin."""
        return {**self._builtins, **self._discover_plugins()}

    def names(self) -> list[str]:
        return list(self.entries())

    def get(self, name: str) -> Any:
        self._discover_plugins()  # once: a plugin that reuses a built-in's name is named then
        if name in self._loaded:
            return self._loaded[name]
        entries = self.entries()
        if name not in entries:
            raise UserError(
                f"unknown {self.kind} {name!r}; valid choices: {', '.join(sorted(entries))}"
            )
        entry = entries[name]
        try:
            obj = entry.load()
        except Exception as exc:  # any import-time failure of third-party code
            raise UserError(
                f"{self.kind} {name!r} from plugin package {entry.origin!r} failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not self._accepts(obj):
            raise UserError(f"{self.kind} {name!r} from plugin package {entry.origin!r} is not a "
                            f"{self._base_name} subclass (got {obj!r})")
        self._loaded[name] = obj
        return obj

    def _accepts(self, obj: Any) -> bool:
        return isinstance(obj, type) and issubclass(obj, self.base)

    @property
    def _base_name(self) -> str:
        package = ".".join(self.base.__module__.split(".")[:2])  # where it is exported
        return f"{package}.{self.base.__qualname__}"

    def origin(self, name: str) -> str:
        return self.entries()[name].origin
