#!/usr/bin/env bash
# One run on a lent H200 (`run` with carry [".whl"]): tests, model check, benchmark.
# Writes setup.log, gpu_tests.log, check.log, chunks.log, resources.log, bench.log,
# kernel_bench.csv and kernel_bench.png under $OUT; phases are guarded by timeouts so the benchmark always runs. $1: seconds for it all.
# PHASES: which of the three phases below to run (default "1 2 3"). TREE: the commit whose tree
# runs, for setup.log (a copied working tree may carry an older commit's git metadata).
set -o pipefail
export PYTHONUNBUFFERED=1
budget=${1:-330}
phases=" ${PHASES:-1 2 3} "
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 3
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 4
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "tree of commit ${TREE:-$(git log -1 --format=%H 2>/dev/null)}"
  echo "installed at $(el)s"
} >"$OUT/setup.log" 2>&1
cat "$OUT/setup.log"

if [[ $phases == *" 1 "* ]]; then
# phase 1, side by side (correctness only): the GPU tests (the Triton kernel, CUDA-graph
# training against eager training, eager RoPE under graph capture), the model check with the
# 2000-step bf16 trainings (heads of 32 and of 128), and pre-compilation for the benchmark
timeout 330 python3 -m pytest tests/test_triton.py tests/test_runners.py \
  tests/test_kernels_torch.py::test_eager_rope_can_be_captured_in_a_cuda_graph -q -n 6 -p no:cacheprovider \
  --durations=12 >"$OUT/gpu_tests.log" 2>&1 &
p1=$!
timeout 240 python3 -m pathbench.kernels.triton_check >"$OUT/check.log" 2>&1 &
p2=$!
( timeout 120 python3 -m pathbench.runners.cli bench kernel --compile-only --impl ours
  timeout 60 python3 -m pathbench.runners.cli bench kernel --compile-only --impl fla ) >>"$OUT/setup.log" 2>&1 &
p3=$!
wait $p1; echo "tests exit $? at $(el)s" | tee -a "$OUT/setup.log"
wait $p2; echo "check exit $? at $(el)s" | tee -a "$OUT/setup.log"
wait $p3; echo "pre-compilation done at $(el)s" | tee -a "$OUT/setup.log"
tail -n 25 "$OUT/gpu_tests.log"; cat "$OUT/check.log"
fi

if [[ $phases == *" 2 "* ]]; then
# phase 2, alone on the GPU: bfloat16 errors against float64 per gradient, one chunk against
# chunks, one process per head size (a fault ends its process's CUDA context, and D = 32 in
# chunks has faulted); where the time goes at a training shape, and at 4096 and 16384 tokens;
# each kernel's registers, spills, shared memory and time at every benchmark shape. (The
# chunk-size timings behind the chunk constants are chunk_probe.py's.)
: >"$OUT/chunks.log"
printf '\nbfloat16 q/k/v against float64, T=1100, B=2, H=2: relative error of out, dq, dk, dv, dw, dbeta\n' \
  >>"$OUT/chunks.log"
for D in 64 128 32; do
  timeout 40 python3 - $D >>"$OUT/chunks.log" 2>&1 <<'EOF'
import sys, torch
from pathbench.kernels import triton_path as tp
from pathbench.kernels.bench_kernel import _inputs
from pathbench.kernels.reference import path_attention_reference

def rel(x, y):
    return ((x.double() - y).norm() / y.norm().clamp_min(1e-2)).item()

D = int(sys.argv[1])
q, k, v, w, beta = _inputs(2, 1100, 2, D, "cuda", seed=1)
# seeded: an unseeded draw on the GPU differed between two processes (same_gradients.log)
dout = torch.randn(q.shape, device="cuda", dtype=torch.float64, generator=torch.Generator("cuda").manual_seed(2))
ref_in = [x.double().requires_grad_(True) for x in (q, k, v, w, beta)]
ref = path_attention_reference(*ref_in)
ref_g = torch.autograd.grad(ref, ref_in, dout)
for one in (4096, 0):
    tp.ONE_CHUNK_TOKENS = tp.FWD_ONE_CHUNK_TOKENS = one
    tp.CHUNKED_HEAD_DIMS = (D,)
    ins = [x.detach().clone().requires_grad_(True) for x in (q, k, v, w, beta)]
    out = tp.path_attention_triton(*ins)
    g = torch.autograd.grad(out, ins, dout.to(out.dtype))
    errs = [rel(out, ref)] + [rel(a, b) for a, b in zip(g, ref_g)]
    print(f"D={D:<4} {'one chunk' if one else 'chunks of 512':14s} " + " ".join(f"{e:.2e}" for e in errs), flush=True)
EOF
done
echo >>"$OUT/chunks.log"
for shape in "128, 768, 2, 32" "64, 4096, 32, 4" "128, 16384, 16, 1"; do
  timeout 40 python3 -c "from pathbench.kernels.bench_kernel import _profile; _profile($shape, print)" \
    >>"$OUT/chunks.log" 2>&1
done
echo "errors and profiles exit $? at $(el)s" | tee -a "$OUT/setup.log"
cat "$OUT/chunks.log"
timeout 150 python3 results/kernel/kernel_resources.py >"$OUT/resources.log" 2>&1
echo "resources exit $? at $(el)s" | tee -a "$OUT/setup.log"
cat "$OUT/resources.log"
fi

[[ $phases == *" 3 "* ]] || exit 0
# phase 3, alone on the GPU: the benchmark
left=$(( budget - $(el) ))
timeout $(( left > 30 ? left : 30 )) python3 -m pathbench.runners.cli bench kernel --path "$OUT" \
  2>&1 | tee "$OUT/bench.log"
echo "bench exit $? at $(el)s" | tee -a "$OUT/setup.log"
