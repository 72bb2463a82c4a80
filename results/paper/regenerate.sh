#!/usr/bin/env bash
# Every table and figure of results/paper/ from its archive of run records, with pathbench's
# own commands only:
#   bash results/paper/regenerate.sh [OUT]      # OUT: results/paper itself unless given
# runs.csv is the records table of runs.tar.xz (results/records.sh writes it); the tables and
# figures are drawn from runs.csv alone. `plot` also writes a PDF of each figure, not kept.
source "$(dirname "$0")/../records.sh"
pathbench results runs.csv --task flipflop --metric error --format markdown > flipflop_error.md
pathbench plot runs.csv --task flipflop --layers 1 -o flipflop > /dev/null  # Table 1: one layer
for task in mqrar a4xz5 z60; do
  pathbench plot runs.csv --task $task -o $task > /dev/null
done
pathbench plot runs.csv --task a5 --heads 4 -o a5 > /dev/null  # the ladders; the heads grid apart
pathbench plot runs.csv --task a5 --model rope,path --where task.length=16 \
  --where task.words=elements -o a5_heads > /dev/null
rm -f ./*.pdf
