#!/usr/bin/env bash
# The paper reproduction on a lent H200, one call at a time until it is complete:
#   run(command="bash results/paper/gpu_run.sh 570")
# Records accumulate in results/paper/runs (untracked files travel with the working tree, so
# each call resumes where the last stopped); each call returns them as $OUT/runs.tgz (without
# weights) and its log as $OUT/sweep.log. $1: seconds this call may spend. PARTS: the sweep
# files to run (names or paths); RUNS: where the records go, instead of the files' own `out`.
set -o pipefail
export PYTHONUNBUFFERED=1
budget=${1:-570}
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
log="$OUT/sweep.log"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 4
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  git log -1 --format='tree of commit %H'; date -u; } >>"$log" 2>&1

# CUDA MPS lets the sweep's worker processes run kernels on the GPU at the same time; without
# it they take turns. Kept only if a CUDA program starts under it.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
check='import torch; torch.ones(1, device="cuda").sum().item()'
if command -v nvidia-cuda-mps-control >/dev/null; then
  pgrep -f "nvidia-cuda-mps-control -d" >/dev/null || nvidia-cuda-mps-control -d
  timeout 60 python3 -c "$check"
fi
if [ -n "$(echo get_server_list | nvidia-cuda-mps-control 2>/dev/null)" ]; then
  echo "CUDA MPS on (server $(echo get_server_list | nvidia-cuda-mps-control))" >>"$log"
else
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  echo "CUDA MPS not available; workers time-share the GPU" >>"$log"
fi

# Shortest experiment first, so that a call cut short still finishes whole experiments.
for part in ${PARTS:-flipflop word_problems mqrar}; do
  left=$(( budget - 30 - $(el) ))
  [ $left -gt 20 ] || break
  echo "== $part at $(el)s ($(date -u +%T))" >>"$log"
  timeout -s INT -k 20 $left python3 -m pathbench.runners.cli sweep --file $part \
    ${RUNS:+--out $RUNS} >>"$log" 2>&1
  echo "== $part exit $? at $(el)s" >>"$log"
done
pkill -f pathbench.runners.cli; pkill -f multiprocessing.spawn; sleep 2
todo=0
for part in ${PARTS:-flipflop word_problems mqrar}; do
  n=$(python3 -m pathbench.runners.cli sweep --file $part ${RUNS:+--out $RUNS} --dry-run \
      2>/dev/null | grep -c '^todo')
  todo=$(( todo + n ))
done
echo "runs still to do: $todo" >>"$log"
tar czf "$OUT/runs.tgz" --exclude=model.pt ${RUNS:-results/paper/runs} 2>>"$log"
echo "end at $(el)s" >>"$log"
tail -n 30 "$log"
