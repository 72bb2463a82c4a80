"""Each Triton kernel's time under each (num_warps, num_stages), the data behind
_KERNEL_LAUNCH_64 in kernels/triton_path.py (its output is launch.log).

Run on a GPU from the repository root: `python3 results/kernel/launch_probe.py > launch.log`.
Every kernel launch goes through a wrapper that swaps in the setting under test (a kernel that
does not fit it in shared memory keeps its default and is listed under "oor"); blocks of 64
tokens, chunks above 1024 tokens, bfloat16 q/k/v. One child process per (D, setting, precision
of the Householder products): they first compile side by side, then are timed one at a time.
Each line: fwd+bwd ms (do_bench median) and each kernel's mean ms over three profiled calls.
"""

import json
import subprocess
import sys
import time

import torch

KERNELS = {"_path_fwd_kernel": "fwd", "_bwd_within_kernel": "within", "_prep_fwd_kernel": "prep_fwd",
           "_prep_bwd_kernel": "prep_bwd", "_bwd_cross_q_kernel": "cross_q", "_bwd_cross_kv_kernel": "cross_kv",
           "_edges_fwd_kernel": "edges_fwd", "_edges_bwd_kernel": "edges_bwd"}
SHAPES = {32: [(512, 2, 64)], 64: [(1024, 32, 16), (4096, 32, 4), (16384, 32, 1)],
          128: [(768, 2, 32), (4096, 16, 4), (16384, 16, 1)]}
SETTINGS = {32: ["default"], 64: ["default", "4,2", "8,2", "4,3"], 128: ["default", "4,2", "8,2", "4,3"]}
# the configuration every kernel had before this probe: (BT, num_warps, num_stages) of the scans
DEFAULTS = {32: ((64, 4, 1), (64, 4, 1)), 64: ((64, 4, 2), (64, 4, 1)), 128: ((64, 8, 2), (64, 8, 1))}
out_of_resources = set()


class Swapped:
    """A kernel whose launches take the setting under test, or their own where it does not fit."""

    def __init__(self, kernel, setting):
        self.kernel, self.setting = kernel, setting

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def call(*args, **options):
            if self.setting is not None:
                try:
                    return launch(*args, **dict(options, num_warps=self.setting[0], num_stages=self.setting[1]))
                except Exception as exc:
                    if "out of resource" not in str(exc).lower():
                        raise
                    out_of_resources.add(KERNELS[self.kernel.fn.__name__])
            return launch(*args, **options)

        return call


def child(D, setting, hprec, compile_only):
    import triton.testing
    from torch.profiler import ProfilerActivity, profile

    from pathbench.kernels import triton_path as tp
    from pathbench.kernels.bench_kernel import _fns, _inputs

    tp.ONE_CHUNK_TOKENS, tp.FWD_ONE_CHUNK_TOKENS, tp.CHUNK_TOKENS, tp.LONG_CHUNK_TOKENS = 1024, 1024, 512, 512
    tp.LEVEL_CHUNKS = 1 << 20  # one level of chunks
    tp._KERNEL_LAUNCH_64 = {}  # the defaults below, unless swapped
    swap = None if setting == "default" else tuple(map(int, setting.split(",")))
    tp._KERNELS = tuple(Swapped(k, swap) for k in tp._kernels())
    tp._hprec = lambda dtype, dev: hprec
    tp.FORCE_CONFIG.update(fwd=DEFAULTS[D][0], bwd=DEFAULTS[D][1])
    for T, H, B in SHAPES[D]:
        args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
        _, fwd_bwd, _ = _fns("ours", args, D ** -0.5)
        fwd_bwd()
        torch.cuda.synchronize()
        if compile_only:
            continue
        ms = triton.testing.do_bench(fwd_bwd, warmup=20, rep=100)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fwd_bwd()
            torch.cuda.synchronize()
        per = {}
        for e in prof.events():
            name = KERNELS.get(e.name)
            if e.device_type == torch.autograd.DeviceType.CUDA and name:
                per[name] = per.get(name, 0.0) + e.device_time / 3e3
        print(json.dumps({"D": D, "T": T, "setting": setting, "hprec": hprec, "total_ms": round(ms, 3),
                          "per_kernel_ms": {k: round(v, 3) for k, v in per.items()},
                          "oor": sorted(out_of_resources)}), flush=True)


def main():
    runs = [(D, s, "tf32x3") for D in (128, 64, 32) for s in SETTINGS[D]]
    runs += [(D, "default", "tf32") for D in (128, 64, 32)]
    start = time.time()
    procs = [subprocess.Popen([sys.executable, __file__, str(D), s, hp, "compile"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for D, s, hp in runs]
    for run, proc in zip(runs, procs):
        _, err = proc.communicate()
        if proc.returncode:
            print(f"# compiling {run} failed: {err.strip().splitlines()[-1:]}", flush=True)
    print(f"# compiled in {time.time() - start:.0f}s", flush=True)
    for D, s, hp in runs:
        proc = subprocess.run([sys.executable, __file__, str(D), s, hp, "time"], capture_output=True, text=True)
        sys.stdout.write(proc.stdout)
        if proc.returncode:
            print(f"# timing {(D, s, hp)} failed: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
    print(f"# done in {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        child(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "compile")
    else:
        main()
