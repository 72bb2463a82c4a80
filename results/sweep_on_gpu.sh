#!/usr/bin/env bash
# A shipped sweep file on a GPU machine reached by commands of at most ten minutes each:
#   bash results/sweep_on_gpu.sh NAME start 560   # the first command
#   bash results/sweep_on_gpu.sh NAME wait 590    # each later one, before the machine is idle
# NAME is the sweep file (paper, families, ...). `start` installs pathbench, starts CUDA MPS (so
# that the sweep's worker processes run their kernels on the GPU at the same time instead of
# taking turns) and starts the one command
#   pathbench sweep --file NAME
# in its own process session, which outlives the call while the machine is held; `start` and
# `wait` then follow it for their SECONDS. Each call returns the records so far as
# $OUT/runs.tgz (without weights, in a folder NAME-runs) and the sweep's log as $OUT/sweep.log.
# The records live outside the working tree (LIVE), which each call copies over again; RUNS,
# when set, names a folder of earlier records of this sweep that seeds them, so that a sweep cut
# off with its machine resumes on the next machine from the records unpacked there. SHARE names
# another sweep's records: those of runs this sweep also plans are copied in, so that a run two
# sweeps share trains once. The log's "==" lines time each part: the sweep's start, each
# call's end while it runs, its exit.
set -o pipefail
source "$(dirname "$0")/mps.sh"
export PYTHONUNBUFFERED=1
name=${1:?the sweep file: paper, families, ...}
mode=${2:?start or wait}
budget=${3:-560}
live=/tmp/$name-runs
log=/tmp/$name-sweep.log
sweep=(python3 -m pathbench.runners.cli sweep --file "$name" --out "$live")
begin=$(date +%s)

if [ "$mode" = start ]; then
  python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 4
  mkdir -p $live
  [ -n "${RUNS:-}" ] && [ -d "$RUNS" ] && cp -a "$RUNS"/. $live/
  if [ -n "${SHARE:-}" ] && [ -d "$SHARE" ]; then
    for run in $("${sweep[@]}" --dry-run 2>/dev/null | awk '$1 == "todo" {print $2}'); do
      [ -f "$SHARE/$run/result.json" ] && cp -a "$SHARE/$run" $live/
    done
  fi
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    git log -1 --format='tree of commit %H'; git status --short | head; date -u; } >>$log 2>&1
  mps on >>$log 2>&1
  echo "== sweep starts at $(date -u +%T) ($(date +%s)), $(ls $live | wc -l) runs' folders there" >>$log
  setsid bash -c "${sweep[*]} >>$log 2>&1; echo \"== sweep exit \$? at \$(date -u +%T) (\$(date +%s))\" >>$log" \
    </dev/null >/dev/null 2>&1 &
  sleep 5
fi

if [ ! -d $live ]; then
  echo "no $name sweep on this machine: start it again, RUNS naming the records so far" >&2
  exit 3
fi

# follow the sweep until it ends or this call's time is up
while pgrep -f "pathbench.runners.cli sweep --file $name" >/dev/null; do
  [ $(( $(date +%s) - begin )) -lt $(( budget - 25 )) ] || break
  sleep 5
done
if pgrep -f "pathbench.runners.cli sweep --file $name" >/dev/null; then
  printf "\n== call ends at %s (%s), the sweep running\n" "$(date -u +%T)" "$(date +%s)" >>$log
else
  echo "runs still to do: $("${sweep[@]}" --dry-run 2>/dev/null | grep -c '^todo')" >>$log
fi
tar czf "$OUT/runs.tgz" --exclude=model.pt -C /tmp "$name-runs"
cp $log "$OUT/sweep.log"
tail -n 25 $log
