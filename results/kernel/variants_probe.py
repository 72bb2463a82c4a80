"""Versions of kernels/triton_path.py side by side (output: variants.log): for each, float32
errors against the float64 reference at T = 700 (out, dq, dk, dv, dw, dbeta, dlog_fgate), then
per shape fwd and fwd+bwd ms, peak MB and each kernel's ms (mean of three profiled calls).

Run on a GPU from the repository root, one FILE:SETTING per version:
`python3 results/kernel/variants_probe.py old.py:default new.py:default new.py:cross_q@128=8,1 > variants.log`.
SETTING is "default"; or "num_warps,num_stages" for the preprocessing backward; or items joined
by "/", each "kernel=num_warps,num_stages" (at both head sizes) or "kernel@D=num_warps,num_stages"
(at head size D) for a kernel of _KERNEL_LAUNCH_64, or "NAME=value" for one of the module's
integer settings (ONE_CHUNK_TOKENS, FWD_ONE_CHUNK_TOKENS, CHUNK_TOKENS, LEVEL_CHUNKS,
LONG_CHUNK_TOKENS), tuples of integers ("INTERPRET_CHUNKS=2+4") or head-size lists
("HALF_ADJOINT_HEAD_DIMS=64+128", "QUERY_PAIRS.within=none"). A SHAPES environment variable
("D,T,H,B;D,T,H,B") replaces the default shapes. Where the version has LEVEL_CHUNKS, the errors
are also taken with the backward's levels of chunks forced at 2000 tokens ("levels").
"""
import importlib.util
import json
import subprocess
import sys

SHAPES = [(64, 1024, 32, 16), (64, 4096, 32, 4), (64, 16384, 32, 1), (128, 768, 2, 32), (128, 1024, 16, 16),
          (128, 4096, 16, 4), (128, 16384, 16, 1)]


def apply(tp, settings):
    """Set the version's launch settings and chunk constants as SETTING says."""
    if settings == "default":
        return
    if "=" not in settings:
        settings = "prep_bwd=" + settings
    for item in settings.split("/"):
        name, value = item.split("=")
        if name.endswith("_HEAD_DIMS") or name.startswith("QUERY_PAIRS."):
            dims = () if value == "none" else tuple(map(int, value.split("+")))
            if name.endswith("_HEAD_DIMS"):
                setattr(tp, name, dims)
            else:
                tp.QUERY_PAIRS[name.split(".")[1]] = dims
            continue
        if name.isupper():
            numbers = tuple(map(int, value.split("+")))
            setattr(tp, name, numbers if isinstance(getattr(tp, name), tuple) else numbers[0])
            continue
        kernel, _, D = name.partition("@")
        for d in [int(D)] if D else list(tp._KERNEL_LAUNCH_64):
            tp._KERNEL_LAUNCH_64[d][kernel] = tuple(map(int, value.split(",")))


def load_version(path):
    """The kernel file at path, loaded as pathbench.kernels.triton_path: whatever imports the
    kernel after this call (kernel_resources.measure, the benchmark's calls) runs this version."""
    spec = importlib.util.spec_from_file_location("pathbench.kernels.triton_path", path)
    tp = importlib.util.module_from_spec(spec)
    sys.modules["pathbench.kernels.triton_path"] = tp
    spec.loader.exec_module(tp)
    return tp


def in_children(script, versions):
    """Run `script VERSION --child` for each (header, VERSION), one process a version (a kernel
    module is loaded once a process), printing its output under `# header`."""
    for header, version in versions:
        print(f"# {header}", flush=True)
        r = subprocess.run([sys.executable, script, version, "--child"], capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        if r.returncode:
            print("# failed:", r.stderr.strip().splitlines()[-3:], flush=True)


def child(path, settings):
    tp = load_version(path)
    import torch
    from kernel_resources import measure, shapes_from_env  # imported after the swap: it measures this version
    from pathbench.kernels.reference import path_attention_reference
    apply(tp, settings)
    # against float64, gate on: float32 at T = 700 (GPU precision settings) in one chunk and in
    # chunks of 512 tokens (the last one partial), bfloat16 q/k/v at T = 1100 in chunks of 512
    one_chunk = tp.ONE_CHUNK_TOKENS
    fwd_one_chunk = getattr(tp, "FWD_ONE_CHUNK_TOKENS", None)  # absent in older versions
    level_chunks = getattr(tp, "LEVEL_CHUNKS", None)
    checks = [(64, 700, torch.float32, False), (64, 700, torch.float32, True), (128, 700, torch.float32, False),
              (64, 1100, torch.bfloat16, True), (128, 1100, torch.bfloat16, True)]
    if level_chunks is not None:
        checks += [(64, 2000, torch.float32, "levels"), (64, 2000, torch.bfloat16, "levels"),
                   (128, 2000, torch.bfloat16, "levels")]
    for D, T, dtype, chunked in checks:
        tp.ONE_CHUNK_TOKENS = 0 if chunked else one_chunk
        if level_chunks is not None:
            tp.LEVEL_CHUNKS = 2 if chunked == "levels" else level_chunks
        if fwd_one_chunk is not None:
            tp.FWD_ONE_CHUNK_TOKENS = 0 if chunked else fwd_one_chunk
        g = torch.Generator().manual_seed(0)
        B, H = 2, 2
        q, k, v = (torch.randn(B, T, H, D, generator=g).to(dtype) for _ in range(3))
        w = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g), dim=-1)
        beta = 2 * torch.rand(B, T, H, generator=g)
        lf = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=g) + 2)
        ins = [x.cuda().requires_grad_(True) for x in (q, k, v, w, beta, lf)]
        ref_in = [x.detach().double().requires_grad_(True) for x in ins]
        do = torch.randn(B, T, H, D, device="cuda", dtype=torch.float64)
        out = tp.path_attention_triton(*ins)
        ref = path_attention_reference(*ref_in)
        gs = torch.autograd.grad(out, ins, do.to(dtype))
        rs = torch.autograd.grad(ref, ref_in, do)
        errs = [((a.double() - b).norm() / b.norm()).item() for a, b in zip([out] + list(gs), [ref] + list(rs))]
        print(json.dumps({"check": D, "T": T, "dtype": str(dtype), "chunked": chunked,
                          "errs": [float(f"{e:.2e}") for e in errs]}), flush=True)
    tp.ONE_CHUNK_TOKENS = one_chunk
    if level_chunks is not None:
        tp.LEVEL_CHUNKS = level_chunks
    if fwd_one_chunk is not None:
        tp.FWD_ONE_CHUNK_TOKENS = fwd_one_chunk
    for D, T, H, B in shapes_from_env(SHAPES):
        row = measure(D, T, H, B)
        print(json.dumps({"D": D, "T": T, "fwd": row["fwd_ms"], "fwdbwd": row["fwd_bwd_ms"], "mb": row["peak_mb"],
                          "k": row["kernel_ms"], "torch": row["torch_ops_ms"]}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[2] == "--child":
        child(*sys.argv[1].rsplit(":", 1))
    else:
        in_children(__file__, [(" ".join(arg.rsplit(":", 1)), arg) for arg in sys.argv[1:]])
