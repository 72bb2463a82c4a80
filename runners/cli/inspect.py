"""`pathbench inspect RUN_DIR`: draw the attention maps of a trained model
(`pathbench.runners.analysis.attention_maps`)."""

from __future__ import annotations

from pathlib import Path

import click
from matplotlib.backend_bases import FigureCanvasBase

from pathbench import UserError
from pathbench.files import check_writable, write_atomic


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Picture path, in the format its suffix names (default RUN_DIR/attention.png).")
@click.option("--split", default=None, help="Evaluation split of the example (default: first).")
@click.option("--example", type=int, default=0, show_default=True,
              help="Which example of the split.")
@click.option("--tokens", type=int, default=64, show_default=True,
              help="Positions shown (the first N of the example).")
def inspect(run_dir, output, split, example, tokens):
    """Draw the attention maps of every head of the model in RUN_DIR on one example."""
    from pathbench.runners.analysis.attention_maps import attention_figure

    output = output or run_dir / "attention.png"
    if not output.suffix:
        output = output.with_suffix(".png")
    picture_format = output.suffix[1:].lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if picture_format not in formats:
        raise UserError(f"cannot draw {str(output)!r}: unknown picture format {output.suffix!r}; "
                        f"valid: {', '.join('.' + f for f in sorted(formats))}")
    check_writable(output.parent, "the picture's folder")
    figure = attention_figure(run_dir, split, example, tokens)
    write_atomic(output, lambda file: figure.savefig(file, format=picture_format, dpi=200,
                                                         bbox_inches="tight", pad_inches=0.05))
    click.echo(f"wrote {output}")
