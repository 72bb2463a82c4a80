# Sourced by the GPU scripts under results/: `mps on` starts CUDA MPS for the processes started
# after it (so that their kernels run on the GPU at the same time instead of taking turns),
# `mps off` stops it; either says which holds.
mps() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  if [ $1 = on ] && command -v nvidia-cuda-mps-control >/dev/null; then
    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
    pgrep -f "nvidia-cuda-mps-control -d" >/dev/null || nvidia-cuda-mps-control -d
    timeout 60 python3 -c 'import torch; torch.ones(1, device="cuda").sum().item()'
    [ -n "$(echo get_server_list | nvidia-cuda-mps-control 2>/dev/null)" ] &&
      { echo "CUDA MPS on"; return; }
  fi
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  if [ $1 = on ]; then echo "CUDA MPS not available; workers time-share the GPU"
  else echo "CUDA MPS off"; fi
}
