"""pathbench: which attention can track state?

Synthetic expressivity benchmarks for position encodings in attention, built around PaTH
(data-dependent position encoding by accumulated Householder transformations). The code lives
in four subpackages: ``pathbench.tasks`` (data), ``pathbench.models`` (transformers),
``pathbench.kernels`` (attention functions) and ``pathbench.runners`` (training, sweeps,
results, plots, the command line). This core holds what they share: ``UserError``,
``pathbench.registry`` (names to classes, extended by entry points) and ``pathbench.settings``
(how a setting's value is read as its declared type).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pathbench")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"


class UserError(Exception):
    """Bad input from the user (unknown name, malformed option, invalid value, unusable path).

    The command line prints the message as one line and exits with status 2; the message must
    name the problem and, where there is a closed set, the valid choices.
    """
