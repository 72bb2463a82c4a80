#!/usr/bin/env bash
# Every table and figure of results/paper/ from its archive of run records, with pathbench's
# own commands only:
#   bash results/paper/regenerate.sh [OUT]      # OUT: results/paper itself unless given
# runs.csv is the records table of runs.tar.xz (a row per run, every column); the tables and
# figures are drawn from runs.csv alone. `plot` also writes a PDF of each figure, not kept.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(mkdir -p "${1:-$here}" && cd "${1:-$here}" && pwd)
cd "$here"  # run directories are named runs.tar.xz/paper/... in runs.csv
pathbench results runs.tar.xz --format records > "$out/runs.csv.tmp"
mv "$out/runs.csv.tmp" "$out/runs.csv"
cd "$out"
pathbench results runs.csv --task flipflop --metric error --format markdown > flipflop_error.md
pathbench plot runs.csv --task flipflop --layers 1 -o flipflop > /dev/null  # Table 1: one layer
for task in mqrar a4xz5 z60; do
  pathbench plot runs.csv --task $task -o $task > /dev/null
done
pathbench plot runs.csv --task a5 --heads 4 -o a5 > /dev/null  # the ladders; the heads grid apart
pathbench plot runs.csv --task a5 --model rope,path --where task.length=16 \
  --where task.words=elements -o a5_heads > /dev/null
rm -f ./*.pdf
