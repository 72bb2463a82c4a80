#!/usr/bin/env bash
# The engine's measurements on one GPU (results/engine/README.md), from the repository root, in
# commands of at most ten minutes each:
#   OLD=DIR [AGAINST="NAME:DIR2 ..."] bash results/engine/gpu_run.sh start 560   # the first command
#   bash results/engine/gpu_run.sh wait 590            # each later one, while the machine is held
# DIR holds the engine before this one, unpacked (git archive c27954c | tar -x -C DIR); each
# NAME:DIR2 of AGAINST a tree before one change to PaTH's step, to measure it alone (conv:
# 97100d8, the last to convolve w with F.conv1d; oneblock: 6be754b, the last whose kernel
# computed the block products of one-block sequences).
# `start` installs pathbench (and the old engine beside it) and starts the measurements in their
# own process session, one after another:
#   1. the same small sweep (A5 at length 12, RoPE and PaTH, 3 and 4 layers, 2 learning rates x
#      3 seeds, 10,000 steps: 24 runs) with the old engine, then the new, each timed, under CUDA
#      MPS; first, since its wall time must come from one machine;
#   2. bench train, new and old side by side, at the word-problem shape (rows are written as
#      they are measured and a row measured already is not measured again);
#   3. for each NAME:DIR2 of AGAINST, bench train of PaTH against DIR2's, in bench_NAME.csv;
#   4. bench step: where a step's time goes, RoPE and PaTH at A5 length 12, 4 layers, pack 64;
#   5. bench train at the other shapes, attentions and packs, one shape of each task first;
#   6. bench step of PaTH on its torch backend.
# `start` and `wait` follow them for their $2 seconds and then return what is done under $OUT:
# step_*.txt (a profile that failed: step_*.failed.log), bench_*.csv, sweep_*.log, runs_*.tgz
# (records, no weights) and engine.log.
# The state lives in LIVE, outside the working tree that each command copies over again; STATE,
# when set, names a folder of files an earlier machine with the same GPU returned, which seeds
# it, so that the measurements cut off with their machine go on where they stopped.
set -o pipefail
source "$(dirname "$0")/../mps.sh"
export PYTHONUNBUFFERED=1
mode=${1:?start or wait}
budget=${2:-560}
OUT=${OUT:?set OUT to the folder that receives the results}
live=/tmp/engine
log=$live/engine.log
begin=$(date +%s)
sweep_args=(a5 --models rope,path --layers 3,4 --lrs 1e-3,3e-4 --seeds 0-2 --steps 10000
            --batch-size 256 --preset paper --set task.length=12 --set train.early_stop=0.95
            --workers 4 --device cuda)

profile() {  # bench step of attention $1 on backend $2 at the word-problem shape, pack 64
  local name=step_$1$([ $2 = auto ] || echo _$2).txt
  [ -s $live/$name ] && return
  timeout 300 python3 -m pathbench.runners.cli bench step --shape a5-12-L4 --attention $1 \
    --backend $2 --pack 64 >$live/$name.tmp 2>&1 &&
    mv $live/$name.tmp $live/$name || mv $live/$name.tmp $live/${name%.txt}.failed.log
}

measure() {  # the measurements, each skipped once its file says it is done
  cd "$1" || exit 5
  # the sweep, old engine then new, both under CUDA MPS (the old engine's best setting: its
  # workers' kernels run at the same time instead of taking turns); MPS stops after them, so
  # that the measurements after them run each process alone, as before
  mps on
  for engine in old new; do
    [ -f $live/sweep_$engine.done ] && continue
    rm -rf $live/runs_$engine
    local started=$(date +%s)
    if [ $engine = old ]; then
      (cd /tmp && PYTHONPATH=$live/old_site python3 -P -m pathbench.runners.cli sweep \
        "${sweep_args[@]}" --pack 6 --out $live/runs_$engine)
    else
      python3 -m pathbench.runners.cli sweep "${sweep_args[@]}" --out $live/runs_$engine
    fi >$live/sweep_$engine.log 2>&1 &&
      echo "wall_s $(( $(date +%s) - started ))" >$live/sweep_$engine.done
  done
  mps off
  # the headline: RoPE and PaTH at the word-problem shape, alone, as a pack of 9 (a cell of 3
  # learning rates x 3 seeds, the largest a sweep trains together) and of 64
  python3 -m pathbench.runners.cli bench train --shapes a5-12-L4 --attentions rope,path \
    --packs 1,9,64 --steps 400 --interval 100 --against "$OLD_TREE" --out $live/bench_train.csv
  # PaTH against PaTH before each change named in AGAINST
  for name in $against; do
    python3 -m pathbench.runners.cli bench train --shapes a5-12-L4 --attentions path \
      --packs 9,64 --steps 400 --interval 100 --against $live/against_$name \
      --out $live/bench_$name.csv
  done
  # where a step's time goes
  profile rope auto
  profile path auto
  # the other shapes, attentions and packs, one shape of each task first
  if [ ! -f $live/shapes.done ]; then
    for group in "a5-32-L4 rope,path 9" "flipflop-L1 rope,path 9" "mqrar-2 rope,path 1" \
                 "a5-12-L4 nope,sba,fox,path_fox 9,64" "a5-12-L1,a5-12-L6 rope,path 9,64" \
                 "flipflop-L2,a5-12-L2,a5-12-L3,a5-12-L5,a5-32-L1,a5-32-L2,a5-32-L3,a5-32-L5,a5-32-L6 rope,path 9"; do
      set -- $group
      python3 -m pathbench.runners.cli bench train --shapes "$1" --attentions "$2" \
        --packs "$3" --steps 400 --interval 100 --against "$OLD_TREE" \
        --out $live/bench_train.csv
    done
    touch $live/shapes.done
  fi
  # whether PaTH's blockwise torch form beats the kernel at 12 tokens
  profile path torch
}

if [ "$mode" = start ]; then
  mkdir -p $live
  if [ -n "${STATE:-}" ] && [ -d "$STATE" ]; then  # measurements of the same kind of GPU only
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
    if grep -qF "$gpu, " "$STATE/engine.log" 2>/dev/null; then  # nvidia-smi's line there
      cp -a "$STATE"/. $live/
    else
      echo "STATE was measured on another GPU than this $gpu: measuring anew" | tee -a $log
    fi
  fi
  # The old engine, as a copy with one fix that is not the engine's: its task configs name
  # their module under Python 3.12 (commit 6485557), without which its sweep cannot send a word
  # problem's runs to its workers.
  rm -rf $live/old_tree && cp -a "${OLD:?set OLD to the folder of the old engine}" $live/old_tree
  sed -i 's/^    derived.__qualname__ = /    derived.__module__ = task_class.__module__\n&/' \
    $live/old_tree/tasks/base.py
  export OLD_TREE=$live/old_tree
  # the trees of AGAINST, copied too: the next command's working tree lacks them
  against=
  for entry in ${AGAINST:-}; do
    rm -rf $live/against_${entry%%:*} && cp -a "${entry#*:}" $live/against_${entry%%:*} || exit 5
    against="$against ${entry%%:*}"
  done
  python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 4
  python3 -m pip install -q --no-deps --no-build-isolation --target $live/old_site \
    "$OLD_TREE" >/dev/null 2>&1 || exit 4
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    git log -1 --format='tree of commit %H' 2>/dev/null; date -u; } >>$log 2>&1
  echo "== measurements start at $(date -u +%T)" >>$log
  root=$(pwd)
  setsid bash -c "$(declare -p live sweep_args against; declare -f mps profile measure); measure '$root'
                  echo \"== measurements end at \$(date -u +%T)\"" >>$log 2>&1 </dev/null &
  sleep 5
fi

# follow the measurements until they end or this command's time is up
while pgrep -f "bench (step|train)|cli sweep" >/dev/null; do
  [ $(( $(date +%s) - begin )) -lt $(( budget - 25 )) ] || break
  sleep 5
done
for file in $live/step_*.txt $live/step_*.failed.log $live/bench_*.csv $live/sweep_*.log $live/sweep_*.done $log; do
  [ -f "$file" ] && cp "$file" "$OUT/"
done
for engine in old new; do
  if [ -d $live/runs_$engine ]; then
    tar czf "$OUT/runs_$engine.tgz" --exclude=model.pt -C $live runs_$engine
  elif [ -f $live/runs_$engine.tgz ]; then  # returned by an earlier machine (STATE)
    cp $live/runs_$engine.tgz "$OUT/"
  fi
done
tail -n 20 $log
