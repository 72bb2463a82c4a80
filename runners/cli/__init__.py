"""The `pathbench` command line: one module per command, each a thin layer over the library
(`pathbench.runners.training`, `.sweep`, `.analysis`, `.bench`).

Commands are imported only when invoked, so that `pathbench ls` answers without importing
torch. Every user error (a click usage error or a
pathbench.UserError) is printed as one line on stderr with exit status 2, never a traceback.
"""

from __future__ import annotations

import sys
import warnings

import click

from pathbench import UserError, __version__
from pathbench.registry import NameCollision


class LazyGroup(click.Group):
    """A click group whose subcommands are loaded on first use: ``lazy_commands`` maps each name
    to a function that imports the command and returns it (an import statement, which the
    layer test reads)."""

    def __init__(self, *args, lazy_commands: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands

    def list_commands(self, ctx):
        return sorted(self.lazy_commands)

    def get_command(self, ctx, name):
        return self.lazy_commands[name]() if name in self.lazy_commands else None


def _ls():
    from pathbench.runners.cli.catalog import ls
    return ls


def _data():
    from pathbench.runners.cli.catalog import data
    return data


def _run():
    from pathbench.runners.cli.run import run
    return run


def _sweep():
    from pathbench.runners.cli.sweep import sweep
    return sweep


def _results():
    from pathbench.runners.cli.results import results
    return results


def _plot():
    from pathbench.runners.cli.plot import plot
    return plot


def _inspect():
    from pathbench.runners.cli.inspect import inspect
    return inspect


def _construct():
    from pathbench.runners.cli.construct import construct
    return construct


def _bench():
    from pathbench.runners.cli.bench import bench
    return bench


@click.group(cls=LazyGroup, lazy_commands={
    "ls": _ls, "data": _data, "run": _run, "sweep": _sweep, "results": _results, "plot": _plot,
    "inspect": _inspect, "construct": _construct, "bench": _bench})
@click.version_option(__version__, prog_name="pathbench")
def cli():
    """pathbench: which attention can track state?"""


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, NameCollision):
        click.echo(f"pathbench: warning: {message}", err=True)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = warnings.showwarning


def main(argv: list[str] | None = None) -> None:
    warnings.showwarning = _one_line_warning
    try:
        cli.main(args=argv, prog_name="pathbench", standalone_mode=False)
    except (UserError, click.UsageError, click.BadParameter) as exc:
        message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        click.echo(f"pathbench: error: {' '.join(message.split())}", err=True)
        sys.exit(2)
    except click.ClickException as exc:  # e.g. a file that cannot be opened
        click.echo(f"pathbench: error: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(2)
    except click.Abort:
        click.echo("pathbench: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("pathbench: interrupted", err=True)
        sys.exit(130)
