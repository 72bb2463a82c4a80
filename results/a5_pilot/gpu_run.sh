#!/usr/bin/env bash
# The A5 pilot on one H200 (results/a5_pilot/README.md), from the repository root:
#   OUT=DIR bash results/a5_pilot/gpu_run.sh [SECONDS]
# installs pathbench, starts CUDA MPS (so that the sweep's workers run their kernels on the GPU
# at the same time), runs the one sweep below for at most SECONDS (default 540) and leaves the
# records as DIR/runs.tar.xz (without weights) and the sweep's output as DIR/sweep.log. Run
# again with the records unpacked under results/runs/a5_pilot to finish a sweep cut short.
set -o pipefail
export PYTHONUNBUFFERED=1
budget=${1:-540}
OUT=${OUT:?set OUT to the folder for runs.tar.xz and sweep.log}
runs=results/runs/a5_pilot
mkdir -p "$OUT" "$runs"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 4
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "tree of commit $(git log -1 --format=%H 2>/dev/null)"; date -u; } >"$OUT/sweep.log" 2>&1
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d 2>/dev/null && echo "CUDA MPS on" >>"$OUT/sweep.log"
start=$(date +%s)
timeout "$budget" python3 -m pathbench.runners.cli sweep a5 --models rope,sba,fox,path \
  --layers 1-4 --lrs 1e-3,3e-4 --seeds 0 --until-solved --set task.length=16 --steps 20000 \
  --batch-size 256 --pack 2 --workers 8 --device cuda --preset paper --out "$runs" \
  >>"$OUT/sweep.log" 2>&1
echo "sweep exit $? after $(( $(date +%s) - start )) s" >>"$OUT/sweep.log"
echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
tar cJf "$OUT/runs.tar.xz" --exclude=model.pt -C results/runs a5_pilot
tail -n 30 "$OUT/sweep.log"
