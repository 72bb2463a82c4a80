"""Does Triton's automatic warp specialization apply to a loop shaped like the scans' inner loops?

Compiles, for sm_90 on any machine (no GPU needed), one key-block loop of the cross-chunk
scans' kind (logits of a [64, 64] query tile with a key tile, exp2, the product with v into a
float32 sum), once with plain `range` and once with `tl.range(..., warp_specialize=True)`,
with the tiles loaded through pointers and through TMA descriptors, at 4 and 8 warps. For each
it prints whether the compiler finished, and whether the loop came out warp-specialized (a
`ttg.warp_specialize` region in the TTGIR) or as without the attribute. Each compilation runs
in a child process: the compiler may abort on an assertion.

    python3 results/kernel/ws_compile_probe.py > ws_compile.log
"""
import itertools
import os
import subprocess
import sys
import tempfile


def compile_one(ws, tma, num_warps):
    """TTGIR of the loop under these settings (in this process)."""
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def loop(Q, K, V, O, n, WS: tl.constexpr, TMA: tl.constexpr):
        r = tl.arange(0, 64)
        c = tl.arange(0, 64)
        q = tl.load(Q + r[:, None] * 64 + c[None, :])
        acc = tl.zeros([64, 64], dtype=tl.float32)
        # made in both forms; with pointers the compiler drops them, unused
        kd = tl.make_tensor_descriptor(K, shape=[n * 64, 64], strides=[64, 1], block_shape=[64, 64])
        vd = tl.make_tensor_descriptor(V, shape=[n * 64, 64], strides=[64, 1], block_shape=[64, 64])
        for j in tl.range(0, n, warp_specialize=WS):
            if TMA:
                k = kd.load([j * 64, 0])
                v = vd.load([j * 64, 0])
            else:
                k = tl.load(K + j * 4096 + r[:, None] * 64 + c[None, :])
                v = tl.load(V + j * 4096 + r[:, None] * 64 + c[None, :])
            p = tl.exp2(tl.dot(q, tl.trans(k)))
            acc = tl.dot(p.to(tl.bfloat16), v, acc=acc)
        tl.store(O + r[:, None] * 64 + c[None, :], acc)

    sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*fp32", "n": "i32", "WS": "constexpr", "TMA": "constexpr"}
    src = ASTSource(fn=loop, signature=sig, constexprs={"WS": ws, "TMA": tma})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": 3})
    return kernel.asm["ttgir"]


def strip_attribute(ttgir):
    return "\n".join(line for line in ttgir.splitlines() if "tt.warp_specialize" not in line and "loc(" not in line)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        ws, tma, warps = (int(x) for x in sys.argv[2:])
        print(strip_attribute(compile_one(bool(ws), bool(tma), warps)))
        sys.exit(0)
    import triton

    print(f"triton {triton.__version__}, sm_90, one [64, 64] x [64, 64] key-block loop, 3 stages")
    for tma, warps in itertools.product((0, 1), (4, 8)):
        out = {}
        for ws in (0, 1):
            r = subprocess.run([sys.executable, __file__, "--child", str(ws), str(tma), str(warps)],
                               capture_output=True, text=True)
            failed = [line for line in r.stderr.splitlines() if "Assertion" in line or "error:" in line][:1]
            out[ws] = r.stdout if r.returncode == 0 else "failed: " + (failed[0].strip() if failed else r.stderr[-200:])
        if out[1].startswith("failed"):
            verdict = out[1]
        elif "ttg.warp_specialize" in out[1]:
            verdict = "warp-specialized"
        elif out[1] == out[0]:
            verdict = "compiled; the same TTGIR as without the attribute"
        else:
            verdict = "compiled; TTGIR differs, no warp_specialize region"
        print(f"{'descriptors' if tma else 'pointers':>11}, {warps} warps: {verdict}")
