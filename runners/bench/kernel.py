"""`pathbench bench kernel`: our Triton PaTH kernel, fla-core's parallel_path_attn and torch SDPA.

Side by side in one run on one GPU, same bfloat16 q/k/v (w, beta in float32), no gate: forward
and forward+backward medians and the peak memory each call allocates beyond its inputs
(torch.cuda.max_memory_allocated). Each call is timed twice: launched from Python
(triton.testing.do_bench, the L2 cache cleared before each call), and replayed from a CUDA graph
(do_bench_cudagraph), the GPU's time alone, as the suite's training runs. Where a call's GPU
work is short, the first reading is the host's launch time. Writes the tables to stdout, and
kernel_bench.csv and kernel_bench.png under --path, each through a temporary file renamed into
place.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path


from pathbench import UserError
from pathbench.files import write_atomic, write_text_atomic

TOKENS = 16384
LONG_SHAPES = [(D, T, 32 if D == 64 else 16, TOKENS // T) for D in (64, 128)
               for T in (1024, 2048, 4096, 8192, 16384)]
TRAIN_SHAPES = [(32, 512, 2, 64), (128, 768, 2, 32)]  # (D, T, H, B) the suite trains on
PRIORITY_T = (4096, 16384)  # measured first, so that a run cut short still has them
IMPLS = ("ours", "fla", "sdpa")


def _inputs(B, T, H, D, device, seed=0):
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, device=device, generator=gen, dtype=torch.bfloat16) for _ in range(3))
    w = torch.nn.functional.normalize(torch.randn(B, T, H, D, device=device, generator=gen), dim=-1)
    beta = 2.0 * torch.rand(B, T, H, device=device, generator=gen)
    return q, k, v, w, beta


def _fns(impl, args, scale):
    """(forward, forward+backward, grad tensors) for one implementation."""
    import torch

    q, k, v, w, beta = args
    if impl == "ours":
        from pathbench.kernels.triton_path import path_attention_triton

        def run():
            return path_attention_triton(q, k, v, w, beta, None, scale)
        leaves = [q, k, v, w, beta]
    elif impl == "fla":
        from fla.ops.path_attn.parallel import parallel_path_attn

        def run():
            return parallel_path_attn(q, k, v, w, beta, g=None, scale=scale)[0]
        leaves = [q, k, v, w, beta]
    else:
        # SDPA's own [B, H, T, D] layout, contiguous: leaves, not views (do_bench_cudagraph
        # detaches its gradients' tensors in place, which a view cannot be)
        qh, kh, vh = (x.detach().transpose(1, 2).contiguous().requires_grad_(True) for x in (q, k, v))

        def run():
            return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
        leaves = [qh, kh, vh]
    do = torch.randn_like(run().float()).to(q.dtype)

    def fwd():
        with torch.no_grad():
            return run()

    def fwd_bwd():
        out = run()
        out.backward(do)

    return fwd, fwd_bwd, leaves


def _peak_mb(fn):
    import gc

    import torch

    # collect earlier calls' cyclic garbage first, or its release during fn shows as negative
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


# Head sizes at which fla-core's parallel_path_attn may fault and poison the CUDA context: timed
# in a child process.
FLA_ISOLATED_D = {32}


def _times(fn, grad_to_none, warmup, rep):
    """fn's median ms launched from Python (do_bench) and replayed from a CUDA graph."""
    from triton.testing import do_bench, do_bench_cudagraph

    ms = do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="median")
    return ms, do_bench_cudagraph(fn, rep=rep, grad_to_none=grad_to_none, return_mode="median")


def _measure(impl, D, T, H, B, warmup, rep):
    """Rows for one implementation at one shape, and its forward output (float32)."""
    args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
    fwd, fwd_bwd, leaves = _fns(impl, args, D ** -0.5)
    out = fwd().float()
    fwd_bwd()  # compile / autotune outside the timings
    rows = []
    for mode, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
        grad_to_none = leaves if mode == "fwd+bwd" else None
        ms, graph_ms = _times(fn, grad_to_none, warmup, rep)
        for x in leaves:
            x.grad = None
        peak = _peak_mb(fn)
        rows.append(dict(impl=impl, mode=mode, D=D, T=T, H=H, B=B, ms=ms, graph_ms=graph_ms, peak_mb=peak))
    return rows, out


def _measure_in_child(impl, D, T, H, B, warmup, rep):
    import json
    import subprocess
    import sys

    code = ("import json, sys; from pathbench.runners.bench.kernel import _measure; "
            f"rows, _ = _measure({impl!r}, {D}, {T}, {H}, {B}, {warmup}, {rep}); "
            "print('ROWS=' + json.dumps(rows))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("ROWS="):
            return json.loads(line[5:])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"child process failed (exit {proc.returncode}): {tail[:200]}")


def _fmt_row(r):
    return (f"  {r['impl']:>5} {r['mode']:>8} D={r['D']:<4} T={r['T']:<6} H={r['H']:<3} B={r['B']:<3}"
            f" {r['ms']:9.3f} ms {r['graph_ms']:9.3f} ms in a graph {r['peak_mb']:9.0f} MB")


def run_bench(shapes, impls, warmup=25, rep=100, echo=print, on_shape=None):
    import torch

    rows = []
    for D, T, H, B in shapes:
        outs = {}
        for impl in impls:
            try:
                if impl == "fla" and D in FLA_ISOLATED_D:
                    got = _measure_in_child(impl, D, T, H, B, warmup, rep)
                else:
                    got, outs[impl] = _measure(impl, D, T, H, B, warmup, rep)
                rows += got
                for r in got:
                    echo(_fmt_row(r))
            except Exception as exc:  # one failing peer must not lose the others' numbers
                echo(f"  {impl} D={D} T={T}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            try:
                torch.cuda.empty_cache()
            except Exception:
                pass
        if "ours" in outs and "fla" in outs:
            ref = outs["fla"]
            diff = ((outs["ours"] - ref).norm() / ref.norm()).item()
            echo(f"  D={D} T={T} H={H} B={B}: ours vs fla-core forward rel. difference {diff:.2e}")
        del outs
        if on_shape is not None:
            on_shape(rows)
    return rows


def _table(rows, field="ms"):
    """One line per shape and mode: the times in field ("ms" or "graph_ms") of each
    implementation, ours against the others, and with "ms" the peak memory."""
    by = {(r["impl"], r["mode"], r["D"], r["T"], r["B"]): r for r in rows}
    keys = sorted({(r["D"], r["T"], r["H"], r["B"]) for r in rows}, key=lambda k: (k[3] == TOKENS // k[1], k))
    memory = field == "ms"
    lines = []
    head = (f"{'D':>4} {'T':>6} {'H':>3} {'B':>3} {'mode':>8} | {'ours ms':>8} {'fla ms':>8} {'sdpa ms':>8}"
            f" | {'ours/fla':>8} {'ours/sdpa':>9}")
    if memory:
        head += f" | {'ours MB':>8} {'fla MB':>8} {'sdpa MB':>8}"
    lines.append(head)
    lines.append("-" * len(head))
    for D, T, H, B in keys:
        for mode in ("fwd", "fwd+bwd"):
            get = {i: by.get((i, mode, D, T, B)) for i in IMPLS}
            ms = {i: (get[i][field] if get[i] else math.nan) for i in IMPLS}
            line = (f"{D:>4} {T:>6} {H:>3} {B:>3} {mode:>8} | {ms['ours']:8.3f} {ms['fla']:8.3f} {ms['sdpa']:8.3f}"
                    f" | {ms['ours'] / ms['fla']:8.2f} {ms['ours'] / ms['sdpa']:9.2f}")
            if memory:
                mb = {i: (get[i]["peak_mb"] if get[i] else math.nan) for i in IMPLS}
                line += f" | {mb['ours']:8.0f} {mb['fla']:8.0f} {mb['sdpa']:8.0f}"
            lines.append(line)
    return "\n".join(lines)


CSV_FIELDS = ["impl", "mode", "D", "T", "H", "B", "ms", "graph_ms", "peak_mb"]


def _write_csv(rows, path):
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, text.getvalue())


def _plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for col, D in enumerate((64, 128)):
        for row, mode in enumerate(("fwd", "fwd+bwd")):
            ax = axes[row][col]
            for impl in IMPLS:
                pts = sorted((r["T"], r["ms"]) for r in rows
                             if r["impl"] == impl and r["mode"] == mode and r["D"] == D and r["B"] * r["T"] == TOKENS)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"D={D}, {mode}, {TOKENS} tokens a batch, bf16")
            ax.set_xlabel("T")
            ax.set_ylabel("ms (median, do_bench)")
            ax.grid(True, alpha=0.3)
            ax.legend()
    fig.tight_layout()
    write_atomic(path, lambda file: fig.savefig(file, format="png", dpi=120))
    plt.close(fig)


def _profile(D, T, H, B, echo):
    import torch
    from torch.profiler import ProfilerActivity, profile

    args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
    _, fwd_bwd, _ = _fns("ours", args, D ** -0.5)
    for _ in range(3):
        fwd_bwd()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fwd_bwd()
        torch.cuda.synchronize()
    echo(f"profile of one forward+backward, ours, D={D} T={T} H={H} B={B}:")
    echo(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))


def bench_kernel(out_dir, impls, quick, compile_only, profile, seqlens, echo=print):
    """Time the Triton PaTH kernel against fla-core and torch SDPA (needs a CUDA GPU)."""
    import torch

    if not torch.cuda.is_available():
        raise UserError("bench kernel needs a CUDA GPU; none is available here")
    impls = tuple(impls) or IMPLS
    if profile:
        _profile(64, 4096, 32, 4, echo)
        return
    if compile_only:
        # the shapes whose peers may crash the process go last
        for D, T, H, B in sorted(LONG_SHAPES + TRAIN_SHAPES, key=lambda s: s[0] in FLA_ISOLATED_D):
            for impl in impls:
                args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
                _, fwd_bwd, _ = _fns(impl, args, D ** -0.5)
                fwd_bwd()
                torch.cuda.synchronize()
                echo(f"compiled {impl} D={D} T={T}")
        return
    if "fla" in impls:
        try:
            import fla.ops.path_attn.parallel  # noqa: F401
        except ImportError:
            echo("fla-core is not installed: timing without it (pip install fla-core)")
            impls = tuple(i for i in impls if i != "fla")
    shapes = [s for s in LONG_SHAPES if s[1] == 4096] if quick else list(LONG_SHAPES)
    if seqlens:
        try:
            want = {int(x) for x in seqlens.split(",") if x.strip()}
        except ValueError:
            raise UserError(f"--seqlens takes comma-separated integers, got {seqlens!r}") from None
        valid = {s[1] for s in LONG_SHAPES}
        if not want or not want <= valid:
            raise UserError(f"--seqlens must be among {sorted(valid)}, got {seqlens!r}")
        shapes = [s for s in shapes if s[1] in want]
    first = [s for s in shapes if s[1] in PRIORITY_T]
    shapes = first + TRAIN_SHAPES + [s for s in shapes if s not in first]
    echo(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    csv_path = out / "kernel_bench.csv"
    rows = run_bench(shapes, impls, warmup=10 if quick else 20, rep=30 if quick else 60, echo=echo,
                     on_shape=lambda rows: _write_csv(rows, csv_path))
    _write_csv(rows, csv_path)
    _plot(rows, out / "kernel_bench.png")
    echo("launched from Python (do_bench):")
    echo(_table(rows))
    echo("replayed from a CUDA graph (the GPU's time alone):")
    echo(_table(rows, "graph_ms"))
    if "ours" in impls:
        from pathbench.kernels import triton_path

        for key, cfg in sorted(triton_path.chosen_configs().items(), key=str):
            own = triton_path.DEFAULT_SETTINGS.kernel_launch_table(cfg[0], key[1], key[2]) is not None
            echo(f"ours: configuration {cfg} (BT, warps, stages) for {key}"
                       + ("; each kernel's own warps and stages" if own else ""))
    echo(f"wrote {out / 'kernel_bench.csv'} and {out / 'kernel_bench.png'}")
