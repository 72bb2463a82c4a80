# Sourced by an experiment's regenerate.sh, with its arguments: the folder OUT (the first of
# them, else the experiment's own folder) gets runs.csv, the records table of the experiment's
# runs.tar.xz (a row per run, every column), and the script goes on in OUT.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
out=$(mkdir -p "${1:-$here}" && cd "${1:-$here}" && pwd)
cd "$here"  # run directories are named runs.tar.xz/NAME/... in runs.csv
pathbench results runs.tar.xz --format records > "$out/runs.csv.tmp"
mv "$out/runs.csv.tmp" "$out/runs.csv"
cd "$out"
