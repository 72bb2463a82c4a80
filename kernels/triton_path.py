"""Triton PaTH attention: forward and backward, optional forget gate, FoX on the same kernels.

Layout at the API: q, k, v, w are [B, T, H, D]; beta and log_fgate are [B, T, H]. The logit of
query i and key j <= i is scale * q_i^T H_i ... H_{j+1} k_j + (G_i - G_j) with
H_t = I - beta_t w_t w_t^T and G = cumsum(log_fgate) (ATTENTION.md).

Algorithm (blocks of BT tokens, ATTENTION.md "blockwise algorithm"):

* Block-local algebra, in float32 torch (differentiated by autograd in the backward): per block
  the UT matrix A = (I + strictly_lower(diag(beta) W W^T))^{-1} diag(beta) by one batched
  triangular solve, U = A W (so the block's product is P = I - W^T U), the queries moved to
  the block start (Qt = Q - (Q W^T o [s <= i]) U), the keys moved to the block end
  (Kt = K - (K W^T o [t > j]) A^T W) and the intra-block logits.  This is O(T * BT * D) work.
* Forward kernel: one program per (query block, batch*head). Online softmax over the
  intra-block logits, then over the key blocks from right to left; after each key block the
  running queries r are carried across that block: r <- r - (r W^T) U.
* Backward kernel: a program owns a set of query blocks (I = g, g + NG, ...). For each it
  replays the right-to-left carry of r once, keeping every r in a scratch buffer it owns, then
  walks the key blocks left to right: the gradient of r is carried back across each block
  (dr <- dr - (dr U^T) W) while dL/dP of the block (r^T dr, a D x D matrix), dKt, dV and the
  gate's column sums go to per-program partial buffers. Partials are summed in torch in a
  fixed order, so gradients are bitwise reproducible (no atomics). dL/dP gives dW and dU;
  autograd through the block-local algebra gives dq, dk, dw, dbeta and dlog_fgate.

Everything accumulates in float32; the factored products (W, U) are kept in float32.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dependency on Linux
    triton = None
    tl = None

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_KERNELS = None


def _kernels():
    """Define (decorate) the kernels on first use: triton reads TRITON_INTERPRET at decoration."""
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS

    @triton.jit
    def _path_fwd_kernel(
        QT, KT, V, W, U, G, SI, O, LSE,
        N, scale,
        D: tl.constexpr, BT: tl.constexpr,
        HAS_HH: tl.constexpr, HAS_GATE: tl.constexpr, PREC: tl.constexpr,
    ):
        ib = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        Tp = N * BT
        rows = tl.arange(0, BT)
        cols = tl.arange(0, D)
        base = bh * Tp * D
        offs_i = ib * BT + rows
        tile_i = base + offs_i[:, None] * D + cols[None, :]

        # the query block's own keys: logits come precomputed (scale and gate included)
        s = tl.load(SI + (bh * N + ib) * BT * BT + rows[:, None] * BT + rows[None, :])
        s = tl.where(rows[None, :] <= rows[:, None], s, float("-inf"))
        m = tl.max(s, 1)
        p = tl.exp(s - m[:, None])
        l = tl.sum(p, 1)
        v = tl.load(V + tile_i).to(tl.float32)
        acc = tl.dot(p, v, input_precision=PREC)

        r = tl.load(QT + tile_i).to(tl.float32)
        if HAS_GATE:
            gq = tl.load(G + bh * Tp + offs_i)
        for jj in range(0, ib):
            jb = ib - 1 - jj
            offs_j = jb * BT + rows
            tile_j = base + offs_j[:, None] * D + cols[None, :]
            kt = tl.load(KT + tile_j).to(tl.float32)
            s = tl.dot(r, tl.trans(kt), input_precision=PREC) * scale
            if HAS_GATE:
                gk = tl.load(G + bh * Tp + offs_j)
                s += gq[:, None] - gk[None, :]
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, 1)
            v = tl.load(V + tile_j).to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PREC)
            m = m_new
            if HAS_HH:
                wj = tl.load(W + tile_j)
                uj = tl.load(U + tile_j)
                rw = tl.dot(r, tl.trans(wj), input_precision=PREC)
                r = r - tl.dot(rw, uj, input_precision=PREC)
        o = acc / l[:, None]
        tl.store(O + tile_i, o.to(O.dtype.element_ty))
        tl.store(LSE + bh * Tp + offs_i, m + tl.log(l))

    @triton.jit
    def _path_bwd_kernel(
        QT, KT, V, W, U, G, SI, LSE, DO, DELTA,
        DQT, DKP, DVP, DPP, DGROW, DGCOLP, DSI, RS,
        N, NG, scale,
        D: tl.constexpr, BT: tl.constexpr,
        HAS_HH: tl.constexpr, HAS_GATE: tl.constexpr, PREC: tl.constexpr,
    ):
        g = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        Tp = N * BT
        rows = tl.arange(0, BT)
        cols = tl.arange(0, D)
        base = bh * Tp * D
        own = bh * NG + g  # this program's slot in the partial buffers
        pbase = own * Tp * D
        gbase = own * Tp
        dpbase = own * N * D * D
        dd = cols[:, None] * D + cols[None, :]
        causal = rows[None, :] <= rows[:, None]

        for ib in range(g, N, NG):
            offs_i = ib * BT + rows
            tile_i = offs_i[:, None] * D + cols[None, :]
            do = tl.load(DO + base + tile_i).to(tl.float32)
            delta = tl.load(DELTA + bh * Tp + offs_i)
            lse = tl.load(LSE + bh * Tp + offs_i)

            # the query block's own keys
            si_ptr = (bh * N + ib) * BT * BT + rows[:, None] * BT + rows[None, :]
            s = tl.load(SI + si_ptr)
            p = tl.where(causal, tl.exp(s - lse[:, None]), 0.0)
            v = tl.load(V + base + tile_i).to(tl.float32)
            dp = tl.dot(do, tl.trans(v), input_precision=PREC)
            ds = p * (dp - delta[:, None])
            tl.store(DSI + si_ptr, ds)
            dv_part = tl.load(DVP + pbase + tile_i)
            tl.store(DVP + pbase + tile_i, dv_part + tl.dot(tl.trans(p), do, input_precision=PREC))

            qt = tl.load(QT + base + tile_i).to(tl.float32)
            r = qt
            if HAS_HH:
                # replay the forward carry of the queries, keeping each position
                for jj in range(0, ib):
                    jb = ib - 1 - jj
                    tile_j = (jb * BT + rows)[:, None] * D + cols[None, :]
                    tl.store(RS + pbase + tile_j, r)
                    wj = tl.load(W + base + tile_j)
                    uj = tl.load(U + base + tile_j)
                    rw = tl.dot(r, tl.trans(wj), input_precision=PREC)
                    r = r - tl.dot(rw, uj, input_precision=PREC)
            if HAS_GATE:
                gq = tl.load(G + bh * Tp + offs_i)
                dg_row = tl.zeros([BT], dtype=tl.float32)
            dr = tl.zeros([BT, D], dtype=tl.float32)
            for jb in range(0, ib):
                offs_j = jb * BT + rows
                tile_j = offs_j[:, None] * D + cols[None, :]
                if HAS_HH:
                    r = tl.load(RS + pbase + tile_j)
                else:
                    r = qt
                kt = tl.load(KT + base + tile_j).to(tl.float32)
                s = tl.dot(r, tl.trans(kt), input_precision=PREC) * scale
                if HAS_GATE:
                    gk = tl.load(G + bh * Tp + offs_j)
                    s += gq[:, None] - gk[None, :]
                p = tl.exp(s - lse[:, None])
                v = tl.load(V + base + tile_j).to(tl.float32)
                dp = tl.dot(do, tl.trans(v), input_precision=PREC)
                ds = p * (dp - delta[:, None])
                dv_part = tl.load(DVP + pbase + tile_j)
                tl.store(DVP + pbase + tile_j, dv_part + tl.dot(tl.trans(p), do, input_precision=PREC))
                dk_part = tl.load(DKP + pbase + tile_j)
                tl.store(DKP + pbase + tile_j, dk_part + scale * tl.dot(tl.trans(ds), r, input_precision=PREC))
                if HAS_GATE:
                    dg_row += tl.sum(ds, 1)
                    dgc = tl.load(DGCOLP + gbase + offs_j)
                    tl.store(DGCOLP + gbase + offs_j, dgc - tl.sum(ds, 0))
                if HAS_HH:
                    # dr is dL/d(queries before block jb); carry it back across the block
                    wj = tl.load(W + base + tile_j)
                    uj = tl.load(U + base + tile_j)
                    dpj = tl.load(DPP + dpbase + jb * D * D + dd)
                    tl.store(DPP + dpbase + jb * D * D + dd,
                             dpj + tl.dot(tl.trans(r), dr, input_precision=PREC))
                    du = tl.dot(dr, tl.trans(uj), input_precision=PREC)
                    dr = dr - tl.dot(du, wj, input_precision=PREC)
                dr += scale * tl.dot(ds, kt, input_precision=PREC)
            tl.store(DQT + base + tile_i, dr)
            if HAS_GATE:
                tl.store(DGROW + bh * Tp + offs_i, dg_row)

    _KERNELS = (_path_fwd_kernel, _path_bwd_kernel)
    return _KERNELS


def _block_size(D: int, device: torch.device) -> int:
    if device.type != "cuda":
        return 16
    return 64


def _launch_cfg(D: int, device: torch.device):
    if device.type != "cuda":
        return {}
    return {"num_warps": 4 if D <= 64 else 8, "num_stages": 2}


def _num_groups(N: int, BH: int, device: torch.device) -> int:
    """Programs per (batch, head) in the backward, each owning every NG-th query block."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = -(-2 * sms // BH)
    return max(1, min(N, want))


def _to_blocks(x: torch.Tensor, Tp: int) -> torch.Tensor:
    """[B, T, H, ...] -> float32 [B, H, Tp, ...], zero padded at the end of time."""
    x = x.float().transpose(1, 2)
    pad = Tp - x.shape[2]
    if pad:
        spec = [0, 0] * (x.dim() - 3) + [0, pad]
        x = torch.nn.functional.pad(x, spec)
    return x


def _local(q, k, w, beta, log_fgate, scale, BT, Tp):
    """Block-local algebra in float32 torch (differentiable).

    Returns the tensors the kernels read, each [B, H, Tp(, D)] or [B, H, N, BT, BT]:
    (Qt, Kt, W, U, G, SI), with W, U, G None where unused.
    """
    B, T, H, D = q.shape
    N = Tp // BT
    Q = _to_blocks(q, Tp)
    K = _to_blocks(k, Tp)
    Qb = Q.view(B, H, N, BT, D)
    Kb = K.view(B, H, N, BT, D)
    SI = Qb @ Kb.transpose(-1, -2)
    Wf = U = Gf = None
    if w is not None:
        Wf = _to_blocks(w, Tp)
        bf = _to_blocks(beta, Tp)
        Wb = Wf.view(B, H, N, BT, D)
        bb = bf.view(B, H, N, BT)
        eye = torch.eye(BT, dtype=torch.float32, device=q.device)
        tmat = eye + torch.tril(bb[..., :, None] * (Wb @ Wb.transpose(-1, -2)), diagonal=-1)
        A = torch.linalg.solve_triangular(tmat, torch.diag_embed(bb), upper=False)
        Ub = A @ Wb
        le = torch.ones(BT, BT, dtype=torch.bool, device=q.device).tril()
        gt = torch.ones(BT, BT, dtype=torch.bool, device=q.device).tril(-1)
        qw = (Qb @ Wb.transpose(-1, -2)).masked_fill(~le, 0.0)  # [i, s], s <= i
        wk = (Wb @ Kb.transpose(-1, -2)).masked_fill(~gt, 0.0)  # [t, j], t > j
        SI = SI - qw @ (A @ wk)
        Qt = (Qb - qw @ Ub).view(B, H, Tp, D)
        Kt = (Kb - wk.transpose(-1, -2) @ (A.transpose(-1, -2) @ Wb)).view(B, H, Tp, D)
        U = Ub.view(B, H, Tp, D)
    else:
        Qt, Kt = Q, K
    SI = SI * scale
    if log_fgate is not None:
        Gf = torch.cumsum(_to_blocks(log_fgate, Tp), dim=-1)
        Gb = Gf.view(B, H, N, BT)
        SI = SI + Gb[..., :, None] - Gb[..., None, :]
    return Qt, Kt, Wf, U, Gf, SI


def _prec(dtype: torch.dtype, device: torch.device) -> str:
    if device.type != "cuda":
        return "ieee"
    return "ieee" if dtype == torch.float32 else "tf32"


def _dummy(device):
    return torch.zeros(1, dtype=torch.float32, device=device)


class _PathAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w, beta, log_fgate, scale):
        B, T, H, D = q.shape
        dev = q.device
        BT = _block_size(D, dev)
        N = -(-T // BT)
        Tp = N * BT
        with torch.no_grad():
            Qt, Kt, Wf, U, Gf, SI = _local(q, k, w, beta, log_fgate, scale, BT, Tp)
            V = _to_blocks(v, Tp).contiguous()
            dummy = _dummy(dev)
            O = torch.empty(B, H, Tp, D, dtype=q.dtype, device=dev)
            LSE = torch.empty(B, H, Tp, dtype=torch.float32, device=dev)
            _path_fwd_kernel = _kernels()[0]
            _path_fwd_kernel[(N, B * H)](
                Qt.contiguous(), Kt.contiguous(), V,
                dummy if Wf is None else Wf.contiguous(),
                dummy if U is None else U.contiguous(),
                dummy if Gf is None else Gf.contiguous(),
                SI.contiguous(), O, LSE,
                N, float(scale),
                D=D, BT=BT, HAS_HH=w is not None, HAS_GATE=log_fgate is not None,
                PREC=_prec(q.dtype, dev), **_launch_cfg(D, dev),
            )
        ctx.save_for_backward(q, k, v, w, beta, log_fgate, O, LSE)
        ctx.scale = scale
        return O[:, :, :T].transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, w, beta, log_fgate, O, LSE = ctx.saved_tensors
        scale = ctx.scale
        B, T, H, D = q.shape
        dev = q.device
        BT = _block_size(D, dev)
        N = -(-T // BT)
        Tp = N * BT
        has_hh = w is not None
        has_gate = log_fgate is not None
        leaves = [x.detach().requires_grad_(True) if x is not None else None
                  for x in (q, k, w, beta, log_fgate)]
        ql, kl, wl, bl, fl = leaves
        with torch.enable_grad():
            Qt, Kt, Wf, U, Gf, SI = _local(ql, kl, wl, bl, fl, scale, BT, Tp)
        with torch.no_grad():
            V = _to_blocks(v, Tp).contiguous()
            dO = _to_blocks(grad_out, Tp).contiguous()
            delta = (dO * O.float()).sum(-1).contiguous()
            NG = _num_groups(N, B * H, dev)
            f32 = dict(dtype=torch.float32, device=dev)
            dQt = torch.empty(B, H, Tp, D, **f32)
            dKp = torch.zeros(B, H, NG, Tp, D, **f32)
            dVp = torch.zeros(B, H, NG, Tp, D, **f32)
            dSI = torch.empty(B, H, N, BT, BT, **f32)
            dummy = _dummy(dev)
            dPp = torch.zeros(B, H, NG, N, D, D, **f32) if has_hh else dummy
            RS = torch.empty(B, H, NG, Tp, D, **f32) if has_hh else dummy
            dGrow = torch.empty(B, H, Tp, **f32) if has_gate else dummy
            dGcolp = torch.zeros(B, H, NG, Tp, **f32) if has_gate else dummy
            _path_bwd_kernel = _kernels()[1]
            _path_bwd_kernel[(NG, B * H)](
                Qt.detach().contiguous(), Kt.detach().contiguous(), V,
                Wf.detach().contiguous() if has_hh else dummy,
                U.detach().contiguous() if has_hh else dummy,
                Gf.detach().contiguous() if has_gate else dummy,
                SI.detach().contiguous(), LSE, dO, delta,
                dQt, dKp, dVp, dPp, dGrow, dGcolp, dSI, RS,
                N, NG, float(scale),
                D=D, BT=BT, HAS_HH=has_hh, HAS_GATE=has_gate,
                PREC=_prec(q.dtype, dev), **_launch_cfg(D, dev),
            )
            outs, grads = [Qt, Kt, SI], [dQt, dKp.sum(2), dSI]
            if has_hh:
                dP = dPp.sum(2)  # [B, H, N, D, D]
                Wb = Wf.detach().view(B, H, N, BT, D)
                Ub = U.detach().view(B, H, N, BT, D)
                outs += [U, Wf]
                grads += [-(Wb @ dP).view(B, H, Tp, D), -(Ub @ dP.transpose(-1, -2)).view(B, H, Tp, D)]
            if has_gate:
                outs.append(Gf)
                grads.append(dGrow + dGcolp.sum(2))
        inputs = [x for x in leaves if x is not None]
        got = torch.autograd.grad(outs, inputs, grads, allow_unused=True)
        got = iter(got)
        res = [next(got) if x is not None else None for x in leaves]
        dq, dk, dw, dbeta, dlf = res
        dv = dVp.sum(2)[:, :, :T].transpose(1, 2).to(v.dtype)

        def cast(g, like):
            if g is None or like is None:
                return None
            return g.to(like.dtype)

        return (cast(dq, q), cast(dk, k), dv, cast(dw, w), cast(dbeta, beta), cast(dlf, log_fgate), None)


def _check(q, k, v, w, beta, log_fgate):
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, D], got shape {tuple(q.shape)}")
    B, T, H, D = q.shape
    if T < 1:
        raise ValueError("sequence length must be at least 1")
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head size D={D} is not supported by the Triton PaTH kernel; supported: {SUPPORTED_HEAD_DIMS}")
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
    if triton is None:
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


def path_attention_triton(q, k, v, w=None, beta=None, log_fgate=None, scale=None):
    """PaTH / PaTH-FoX / FoX attention output [B, T, H, D] on the Triton kernels (autograd-aware).

    w/beta None drops the Householder part (FoX, or plain causal softmax without a gate);
    log_fgate None drops the forget gate. scale defaults to D**-0.5.
    """
    _check(q, k, v, w, beta, log_fgate)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    return _PathAttention.apply(q, k, v, w, beta, log_fgate, float(scale))
