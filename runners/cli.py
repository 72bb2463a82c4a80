"""The `pathbench` command line.

Commands live in the modules that own their work and are imported only when invoked, so that
`pathbench ls` answers without importing torch. Every user error (a click usage error or a
pathbench.UserError) is printed as one line on stderr with exit status 2, never a traceback.
"""

from __future__ import annotations

import importlib
import sys

import click

from pathbench import UserError, __version__


class LazyGroup(click.Group):
    """A click group whose subcommands are "module:attribute" strings, imported on first use."""

    def __init__(self, *args, lazy_commands: dict[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands

    def list_commands(self, ctx):
        return sorted(self.lazy_commands)

    def get_command(self, ctx, name):
        if name not in self.lazy_commands:
            return None
        module_name, attribute = self.lazy_commands[name].split(":")
        return getattr(importlib.import_module(module_name), attribute)


@click.group(
    cls=LazyGroup,
    lazy_commands={
        "ls": "pathbench.runners.catalog:ls",
        "data": "pathbench.runners.catalog:data",
        "run": "pathbench.runners.run:run",
        "sweep": "pathbench.runners.sweep:sweep",
        "results": "pathbench.runners.report:results",
        "plot": "pathbench.runners.figures:plot",
        "inspect": "pathbench.runners.inspect:inspect",
        "bench": "pathbench.runners.cli:bench",
    },
)
@click.version_option(__version__, prog_name="pathbench")
def cli():
    """pathbench: which attention can track state?"""


@click.group(
    cls=LazyGroup,
    lazy_commands={
        "data": "pathbench.tasks.bench:bench_data",
        "torch": "pathbench.kernels.bench_torch:bench_torch",
        "kernel": "pathbench.kernels.bench_kernel:bench_kernel",
    },
)
def bench():
    """Benchmarks that print tables (speed and memory are measured here, never asserted)."""


def main(argv: list[str] | None = None) -> None:
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


if __name__ == "__main__":
    main()
