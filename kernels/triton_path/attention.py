"""PaTH attention on the Triton kernels: the forward and backward passes composed from the stage
launchers, the autograd Function, the operators torch.compile sees, and the public call."""

from __future__ import annotations

import math
import os

import torch

from .settings import DEFAULT_SETTINGS, SUPPORTED_HEAD_DIMS, KernelSettings, with_fallback

try:
    from .bwd_across import cross_kv_scan, cross_q_scan
    from .bwd_within import within_scan
    from .common import dot_precision, dummy, inversion_precision, product_dtype, storage_dtype
    from .edges import chunk_edges, chunk_edges_backward
    from .fwd_scan import forward_scan
    from .prep_bwd import prep_backward
    from .prep_fwd import prep_forward

    HAVE_TRITON = True
except ModuleNotFoundError as exc:  # triton is a dependency on Linux only
    if exc.name != "triton":
        raise
    HAVE_TRITON = False

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# Every kernel gives the (batch, head) pairs the second dimension of its grid, which CUDA caps
# at this; more pairs (a pack of 64 runs of 256 sequences and 4 heads has 65,536) are
# computed a slice of the batch at a time.
MAX_HEAD_PROGRAMS = 65535


def _batch_slices(B: int, H: int) -> list[slice]:
    step = max(1, MAX_HEAD_PROGRAMS // H)
    return [slice(start, start + step) for start in range(0, B, step)]


def _rows(x, rows: slice):
    """x's batch rows ``rows`` (x a tensor, batch first, a tuple of such, or None)."""
    if isinstance(x, tuple):
        return tuple(_rows(item, rows) for item in x)
    return None if x is None else x[rows]


def _joined(parts: list):
    """The slices' results put back together along the batch (tensors, tuples, None)."""
    first = parts[0]
    if isinstance(first, tuple):
        return tuple(_joined(list(group)) for group in zip(*parts))
    return None if first is None else torch.cat(parts)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _to_blocks(x: torch.Tensor, Tp: int, dtype=torch.float32) -> torch.Tensor:
    """[B, T, H, ...] -> [B, H, Tp, ...] in dtype, zero padded at the end of time."""
    x = x.to(dtype).transpose(1, 2)
    pad = Tp - x.shape[2]
    if pad:
        spec = [0, 0] * (x.dim() - 3) + [0, pad]
        x = torch.nn.functional.pad(x, spec)
    return x


def _in_place(x, dtype):
    """A [B, T, H, D] input in dtype as the within-chunk scan reads it, in place: (x, its strides
    of batch, time and head), its rows unit-strided."""
    x = x.to(dtype)
    if x.stride(3) != 1:
        x = x.contiguous()
    return x, x.stride(0), x.stride(1), x.stride(2)


def _sum_programs(x: torch.Tensor, programs: int) -> torch.Tensor:
    """The sum over dim 2 of the partial sums of a scan's programs, in a fixed order (so the
    gradients are reproducible); a view when there is one program."""
    return x[:, :, 0] if programs == 1 else x.sum(2)


def _kernel_inputs(q, k, w, beta):
    """q, k, w, beta contiguous in the [B, T, H(, D)] layout, in dtypes the kernels load.

    w and beta go to float32; q and k keep their dtype (bfloat16 becomes float32 under the CPU
    interpreter, which has no bfloat16 arithmetic)."""
    if q.device.type != "cuda" and q.dtype == torch.bfloat16:
        q, k = q.float(), k.float()
    q, k = q.contiguous(), k.contiguous()
    if w is not None:
        w, beta = w.float().contiguous(), beta.float().contiguous()
    return q, k, w, beta


def _gate_cumsum(log_fgate, Tp):
    """G = cumsum(log_fgate) in blocks, in base 2 (times log2(e)), as the kernels' logits are."""
    if log_fgate is None:
        return None
    return (torch.cumsum(_to_blocks(log_fgate, Tp), dim=-1) * math.log2(math.e)).contiguous()


def _forward(q, k, v, w, beta, log_fgate, scale, settings, keep=False):
    """(O, LSE, kept): O [B, H, T, D] in q's dtype, LSE [B, H, T] (float32, base 2); with keep,
    kept is the block-local results (Qt, Kt, M, SI, X) for the backward, else None."""
    B, T, H, D = q.shape
    if B * H > MAX_HEAD_PROGRAMS:
        return _joined([_forward(*_rows((q, k, v, w, beta, log_fgate), rows), scale, settings,
                                 keep) for rows in _batch_slices(B, H)])
    dev = q.device
    sd = storage_dtype(q)
    has_hh, has_gate = w is not None, log_fgate is not None
    qk, kk, wk, bk = _kernel_inputs(q, k, w, beta)
    prec = dot_precision(q.dtype, dev)
    half = settings.half_blocks(qk.dtype, D)  # for the dtype the preprocessing reads

    def launch(BT, num_warps, num_stages):
        N = -(-T // BT)
        Tp = N * BT
        C = settings.forward_chunk(N, BT, D, dev)
        Gf = _gate_cumsum(log_fgate, Tp)

        def opts(kernel):
            return settings.launch_options(kernel, BT, D, q.dtype, num_warps, num_stages)

        Qt, Kt, Mb, SI, X = prep_forward(qk, kk, wk, bk, Gf, scale, BT, N, prec, sd, half, opts("prep_fwd"), keep)
        Qs, Kc, Mc = Qt, Kt, None
        if has_hh and N > C:
            Qs, Kc, Mc, _, _ = chunk_edges(Qt, Kt, Mb, C, prec, settings.half_blocks(Mb.dtype, D), opts("edges_fwd"))
        O, LSE = forward_scan(Qt, Qs, Kt, Kc, _to_blocks(v, Tp, sd).contiguous(), Mb, Mc, Gf, SI, C, scale,
                              settings.query_blocks("fwd", D, N), q.dtype, prec, q.dtype != torch.float32,
                              opts("fwd"))
        return O[:, :, :T], LSE[:, :, :T], (Qt, Kt, Mb, SI, X) if keep else None

    return with_fallback("fwd", q, has_hh, has_gate, settings, launch)


def _across_chunks(C, Qt, Kt, Mb, V, dO, G, lse, delta, dQt, dKt, dV, dM, dGrow, dGcol, *, scale, scan, adj16,
                   opts, replay_dtype, settings):
    """Add the gradients of the pairs of blocks in different chunks of C blocks (the chunk edges,
    the queries-first and keys-first scans, and the chunk edges' backward) into dQt, dKt, dV, dM,
    dGrow and dGcol, all [B, H, Tp, ...] in place; queries cross to their chunk's start, keys to
    their chunk's end. Mb, G, dM and dGcol may be stubs."""
    B, H, Tp, D = Qt.shape
    BT, has_hh, prec = scan["BT"], scan["HAS_HH"], scan["PREC"]
    N = Tp // BT
    NC = -(-N // C)
    dev = Qt.device
    half = has_hh and settings.half_blocks(Mb.dtype, D)
    if has_hh:
        Qs, Kc, Mc, PS, SS = chunk_edges(Qt, Kt, Mb, C, prec, half, opts("edges_fwd"), save=True)
    else:
        Qs, Kc, Mc = Qt, Kt, dummy(dev)
    # dQs and dL/dMc (queries first, QB blocks at a time), NGq programs per head with their own
    # partial sums
    QB = settings.query_blocks("cross_q", D, N)
    NGq = settings.num_groups(-(-(N - C) // QB), B * H, dev, opts("cross_q").get("num_warps"))
    dQs, dMcp = cross_q_scan(Qs, Kc, V, Mc, G, lse, dO, delta, dGrow, C, NGq, QB, scale, adj16, scan, replay_dtype,
                             opts("cross_q"))
    if has_hh:
        dMc = _sum_programs(dMcp, NGq)
        chunk_edges_backward(Qt, Mb, PS, dQs, dMc.contiguous(), dQt, dM, C, prec, half, opts("edges_bwd"))
        del dMc, dMcp, PS
    else:
        dQt[:, :, C * BT:] += dQs[:, :, C * BT:]
    del dQs
    # dKc and the rest of dV (keys first)
    NGk = settings.num_groups((NC - 1) * C, B * H, dev, opts("cross_kv").get("num_warps"))
    dKc = cross_kv_scan(Qs, Kc, V, Mc, G, lse, dO, delta, dV, dGcol, C, NGk, scale, scan, replay_dtype,
                        opts("cross_kv"))
    if has_hh:
        chunk_edges_backward(Kt, Mb, SS, dKc, None, dKt, dM, C, prec, half, opts("edges_bwd"))
    else:
        dKt[:, :, :(NC - 1) * C * BT] += dKc[:, :, :(NC - 1) * C * BT]


def _backward(q, k, v, w, beta, log_fgate, scale, O, LSE, grad_out, settings, kept=None):
    """Gradients (dq, dk, dv, dw, dbeta, dlog_fgate): dq and dk in q's dtype, dv in v's dtype and
    layout, the rest in float32, dlog_fgate in log_fgate's layout (None where an input is None).
    kept: the forward's block-local results, used when its blocks were the backward's; their
    intra-block logits are overwritten with their gradient."""
    B, T, H, D = q.shape
    if B * H > MAX_HEAD_PROGRAMS:
        return _joined([
            _backward(*_rows((q, k, v, w, beta, log_fgate), rows), scale,
                      *_rows((O, LSE, grad_out), rows), settings, _rows(kept, rows))
            for rows in _batch_slices(B, H)])
    dev = q.device
    sd = storage_dtype(q)
    has_hh, has_gate = w is not None, log_fgate is not None
    qk, kk, wk, bk = _kernel_inputs(q, k, w, beta)
    prec = dot_precision(q.dtype, dev)
    if not (O.stride(0) == H * O.stride(1) and O.stride(2) == D and O.stride(3) == 1):
        O = O.contiguous()  # the within-chunk scan reads O's rows in place, heads O.stride(1) apart
    # the kept results serve one attempt at most: the within-chunk scan overwrites their logits
    unused = [kept] if kept is not None else []

    def launch(BT, num_warps, num_stages):
        N = -(-T // BT)
        Tp = N * BT
        levels = settings.chunk_levels(N, BT, D, dev, settings.one_chunk_tokens)
        C = levels[0]
        NC = -(-N // C)
        pad = (0, Tp - T)
        Gf = _gate_cumsum(log_fgate, Tp)
        f32 = dict(dtype=torch.float32, device=dev)

        def opts(kernel):
            return settings.launch_options(kernel, BT, D, q.dtype, num_warps, num_stages)

        # the constexprs the three backward scans share
        scan = dict(D=D, BT=BT, HAS_HH=has_hh, HAS_GATE=has_gate, PREC=prec, HH16=q.dtype != torch.float32)
        adj16 = q.dtype != torch.float32 and D in settings.half_adjoint_head_dims  # back_across
        # the block-local results: the forward's when its blocks were these, else computed again
        kept_now = unused.pop() if unused else None
        if kept_now is not None and kept_now[3].shape[2:] == (N, BT, BT):
            Qt, Kt, Mb, SI, XB = kept_now
        else:
            Qt, Kt, Mb, SI, XB = prep_forward(qk, kk, wk, bk, Gf, scale, BT, N, prec, sd,
                                              settings.half_blocks(qk.dtype, D), opts("prep_fwd"), True)
        # the within-chunk scan reads v and dO in place; the scans across chunks, in blocks
        V, *vs = _in_place(v, sd)
        dO, *dos = _in_place(grad_out, sd)
        delta = torch.empty(B, H, Tp, **f32)  # rowsum(dO o O), written by the within-chunk scan
        lse = torch.nn.functional.pad(LSE, pad).contiguous()
        stub = dummy(dev)
        G = Gf if has_gate else stub

        # 1. pairs of blocks within a chunk, query blocks QBw at a time: NGw programs per chunk
        # (several only when one chunk spans the sequence)
        QBw = settings.query_blocks("within", D, N)
        NGw = settings.num_groups(-(-N // QBw), B * H, dev, opts("within").get("num_warps")) if NC == 1 else 1
        dQt = torch.empty(B, H, Tp, D, **f32)
        # (the scan sets every sum that is read afterwards: no zeros here)
        dKt = torch.empty(B, H, Tp, D, **f32)
        dV = torch.empty(B, H, Tp, D, **f32)
        dM = torch.empty(B, H, N, D, D, **f32) if has_hh else stub
        dGrow = torch.empty(B, H, Tp, **f32)
        dGcol = torch.empty(B, H, Tp, **f32) if has_gate else stub
        within_scan(Qt, Kt, V, vs, dO, dos, O, Mb if has_hh else stub, G, SI, lse, delta, dQt, dKt, dV, dM, dGrow,
                    dGcol, T, C, NGw, QBw, scale, adj16, scan, product_dtype(q), opts("within"))
        dSI = SI  # the intra-block logits' gradient overwrote them

        # 2. pairs across chunks, level by level; an outer level's chunks are sequences of their own
        if N > C:
            V = _to_blocks(V, Tp, sd).contiguous()  # V and dO are in sd already: one cast at most
            dO = _to_blocks(dO, Tp, sd).contiguous()
            for level, span in zip(levels, levels[1:] + (N,)):
                # (no name holds the tensors: step 3 frees some of them early)
                _across_chunks(level, *(x if x is stub else x.view(1, B * H * N // span, -1, *x.shape[3:])
                                        for x in (Qt, Kt, Mb if has_hh else stub, V, dO, G, lse, delta,
                                                  dQt, dKt, dV, dM, dGrow, dGcol)),
                               scale=scale, scan=scan, adj16=adj16, opts=opts, replay_dtype=product_dtype(q),
                               settings=settings)

        # 3. the block-local algebra; dv's float32 sums go first, as dv in v's dtype and layout
        # (a gradient in another layout than its input's is copied again by autograd)
        del V, dO, delta, lse
        dv = torch.empty_like(v).copy_(dV[:, :, :T].transpose(1, 2))
        del dV
        dq = torch.empty(B, T, H, D, **f32)
        dk = torch.empty(B, T, H, D, **f32)
        dw = torch.empty(B, T, H, D, **f32) if has_hh else stub
        dbeta = torch.empty(B, T, H, **f32) if has_hh else stub
        dGl = torch.empty(B, H, Tp, **f32) if has_gate else stub
        # three parts (see prep_bwd_kernel), in order; without w only part 0 has work. dq and dk
        # sum in float32, and the part that completes each writes it in the kernels' q dtype: its
        # buffer comes just before that part, and dQt and dq's sums go right after it
        dQWK = torch.empty(B, H, N, BT, BT, **f32) if has_hh else stub  # partial sums between parts
        done_q, done_k = (1, 2) if has_hh else (0, 0)
        dq_out = dk_out = stub
        for part in range(3 if has_hh else 1):
            if part == done_q:
                dq_out = dq if qk.dtype == torch.float32 else torch.empty_like(dq, dtype=qk.dtype)
            if part == done_k:
                dk_out = dk if qk.dtype == torch.float32 else torch.empty_like(dk, dtype=qk.dtype)
            prep_backward(part, qk, kk, wk if has_hh else stub, bk if has_hh else stub,
                          dQt, dKt, dSI, dM if has_hh else stub, XB if has_hh else stub, dQWK,
                          dq, dk, dq_out, dk_out, dw, dbeta, dGl, scale,
                          has_hh=has_hh, has_gate=has_gate, prec=prec, xprec=inversion_precision(q.dtype, dev),
                          half=settings.half_blocks(q.dtype, D), launch_opts=opts("prep_bwd"))
            if part == done_q:
                dQt = dq = stub
        dlf = None
        if has_gate:
            dG = (dGrow + dGcol + dGl)[:, :, :T]  # dL/dG, G = cumsum(log_fgate)
            dlf = torch.empty_like(log_fgate, dtype=torch.float32)  # in log_fgate's layout
            dlf.copy_(dG.flip(-1).cumsum(-1).flip(-1).transpose(1, 2))
        if not has_hh:
            dw = dbeta = None
        return dq_out.to(q.dtype), dk_out.to(q.dtype), dv, dw, dbeta, dlf

    return with_fallback("bwd", q, has_hh, has_gate, settings, launch)


class _PathAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w, beta, log_fgate, scale, grad_needed, settings):
        # the block-local algebra must stay in float32 whatever autocast says
        keep = settings.keep_preprocessing and grad_needed
        with torch.autocast(q.device.type, enabled=False), torch.no_grad():
            O, LSE, kept = _forward(q, k, v, w, beta, log_fgate, scale, settings, keep)
        ctx.save_for_backward(q, k, v, w, beta, log_fgate, O, LSE, *(kept or (None,) * 5))
        ctx.scale = scale
        ctx.settings = settings
        ctx.kept_spent = False
        return O.transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, w, beta, log_fgate, O, LSE, *kept = ctx.saved_tensors
        # the backward overwrites the kept intra-block logits with their gradient: a second
        # backward (retain_graph) computes the block-local algebra again
        kept = None if kept[0] is None or ctx.kept_spent else tuple(kept)
        ctx.kept_spent = True
        with torch.autocast(q.device.type, enabled=False):
            grads = _backward(q, k, v, w, beta, log_fgate, ctx.scale, O, LSE, grad_out, ctx.settings, kept)
        like = (q, k, v, w, beta, log_fgate)
        return tuple(None if g is None else g.to(x.dtype) for g, x in zip(grads, like)) + (None, None, None)


def takes(q) -> bool:
    """Whether the kernel takes queries of q's head size and dtype (path_attention's "auto"
    backend runs the torch implementation for those it does not)."""
    return q.dim() == 4 and q.shape[-1] in SUPPORTED_HEAD_DIMS and q.dtype in _FLOATS


def _check(q, k, v, w, beta, log_fgate):
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, D], got shape {tuple(q.shape)}")
    B, T, H, D = q.shape
    if T < 1:
        raise ValueError("sequence length must be at least 1")
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"head size D={D} is not supported by the Triton PaTH kernel; supported: {SUPPORTED_HEAD_DIMS}")
    for name, x in (("k", k), ("v", v)):
        if tuple(x.shape) != tuple(q.shape):
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected q's shape {tuple(q.shape)} ([B, T, H, D])")
    if (w is None) != (beta is None):
        raise ValueError("w and beta must be given together (PaTH) or both be None (FoX / plain softmax)")
    if w is not None:
        if tuple(w.shape) != tuple(q.shape):
            raise ValueError(f"w has shape {tuple(w.shape)}, expected {tuple(q.shape)} ([B, T, H, D])")
        if tuple(beta.shape) != (B, T, H):
            raise ValueError(f"beta has shape {tuple(beta.shape)}, expected {(B, T, H)} ([B, T, H])")
    if log_fgate is not None and tuple(log_fgate.shape) != (B, T, H):
        raise ValueError(f"log_fgate has shape {tuple(log_fgate.shape)}, expected {(B, T, H)} ([B, T, H])")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype not in _FLOATS:
            raise ValueError(f"{name} has dtype {x.dtype}; supported: float32, float16, bfloat16")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, x in (("w", w), ("beta", beta), ("log_fgate", log_fgate)):
        if x is not None and not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    tensors = [x for x in (q, k, v, w, beta, log_fgate) if x is not None]
    if len({x.device for x in tensors}) != 1:
        raise ValueError("all inputs must be on one device")
    dev = q.device
    if not HAVE_TRITON:
        raise RuntimeError("the Triton PaTH kernel needs the 'triton' package")
    if dev.type == "cuda":
        if _interpreting():
            raise RuntimeError("TRITON_INTERPRET=1 is set: the Triton kernel runs only on CPU tensors then")
    elif dev.type == "cpu":
        if not _interpreting():
            raise RuntimeError(
                "the Triton PaTH kernel needs CUDA tensors (or CPU tensors with TRITON_INTERPRET=1 set "
                "before pathbench.kernels.triton_path is imported); use backend='torch' on the CPU"
            )
    else:
        raise RuntimeError(f"the Triton PaTH kernel supports CUDA tensors, not device {dev.type!r}")


def path_attention_triton(q, k, v, w=None, beta=None, log_fgate=None, scale=None,
                          settings: KernelSettings | None = None):
    """PaTH / PaTH-FoX / FoX attention output [B, T, H, D] on the Triton kernels (autograd-aware).

    w/beta None drops the Householder part (FoX, or plain causal softmax without a gate);
    log_fgate None drops the forget gate. scale defaults to D**-0.5. settings: the launch
    settings (DEFAULT_SETTINGS if None).

    Under torch.compile the kernels are the opaque operators pathbench::path_attention_forward
    and pathbench::path_attention_backward, so a compiled model stays one graph; they run the
    default settings, and their backward computes the block-local algebra again instead of
    keeping it from the forward.
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if torch.compiler.is_compiling():
        if settings is not None and settings is not DEFAULT_SETTINGS:
            raise ValueError("under torch.compile the kernels run the default settings")
        O, _ = torch.ops.pathbench.path_attention_forward(q, k, v, w, beta, log_fgate, float(scale))
        return O.transpose(1, 2)
    _check(q, k, v, w, beta, log_fgate)
    grad_needed = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, w, beta, log_fgate))
    return _PathAttention.apply(q, k, v, w, beta, log_fgate, float(scale), grad_needed,
                                DEFAULT_SETTINGS if settings is None else settings)


# The operators torch.compile sees. The forward gives O [B, H, T, D] and the log-sum-exp of
# the logits [B, H, T] (float32), which the backward needs; the backward gives the gradients
# of q, k, v, w, beta and log_fgate in float32, an empty tensor for an input that is None.
@torch.library.custom_op(
    "pathbench::path_attention_forward", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor? w, Tensor? beta, Tensor? log_fgate, "
           "float scale) -> (Tensor, Tensor)")
def _forward_op(q, k, v, w, beta, log_fgate, scale):
    _check(q, k, v, w, beta, log_fgate)
    with torch.autocast(q.device.type, enabled=False):
        O, LSE, _ = _forward(q, k, v, w, beta, log_fgate, scale, DEFAULT_SETTINGS)
    return O.contiguous(), LSE.contiguous()


@_forward_op.register_fake
def _forward_op_fake(q, k, v, w, beta, log_fgate, scale):
    B, T, H, D = q.shape
    return q.new_empty(B, H, T, D), q.new_empty(B, H, T, dtype=torch.float32)


@torch.library.custom_op(
    "pathbench::path_attention_backward", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor? w, Tensor? beta, Tensor? log_fgate, "
           "Tensor O, Tensor LSE, Tensor grad_out, float scale) -> Tensor[]")
def _backward_op(q, k, v, w, beta, log_fgate, O, LSE, grad_out, scale):
    with torch.autocast(q.device.type, enabled=False):
        grads = _backward(q, k, v, w, beta, log_fgate, scale, O, LSE, grad_out, DEFAULT_SETTINGS)
    return [q.new_empty(0, dtype=torch.float32) if g is None else g.contiguous() for g in grads]


@_backward_op.register_fake
def _backward_op_fake(q, k, v, w, beta, log_fgate, O, LSE, grad_out, scale):
    return [x.new_empty(x.shape) for x in (q, k, v)] + [
        q.new_empty(0, dtype=torch.float32) if x is None else x.new_empty(x.shape, dtype=torch.float32)
        for x in (w, beta, log_fgate)]


def _forward_op_setup(ctx, inputs, output):
    q, k, v, w, beta, log_fgate, scale = inputs
    O, LSE = output
    ctx.mark_non_differentiable(LSE)  # the backward's input, not a result to train through
    ctx.save_for_backward(q, k, v, w, beta, log_fgate, O, LSE)
    ctx.scale = scale


def _forward_op_backward(ctx, grad_O, grad_LSE):
    q, k, v, w, beta, log_fgate, O, LSE = ctx.saved_tensors
    grads = torch.ops.pathbench.path_attention_backward(
        q, k, v, w, beta, log_fgate, O, LSE, grad_O.transpose(1, 2), ctx.scale)
    inputs = (q, k, v, w, beta, log_fgate)
    return tuple(None if x is None else g.to(x.dtype) for g, x in zip(grads, inputs)) + (None,)


torch.library.register_autograd("pathbench::path_attention_forward", _forward_op_backward,
                                setup_context=_forward_op_setup)
