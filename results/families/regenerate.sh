#!/usr/bin/env bash
# Every table and figure of results/families/ from its archive of run records, with pathbench's
# own commands only:
#   bash results/families/regenerate.sh [OUT]      # OUT: results/families itself unless given
# runs.csv is the records table of runs.tar.xz (a row per run, every column); the tables and
# figures are drawn from runs.csv alone. `plot` also writes a PDF of each figure, not kept.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(mkdir -p "${1:-$here}" && cd "${1:-$here}" && pwd)
cd "$here"  # run directories are named runs.tar.xz/families/... in runs.csv
pathbench results runs.tar.xz --format records > "$out/runs.csv.tmp"
mv "$out/runs.csv.tmp" "$out/runs.csv"
cd "$out"
pathbench results runs.csv --task flipflop --metric error --format markdown > flipflop_error.md
pathbench plot runs.csv --task flipflop -o flipflop > /dev/null
pathbench plot runs.csv --task a5 -o a5 > /dev/null
rm -f ./*.pdf
