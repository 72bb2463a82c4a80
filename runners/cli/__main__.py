"""`python -m pathbench.runners.cli`: the `pathbench` command."""

from pathbench.runners.cli import main

main()
