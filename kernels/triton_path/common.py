"""What the stage files share: the dtypes and precisions of the kernels' products, and the Triton
helpers of several kernels (carries across block products, loads, float16 operands, the online
softmax step)."""

import torch
import triton
import triton.language as tl


def dummy(device):
    """A stand-in for a tensor argument that a kernel specialisation does not read."""
    return torch.zeros(1, dtype=torch.float32, device=device)


def storage_dtype(q):
    """dtype of the data tensors the kernels read (q and k moved, v, dO) and of their dots.

    q's own dtype, except bfloat16 under the CPU interpreter, whose bfloat16 dot is wrong
    (numpy has no bfloat16): there the data stay float32.
    """
    if q.device.type != "cuda" and q.dtype == torch.bfloat16:
        return torch.float32
    return q.dtype


def product_dtype(q):
    """dtype of the stored block products M and of the backward's replayed queries:
    float32 for float32 inputs; float16 (the precision of the carries' dots) for 16-bit ones."""
    return torch.float32 if q.dtype == torch.float32 else torch.float16


def dot_precision(dtype: torch.dtype, device: torch.device) -> str:
    """Precision of float32 dots: float32-accurate for float32 inputs (exact under the
    interpreter, three-pass tf32 on the GPU); tf32 for 16-bit inputs, whose data dots run in
    their own dtype."""
    if device.type != "cuda":
        return "ieee"
    return "tf32x3" if dtype == torch.float32 else "tf32"


def inversion_precision(dtype: torch.dtype, device: torch.device) -> str:
    """Precision of the block inversion's products (and of the other products with the inverse
    where the block-local kernels keep float32 operands): float32-accurate for float32 inputs; tf32
    for 16-bit ones (a relative error of about 1e-3 in the block products, the size of their
    float16 storage; three-pass tf32 there spilled registers heavily on the H200)."""
    if device.type != "cuda":
        return "ieee"
    return "tf32x3" if dtype == torch.float32 else "tf32"


def factor_precision(dtype: torch.dtype, device: torch.device) -> str:
    """Precision of the products that build the Householder factors (the inversion's input, and
    the rest where the preprocessing keeps float32 operands): float32-accurate for float32
    inputs; tf32 for 16-bit ones, whose block products are stored in float16 (three-pass tf32
    took twice the preprocessing time there on the H200)."""
    if device.type != "cuda":
        return "ieee"
    return "tf32x3" if dtype == torch.float32 else "tf32"


@triton.jit
def carry(x, mat, cols, D: tl.constexpr, TRANSPOSE: tl.constexpr, HH16: tl.constexpr, PREC: tl.constexpr):
    """x M (or x M^T) for the D x D matrix M at mat: rows carried across a block or chunk."""
    m = tl.load(mat + cols[:, None] * D + cols[None, :])
    if TRANSPOSE:
        m = tl.trans(m)
    if HH16:
        # 16-bit inputs: float16 operands (tf32's mantissa, twice its rate), float32 sums
        xm = tl.dot(x.to(tl.float16), m.to(tl.float16))
    else:
        xm = tl.dot(x, m.to(tl.float32), input_precision=PREC)
    return xm


@triton.jit
def back_across(dr, r, rs, rows, dm, mats, j, added, cols, D: tl.constexpr, RELOAD: tl.constexpr,
                ADJ16: tl.constexpr, PREC: tl.constexpr, dm_sum=None):
    """The adjoint dr of rows r carried back across M_j, the j-th D x D product at mats: adds
    r^T dr into dL/dM_j (the j-th at dm; stores it there where the program has not added to
    it before: `added`, sum_so_far) and returns dr M_j^T. r^T dr goes in row slabs of at
    most 64 (smaller layout conversions), each slab of r loaded again from rs (at rows) with
    RELOAD (r is one slab otherwise). dm_sum, for D <= 64 (one slab), is dL/dM_j's partial
    sum that the caller loaded already (sum_so_far), early, so that its wait overlaps the
    caller's products.

    With ADJ16 (16-bit inputs only: r and M are float16 there) the products take float16
    operands, tf32's mantissa in half the registers and shared memory: dr is scaled into
    float16's range (scaled)."""
    if ADJ16:
        drs, down = scaled(dr, True)
    DS: tl.constexpr = 64 if D > 64 else D
    slab = tl.arange(0, DS)
    for sl in tl.static_range(D // DS):
        if RELOAD:
            rsl = tl.load(rs + rows[:, None] * D + sl * DS + slab[None, :]).to(tl.float32)
        else:
            rsl = r
        dm_ptr = dm + j * D * D + (sl * DS + slab)[:, None] * D + cols[None, :]
        if dm_sum is None:
            so_far = sum_so_far(dm_ptr, added)
        else:
            so_far = dm_sum
        if ADJ16:
            tl.store(dm_ptr, so_far + tl.dot(tl.trans(rsl.to(tl.float16)), drs) * down)
        else:
            tl.store(dm_ptr, tl.dot(tl.trans(rsl), dr, acc=so_far, input_precision=PREC))
    if ADJ16:
        dr = carry(drs, mats + j * D * D, cols, D, True, True, PREC) * down
    else:
        dr = carry(dr, mats + j * D * D, cols, D, True, False, PREC)
    return dr


@triton.jit
def sum_so_far(ptr, added):
    """A partial sum at ptr, or 0 where this program has not added to it yet (added false):
    the first addition stores, so that the sums need no zero-filled buffers, whose zeros
    would go to memory and be read back. (The mask is a block: the interpreter takes no
    scalar one.)"""
    return tl.load(ptr, mask=tl.full(ptr.shape, 0, tl.int32) < added, other=0.0)


@triton.jit
def head_start(X, bh, H, stride_b, stride_h):
    """The first row of head bh (= batch * H + head) of a [B, T, H, D] input read in place."""
    return X + (bh // H) * stride_b + (bh % H) * stride_h


@triton.jit
def load_rows(X, offs, cols, stride_t, T):
    """Rows offs of one head of a tensor read in place, rows stride_t apart (v and dO: X from
    head_start; the output: its head's rows); 0 past its T rows."""
    return tl.load(X + offs[:, None] * stride_t + cols[None, :], mask=(offs < T)[:, None], other=0.0)


@triton.jit
def query_tile(QX, DELTA, LSE, offs, cols, Tp, D: tl.constexpr):
    """The rows offs of a backward scan's query tile (its dO is the caller's): its queries in
    QX (float32), delta and log-sum-exp. Rows past the end (Tp) get lse = inf: their
    probabilities are exactly 0, so no gradient flows from them."""
    valid = offs < Tp
    tile = offs[:, None] * D + cols[None, :]
    delta = tl.load(DELTA + offs, mask=valid, other=0.0)
    lse = tl.load(LSE + offs, mask=valid, other=float("inf"))
    r = tl.load(QX + tile, mask=valid[:, None], other=0.0).to(tl.float32)
    return r, delta, lse


@triton.jit
def load_f32(ptr, offs, mask):
    """A [BT, D] tile of a [B, T, H, D] input in float32, loaded again where it is used
    (volatile: not merged with earlier loads) so that it is not kept live in between."""
    return tl.load(ptr + offs, mask=mask, other=0.0, volatile=True).to(tl.float32)


@triton.jit
def operand(x, HALF: tl.constexpr):
    """x as a product's operand: in float16 with HALF, else in float32. For data of 16-bit
    inputs (not gradients, scaled): their block products are stored in float16 too."""
    if HALF:
        return x.to(tl.float16)
    else:
        return x.to(tl.float32)


@triton.jit
def load_op(ptr, offs, mask, HALF: tl.constexpr):
    """Rows of a [B, T, H, D] input (a tile or a column slab of one) as a product's operand
    (load_f32, operand)."""
    return operand(load_f32(ptr, offs, mask), HALF)


@triton.jit
def inverse(XS, si, HALF: tl.constexpr):
    """The block inverse X (at XS, si its [BT, BT] offsets) as a product's operand, loaded again
    where it is used (volatile: not kept live in between)."""
    return operand(tl.load(XS + si, volatile=True), HALF)


@triton.jit
def scaled(g, HALF: tl.constexpr):
    """A gradient tile as a product's operand, and the factor that takes the scale out of its
    products again. With HALF: g times the power of two that brings its largest |g| into
    [2^14, 2^15), in float16 (tf32's mantissa, in half the registers, at twice the rate);
    gradients have no fixed scale, so unscaled they could leave float16's range. The factors
    come from the float32 bits (exact); a tile below 2^-113 is 0 in float16 anyway."""
    if HALF:
        top = tl.max(tl.max(tl.abs(g), 1), 0)
        e = tl.maximum((top.to(tl.int32, bitcast=True) >> 23) - 127, -113)
        up = ((141 - e) << 23).to(tl.float32, bitcast=True)
        down = ((113 + e) << 23).to(tl.float32, bitcast=True)
        return (g * up).to(tl.float16), down
    else:
        return g, 1.0


@triton.jit
def dot_rows(A, B, offs, mask, BT: tl.constexpr, DS: tl.constexpr, NS: tl.constexpr, HALF: tl.constexpr,
             PREC: tl.constexpr):
    """A B^T in float32 for two [BT, D] tiles of [B, T, H, D] inputs, from their NS column
    slabs of DS (slab c at offs + c * DS), float16 operands with HALF."""
    acc = tl.zeros([BT, BT], dtype=tl.float32)
    for c in tl.static_range(NS):
        acc = tl.dot(load_op(A, offs + c * DS, mask, HALF), tl.trans(load_op(B, offs + c * DS, mask, HALF)),
                     acc=acc, input_precision=PREC)
    return acc


@triton.jit
def base2(x):
    """x times log2(e). Logits, gates and log-sum-exps are in base 2 in the kernels, so that a
    probability is one exp2 (tl.exp multiplies every element by log2(e) itself)."""
    return x * 1.4426950408889634


@triton.jit
def logits(r, kt, gq, gk, scale, HAS_GATE: tl.constexpr, PREC: tl.constexpr):
    """The logits of queries r (at key block kt's end) with keys kt, in base 2 (gates too)."""
    s = tl.dot(r.to(kt.dtype), tl.trans(kt), input_precision=PREC) * base2(scale)
    if HAS_GATE:
        s += gq[:, None] - gk[None, :]
    return s


@triton.jit
def softmax_step(s, v, m, l, acc, PREC: tl.constexpr):
    """One key block of the online softmax, from its logits s: the updated (m, l, acc)."""
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l, acc


@triton.jit
def attend(r, kt, v, m, l, acc, gq, gk, scale, HAS_GATE: tl.constexpr, PREC: tl.constexpr):
    """One key block of the online softmax for queries r: the updated (m, l, acc)."""
    return softmax_step(logits(r, kt, gq, gk, scale, HAS_GATE, PREC), v, m, l, acc, PREC)
