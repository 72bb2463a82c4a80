#!/usr/bin/env bash
# Every table and figure of results/families/ from its archive of run records, with pathbench's
# own commands only:
#   bash results/families/regenerate.sh [OUT]      # OUT: results/families itself unless given
# runs.csv is the records table of runs.tar.xz (results/records.sh writes it); the tables and
# figures are drawn from runs.csv alone. `plot` also writes a PDF of each figure, not kept.
source "$(dirname "$0")/../records.sh"
pathbench results runs.csv --task flipflop --metric error --format markdown > flipflop_error.md
pathbench plot runs.csv --task flipflop -o flipflop > /dev/null
pathbench plot runs.csv --task a5 -o a5 > /dev/null
rm -f ./*.pdf
