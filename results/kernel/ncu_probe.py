"""Hardware counters of one forward+backward, ours and SDPA's, read by Nsight Compute (ncu).

Where each kernel of a call stands against the GPU's ceilings: its bytes to and from DRAM,
its DRAM and SM throughput (percent of peak), its tensor-core operations and occupancy. Run on a
GPU from the repository root, one process a shape and implementation under ncu, then the table:

    M=$(python3 results/kernel/ncu_probe.py metrics)
    ncu --clock-control none --profile-from-start off --print-units base --metrics $M \
        --csv --page raw --log-file ncu_ours_D64_T4096_H32_B4.csv \
        python3 results/kernel/ncu_probe.py run ours 64 4096 32 4
    python3 results/kernel/ncu_probe.py table ncu_*.csv
    python3 results/kernel/ncu_probe.py sums ncu_*.csv

`run` compiles and warms up the call, then profiles one call between cudaProfilerStart and
cudaProfilerStop. ncu replays each kernel once a counter pass with the caches flushed, so its
durations are each kernel's alone, from cold caches. The tensor-core counters count math
operations as ncu defines them; the SDPA rows, beside the nominal FLOPs of causal attention
(7 B H T^2 D for fwd+bwd), calibrate them.
"""

import csv
import re
import subprocess
import sys

# wanted counters; `metrics` keeps those this GPU's ncu knows
METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "lts__t_bytes.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "sm__ops_path_tensor_src_fp16.sum",  # float16 sources, any accumulator
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
    "launch__registers_per_thread",
]

TENSOR_PIPE = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed"

# the rows of `sums`: our kernels in the order a fwd+bwd runs them (kernel_resources.NAMES'
# short names), then SDPA's, then the rest
SUM_ROWS = ["prep_fwd", "edges_fwd", "fwd", "within", "cross_q", "cross_kv", "edges_bwd", "prep_bwd",
            "forward", "backward", "torch operations", "other kernels"]


def metrics():
    """The wanted counters that this GPU's ncu lists (a short safe list if it cannot list them)."""
    query = subprocess.run(["ncu", "--query-metrics"], capture_output=True, text=True)
    names = {line.split()[0] for line in query.stdout.splitlines() if line.strip()}
    known = [m for m in METRICS if m.split(".")[0] in names]
    print(",".join(known or METRICS[:3]))


def run(impl, D, T, H, B):
    import torch

    from pathbench.kernels.bench_kernel import _fns, _inputs

    args = [x.requires_grad_(True) for x in _inputs(B, T, H, D, "cuda")]
    _, fwd_bwd, leaves = _fns(impl, args, D ** -0.5)
    for _ in range(3):
        fwd_bwd()
    for x in leaves:  # as the benchmark times it: gradients set, not added to earlier ones
        x.grad = None
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fwd_bwd()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def _number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:  # n/a
        return None


def _rows(path):
    """ncu's raw CSV: a header of metric names, a row of units, then one row a kernel launch."""
    with open(path) as f:
        lines = [line for line in f if not line.startswith("==")]
    table = list(csv.reader(lines[next(i for i, line in enumerate(lines) if line.startswith('"ID"')):]))
    header, units = table[0], table[1]
    scale = {"ns": 1e-6, "byte": 1e-6}  # ncu's base units (--print-units base) to ms and MB
    rows = []
    for values in table[2:]:
        row = dict(zip(header, values))
        out = {"name": row["Kernel Name"]}
        for name, unit in zip(header, units):
            value = _number(row[name]) if name in METRICS else None
            if value is not None:
                out[name] = value * scale.get(unit, 1.0)  # times in ms, bytes in MB
        rows.append(out)
    return rows


def _sum(row, names):
    """The sum of those counters the row has, or None where it has none of them."""
    values = [row[m] for m in names if m in row]
    return sum(values) if values else None


def _short_name(name):
    """One of our kernels' short names (as resources.log has them) for a launch's kernel name,
    or None for any other kernel."""
    from kernel_resources import NAMES

    return next((short for full, short in NAMES.items() if full in name), None)


def _kernel_label(name):
    return _short_name(name) or name.split("(")[0][-48:]


def _shape(path):
    impl, d, t, h, b = re.search(r"ncu_(\w+?)_D(\d+)_T(\d+)_H(\d+)_B(\d+)", path).groups()
    return impl, *map(int, (d, t, h, b))


def _dram_mb(row):
    return row.get("dram__bytes_read.sum", 0.0) + row.get("dram__bytes_write.sum", 0.0)


def _tensor_ops(row):
    return _sum(row, [m for m in METRICS if m.startswith("sm__ops_path_tensor")])


def table(paths):
    cols = [("ms", "gpu__time_duration.sum", "{:.3f}"),
            ("DRAM MB", None, "{:.0f}"),
            ("DRAM TB/s", None, "{:.2f}"),
            ("DRAM %", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "{:.0f}"),
            ("SM %", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "{:.0f}"),
            ("tensor Tops/s", None, "{:.0f}"),
            ("tensor pipe %", TENSOR_PIPE, "{:.0f}"),
            ("L2 MB", "lts__t_bytes.sum", "{:.0f}"),
            ("local MB", None, "{:.0f}"),
            ("occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active", "{:.0f}"),
            ("regs", "launch__registers_per_thread", "{:.0f}")]
    for path in paths:
        impl, D, T, H, B = _shape(path)
        print(f"\n{impl}, D={D} T={T} H={H} B={B}: one fwd+bwd, each kernel alone from cold caches")
        print("| kernel | " + " | ".join(c[0] for c in cols) + " |")
        print("|---" * (len(cols) + 1) + "|")
        total_ms = total_dram = total_ops = 0.0
        for r in _rows(path):
            ms = r.get("gpu__time_duration.sum", 0.0)
            dram = _dram_mb(r)
            ops = _tensor_ops(r)
            local = _sum(r, ["l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
                             "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"])
            derived = {"DRAM MB": dram, "DRAM TB/s": dram / ms * 1e-3 if ms else None,
                       "tensor Tops/s": ops / ms * 1e-9 if ms and ops is not None else None,
                       "local MB": local}
            cells = []
            for title, metric, fmt in cols:
                value = derived[title] if metric is None else r.get(metric)
                cells.append("-" if value is None else fmt.format(value))
            print(f"| {_kernel_label(r['name'])} | " + " | ".join(cells) + " |")
            total_ms, total_dram, total_ops = total_ms + ms, total_dram + dram, total_ops + (ops or 0.0)
        print(f"all kernels: {total_ms:.3f} ms, {total_dram:.0f} MB to and from DRAM "
              f"({total_dram / total_ms * 1e-3:.2f} TB/s), {total_ops:.3g} tensor operations "
              f"({total_ops / total_ms * 1e-9:.0f} T/s); causal attention's nominal fwd+bwd FLOPs, "
              f"7 B H T^2 D = {7 * B * H * T * T * D:.3g}")


def _group(impl, name):
    """The row of the per-kernel sums that a launch adds to: one of our kernels by its short
    name, SDPA's forward or backward, or the rest (torch operations around our kernels, SDPA's
    two small kernels)."""
    if impl == "ours":
        return _short_name(name) or "torch operations"
    for part, group in (("fprop", "forward"), ("bprop", "backward")):
        if part in name:
            return group
    return "other kernels"


def sums(paths):
    """Each kernel's launches summed, one table a file: ms, DRAM GB, tensor operations a second,
    and the tensor pipe's busiest launch (the tables under "Where the time goes")."""
    for path in paths:
        impl, D, T, H, B = _shape(path)
        print(f"\n{impl}, D={D} T={T} H={H} B={B}: each kernel's launches in one fwd+bwd, summed")
        print("| kernel | launches | ms | DRAM GB | tensor Tops/s | tensor pipe % (busiest launch) |")
        print("|---|---|---|---|---|---|")
        groups = {}
        for r in _rows(path):
            g = groups.setdefault(_group(impl, r["name"]), dict(n=0, ms=0.0, mb=0.0, ops=0.0, pipe=None))
            g["n"] += 1
            g["ms"] += r.get("gpu__time_duration.sum", 0.0)
            g["mb"] += _dram_mb(r)
            g["ops"] += _tensor_ops(r) or 0.0
            if TENSOR_PIPE in r:
                g["pipe"] = max(g["pipe"] or 0.0, r[TENSOR_PIPE])
        total = dict(n=0, ms=0.0, mb=0.0, ops=0.0, pipe=None)
        for name in sorted(groups, key=SUM_ROWS.index):
            g = groups[name]
            for key in ("n", "ms", "mb", "ops"):
                total[key] += g[key]
            print(_sums_row(name, g))
        print(_sums_row("**all kernels**", total))


def _sums_row(name, g):
    rate = f"{g['ops'] / g['ms'] * 1e-9:.0f}" if g["ops"] and g["ms"] else "-"
    pipe = "-" if g["pipe"] is None else f"{g['pipe']:.0f}"
    return f"| {name} | {g['n']} | {g['ms']:.3f} | {g['mb'] * 1e-3:.2f} | {rate} | {pipe} |"


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "metrics":
        metrics()
    elif mode == "run":
        run(sys.argv[2], *map(int, sys.argv[3:7]))
    elif mode == "sums":
        sums(sys.argv[2:])
    else:
        table(sys.argv[2:])
