#!/usr/bin/env bash
# The kernel's run on one H200 (results/kernel/README.md), from the repository root:
#   OUT=DIR bash results/kernel/gpu_run.sh [SECONDS [BENCH OPTIONS]]
# installs pathbench (with fla-core from the wheels in .whl/: the GPU machine is offline), then
# runs the GPU tests and the model check side by side with the benchmark's compilation, then the
# benchmark alone on the GPU, `pathbench bench kernel`, which writes kernel_bench.csv and
# kernel_bench.png under OUT. Logs: setup.log, gpu_tests.log (and gpu_tests*.xml), check.log,
# bench.log under OUT.
# SECONDS (default 580) bounds the whole run; the tests stop after 480 s, the check after 400 s.
# BENCH OPTIONS go to `bench kernel` (e.g. --seqlens 1024,2048,8192: a run that goes on from one
# cut off).
set -o pipefail
export PYTHONUNBUFFERED=1
budget=${1:-580}
shift $(( $# > 0 ? 1 : 0 ))
OUT=${OUT:?set OUT to the folder for the logs, kernel_bench.csv and kernel_bench.png}
mkdir -p "$OUT"
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 3
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 4
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "tree of commit $(git log -1 --format=%H 2>/dev/null)"
  echo "installed at $(el)s"
} >"$OUT/setup.log" 2>&1
cat "$OUT/setup.log"

# correctness, side by side: the GPU tests (every test file with cases for a GPU: the Triton
# kernel, CUDA-graph training against eager training, the device samplers, the recurrent mixers'
# GPU paths; fla-core's cases after the others, in a process of their own, since a fault of
# theirs leaves its process unable to use the GPU) and the model check (one training step on the
# kernel against the torch backend; 2,000 bf16 steps at heads of 32 and of 128); meanwhile the
# benchmark's kernels are compiled, so that it spends its time timing
gpu_tests="tests/test_triton.py tests/test_kernels_torch.py tests/test_runners.py
  tests/test_runners_training.py tests/test_kernels_delta_rule.py tests/test_tasks_device.py
  tests/test_models_recurrent.py"
fla_cases="fla_operators or deltanet-auto or rwkv7-auto"
# Each failure's reason also goes to a JUnit file, written when pytest ends even if the time
# bound interrupts it (pytest-xdist then skips the summary), and printed after the log.
( timeout -s INT -k 15 330 python3 -m pytest $gpu_tests -v -rfE --tb=short -n 6 \
    -p no:cacheprovider -k "not ($fla_cases)" --junitxml="$OUT/gpu_tests.xml"
  timeout -s INT -k 10 150 python3 -m pytest $gpu_tests -v -rfE --tb=short -p no:cacheprovider \
    -k "$fla_cases" --junitxml="$OUT/gpu_tests_fla.xml"
  python3 - "$OUT"/gpu_tests*.xml <<'PY'
import sys, xml.etree.ElementTree as ElementTree
for path in sys.argv[1:]:
    for case in ElementTree.parse(path).iter("testcase"):
        for problem in list(case.findall("failure")) + list(case.findall("error")):
            print(f"{problem.tag.upper()} {case.get('classname')}::{case.get('name')}")
            print("\n".join((problem.text or problem.get("message", "")).splitlines()[-25:]))
PY
) >"$OUT/gpu_tests.log" 2>&1 &
tests=$!
timeout 400 python3 -m pathbench.runners.bench.gpu_check >"$OUT/check.log" 2>&1 &
check=$!
( timeout 120 python3 -m pathbench.runners.cli bench kernel --compile-only --impl ours
  timeout 60 python3 -m pathbench.runners.cli bench kernel --compile-only --impl fla ) \
  >>"$OUT/setup.log" 2>&1
wait $tests; echo "tests exit $? at $(el)s" | tee -a "$OUT/setup.log"
wait $check; echo "check exit $? at $(el)s" | tee -a "$OUT/setup.log"
grep -E -A3 "^(FAILURE|ERROR) |^=+ .*(passed|failed)" "$OUT/gpu_tests.log" | tail -n 60; cat "$OUT/check.log"

# the benchmark, alone on the GPU
left=$(( budget - $(el) ))
timeout $(( left > 30 ? left : 30 )) python3 -m pathbench.runners.cli bench kernel --path "$OUT" \
  "$@" 2>&1 | tee "$OUT/bench.log"
echo "bench exit $? at $(el)s" | tee -a "$OUT/setup.log"
