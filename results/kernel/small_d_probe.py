"""fwd+bwd ms, peak MB and each kernel's ms (kernel_resources.measure, each shape measured twice)
of kernel versions at head sizes 16 and 32, whose within-chunk scan spans the sequence: the
training shape of D = 32, one at D = 16, and D = 32 at 2048 tokens (output:
early_sums_small_d.log).

Run on a GPU from results/kernel/, one kernel file per version:
`python3 small_d_probe.py old.py ../../kernels/triton_path.py > early_sums_small_d.log`.
"""
import json
import sys

from variants_probe import in_children, load_version

SHAPES = [(32, 512, 2, 64), (16, 512, 4, 64), (32, 2048, 16, 8)]


def child(path):
    load_version(path)
    from kernel_resources import measure  # imported after the swap: it measures this version
    for D, T, H, B in SHAPES:
        for _ in range(2):
            row = measure(D, T, H, B)
            print(json.dumps({"D": D, "T": T, "H": H, "B": B, "fwdbwd": row["fwd_bwd_ms"], "mb": row["peak_mb"],
                              "k": row["kernel_ms"]}), flush=True)


if __name__ == "__main__":
    if sys.argv[-1] == "--child":
        child(sys.argv[1])
    else:
        in_children(__file__, [(path, path) for path in sys.argv[1:]])
