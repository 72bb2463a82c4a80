"""The torch attention functions against brute force written here from the definitions.

The brute-force versions loop over queries and apply the Householder matrices to each key
one at a time (PaTH), multiply the stick-breaking shares out (sba) and build rotation
matrices (rope), all in float64. The reference, blockwise and recurrent implementations must
all agree with them; fla-core's naive PaTH is an external oracle.
"""

from __future__ import annotations

import math
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import pathbench.kernels
from pathbench.kernels import (
    RecurrentCache,
    apply_rope,
    path_attention,
    path_attention_blockwise,
    path_attention_reference,
    path_probs,
    sba_attention,
    sba_probs,
    softmax_attention,
    softmax_probs,
)
from pathbench.kernels.softmax import SHORT_SEQUENCE, _short_softmax_attention

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# Brute force from the definitions: the logits of path_attention's docstring, product by product


def brute_path_logits(q, k, w=None, beta=None, log_fgate=None, scale=None):
    """[B, H, T, T]: scale * q_i^T H_i ... H_{j+1} k_j + G_i - G_j, -inf above the diagonal."""
    B, T, H, D = q.shape
    scale = D**-0.5 if scale is None else scale
    logits = torch.full((B, H, T, T), float("-inf"), dtype=F64)
    g = torch.zeros(B, T, H, dtype=F64) if log_fgate is None else log_fgate.cumsum(1)
    for i in range(T):
        keys = k[:, : i + 1]  # keys[:, j] becomes H_i ... H_{j+1} k_j
        if w is not None:
            for t in range(1, i + 1):  # H_t acts on the keys before t; H_{j+1} comes first
                before, rest = keys[:, :t], keys[:, t:]
                along_w = (before * w[:, t : t + 1]).sum(-1, keepdim=True)
                before = before - beta[:, t, None, :, None] * along_w * w[:, t : t + 1]
                keys = torch.cat([before, rest], dim=1)
        dots = (q[:, i : i + 1] * keys).sum(-1)  # [B, i + 1, H]
        logits[:, :, i, : i + 1] = (scale * dots + g[:, i : i + 1] - g[:, : i + 1]).transpose(1, 2)
    return logits


def brute_softmax_output(logits, v):
    return (torch.softmax(logits, dim=-1) @ v.transpose(1, 2)).transpose(1, 2)


def brute_sba_weights(q, k, scale=None):
    """A_ij = sigmoid(z_ij) * prod_{j < m <= i} (1 - sigmoid(z_im)), multiplied out."""
    B, T, H, D = q.shape
    scale = D**-0.5 if scale is None else scale
    z = scale * torch.einsum("bihd,bjhd->bhij", q, k)
    weights = torch.zeros(B, H, T, T, dtype=F64)
    for i in range(T):
        for j in range(i + 1):
            share = torch.sigmoid(z[:, :, i, j])
            for m in range(j + 1, i + 1):
                share = share * (1 - torch.sigmoid(z[:, :, i, m]))
            weights[:, :, i, j] = share
    return weights


def rotation_matrix(position, D, base=10000.0):
    """R_t: turns the pair of channels (c, c + D/2) by t * base^(-2c/D)."""
    R = torch.zeros(D, D, dtype=F64)
    for c in range(D // 2):
        angle = position * base ** (-2 * c / D)
        cos, sin = math.cos(angle), math.sin(angle)
        R[c, c], R[c, c + D // 2] = cos, -sin
        R[c + D // 2, c], R[c + D // 2, c + D // 2] = sin, cos
    return R


def brute_rope_logits(q, k):
    B, T, H, D = q.shape
    R = torch.stack([rotation_matrix(t, D) for t in range(T)])  # [T, D, D]
    qr, kr = torch.einsum("tcd,bthd->bthc", R, q), torch.einsum("tcd,bthd->bthc", R, k)
    logits = D**-0.5 * torch.einsum("bihd,bjhd->bhij", qr, kr)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return logits.masked_fill(~causal, float("-inf"))


# ---------------------------------------------------------------------------------------------
# Random inputs


def make_inputs(B=1, T=70, H=2, D=16, beta_near=None, gate=True, seed=0, dtype=F64):
    """q, k, v, w (unit rows), beta (uniform in (0, 2) or within 1e-3 of beta_near), log_fgate."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=gen, dtype=F64) for _ in range(3))
    w = F.normalize(torch.randn(B, T, H, D, generator=gen, dtype=F64), dim=-1)
    noise = torch.rand(B, T, H, generator=gen, dtype=F64)
    if beta_near is None:
        beta = 2 * noise
    elif beta_near == 0:
        beta = 1e-3 * noise
    elif beta_near == 2:
        beta = 2 - 1e-3 * noise
    else:
        beta = beta_near + 1e-3 * (2 * noise - 1)
    log_fgate = None
    if gate:
        log_fgate = F.logsigmoid(torch.randn(B, T, H, generator=gen, dtype=F64) + 2)
    return tuple(None if x is None else x.to(dtype) for x in (q, k, v, w, beta, log_fgate))


def recurrent_attention(q, k, v, w=None, beta=None, log_fgate=None, stick_breaking=False):
    """Token-by-token outputs [B, T, H, D] from the recurrent cache."""
    cache, outputs = RecurrentCache(), []
    for t in range(q.shape[1]):
        cache.append(*(None if x is None else x[:, t] for x in (k, v, w, beta, log_fgate)))
        readout = cache.stick_breaking_readout if stick_breaking else cache.softmax_readout
        outputs.append(readout(q[:, t]))
    return torch.stack(outputs, dim=1)


# ---------------------------------------------------------------------------------------------
# PaTH, PaTH-FoX and FoX


@pytest.mark.parametrize("D", [16, 32, 64, 128])
@pytest.mark.parametrize("beta_near", [0, 1, 2])
@pytest.mark.parametrize("gate", [False, True])
def test_path_implementations_match_brute_force(D, beta_near, gate):
    q, k, v, w, beta, log_fgate = make_inputs(T=70, D=D, beta_near=beta_near, gate=gate, seed=D)
    expected = brute_softmax_output(brute_path_logits(q, k, w, beta, log_fgate), v)
    for implementation in (path_attention_reference, path_attention_blockwise, recurrent_attention):
        out = implementation(q, k, v, w, beta, log_fgate)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-10, msg=implementation.__name__)


@pytest.mark.parametrize("T", [1, 5, 8, 20, 63, 64, 65, 130, 200])
def test_blockwise_any_length(T):
    # Block edges: one token, just under / at / over one block, several blocks with a tail; a
    # sequence shorter than a block takes one block of the next power of two (5, 8, 20).
    q, k, v, w, beta, log_fgate = make_inputs(B=2, T=T, H=1, D=8, seed=T)
    expected = path_attention_reference(q, k, v, w, beta, log_fgate)
    torch.testing.assert_close(path_attention_blockwise(q, k, v, w, beta, log_fgate), expected,
                               rtol=0, atol=1e-12)


def test_long_sequence_against_brute_force():
    q, k, v, w, beta, log_fgate = make_inputs(B=1, T=130, H=1, D=32, seed=1)
    expected = brute_softmax_output(brute_path_logits(q, k, w, beta, log_fgate), v)
    torch.testing.assert_close(path_attention_blockwise(q, k, v, w, beta, log_fgate), expected,
                               rtol=0, atol=1e-10)
    torch.testing.assert_close(recurrent_attention(q, k, v, w, beta, log_fgate), expected,
                               rtol=0, atol=1e-10)


@pytest.mark.parametrize("gate", [False, True])
def test_without_householder_is_fox_or_plain_softmax(gate):
    q, k, v, _, _, log_fgate = make_inputs(T=70, D=16, gate=gate)
    expected = brute_softmax_output(brute_path_logits(q, k, log_fgate=log_fgate), v)
    for implementation in (path_attention_reference, path_attention_blockwise, recurrent_attention):
        torch.testing.assert_close(implementation(q, k, v, log_fgate=log_fgate), expected,
                                   rtol=0, atol=1e-12)


def test_custom_scale():
    q, k, v, w, beta, log_fgate = make_inputs(T=20, D=16)
    expected = brute_softmax_output(brute_path_logits(q, k, w, beta, log_fgate, scale=0.7), v)
    torch.testing.assert_close(path_attention(q, k, v, w, beta, log_fgate, scale=0.7), expected,
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("householder", [False, True])
@pytest.mark.parametrize("gate", [False, True])
def test_blockwise_gradients_gradcheck(householder, gate):
    # Blocks of 4 over 10 tokens: three blocks, the last one padded. Without the Householder
    # part (FoX, or plain softmax without the gate) only the across-blocks backward is used.
    q, k, v, w, beta, log_fgate = make_inputs(T=10, H=2, D=4, gate=gate)
    if not householder:
        w = beta = None
    inputs = tuple(None if x is None else x.requires_grad_() for x in (q, k, v, w, beta, log_fgate))
    assert torch.autograd.gradcheck(lambda *xs: path_attention_blockwise(*xs, block=4), inputs,
                                    fast_mode=True)


@pytest.mark.parametrize("beta_near", [0, 1, 2])
def test_blockwise_gradients_match_brute_force(beta_near):
    inputs = make_inputs(T=24, H=2, D=8, beta_near=beta_near, seed=beta_near)

    def grads(fn):
        leaves = [x.clone().requires_grad_() for x in inputs]
        out = fn(*leaves)
        out.backward(torch.cos(torch.arange(out.numel(), dtype=F64)).view_as(out))
        return [x.grad for x in leaves]

    def brute(q, k, v, w, beta, log_fgate):
        return brute_softmax_output(brute_path_logits(q, k, w, beta, log_fgate), v)

    expected = grads(brute)
    actual = grads(lambda *xs: path_attention_blockwise(*xs, block=8))
    for name, a, e in zip("q k v w beta log_fgate".split(), actual, expected):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-10, msg=name)


def test_blockwise_many_blocks_match_reference_with_gradients():
    # Blocks of 4: 18 per sequence, 108 in all, so the within-block algebra runs in several
    # batches of WITHIN_CHUNK blocks, the last one partial.
    from pathbench.kernels.blockwise import WITHIN_CHUNK

    inputs = make_inputs(B=2, T=70, H=3, D=8, seed=7)
    assert 2 * 3 * 18 > 3 * WITHIN_CHUNK and 2 * 3 * 18 % WITHIN_CHUNK

    def outputs_and_grads(fn):
        leaves = [x.clone().requires_grad_() for x in inputs]
        out = fn(*leaves)
        out.backward(torch.sin(torch.arange(out.numel(), dtype=F64)).view_as(out))
        return [out] + [x.grad for x in leaves]

    expected = outputs_and_grads(path_attention_reference)
    actual = outputs_and_grads(lambda *xs: path_attention_blockwise(*xs, block=4))
    for name, a, e in zip("out q k v w beta log_fgate".split(), actual, expected):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-10, msg=name)


@pytest.mark.parametrize("D", [16, 64])
@pytest.mark.parametrize("gate", [False, True])
def test_matches_fla_naive_path_attn(D, gate):
    # fla-core computes in float32 and multiplies its gate by scale: pass g = log_fgate / scale.
    # Imported here, not at the top: fla-core imports triton, and doing so while the test files
    # are collected, before test_triton.py switches Triton to its interpreter, breaks the
    # interpreted kernels there.
    from fla.ops.path_attn.naive import naive_path_attn

    q, k, v, w, beta, log_fgate = make_inputs(B=2, T=130, H=2, D=D, gate=gate, seed=3)
    scale = D**-0.5
    g = torch.zeros_like(beta) if log_fgate is None else log_fgate / scale
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it warns that it is slow on a CPU
        oracle = naive_path_attn(q.float(), k.float(), v.float(), w.float(), beta.float(),
                                 g.float(), scale)
    ours = path_attention_blockwise(q, k, v, w, beta, log_fgate)
    torch.testing.assert_close(ours.float(), oracle, rtol=0, atol=2e-4)


def test_low_precision_inputs():
    inputs = make_inputs(B=2, T=70, D=32)
    expected = path_attention_reference(*inputs)
    for dtype in (torch.float32, torch.bfloat16):
        out = path_attention(*(x.to(dtype) for x in inputs))
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), expected, rtol=0,
                                   atol=1e-5 if dtype == torch.float32 else 5e-2)


@pytest.mark.parametrize("householder, gate", [(True, False), (True, True), (False, True)],
                         ids=["path", "path_fox", "fox"])
def test_blockwise_computes_in_float32_under_autocast(householder, gate):
    """A model trained in bf16 autocast on a GPU without Triton runs this path. With the forward
    under autocast (as the trainer runs it), output and gradients are those computed without
    autocast, bit for bit. A backward inside the autocast region, which torch advises against,
    runs too; there FoX's within-block logits, left to autograd, get bf16 gradients."""
    q, k, v, w, beta, log_fgate = make_inputs(T=150, gate=gate, dtype=torch.float32)
    inputs = [q, k, v] + ([w, beta] if householder else [None, None]) + [log_fgate]
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))

    def run(autocast, backward_inside=False):
        leaves = [None if x is None else x.clone().requires_grad_() for x in inputs]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = path_attention_blockwise(*leaves)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast and backward_inside):
            return out, torch.autograd.grad(out, [x for x in leaves if x is not None], d_out)

    plain_out, plain_grads = run(False)
    out, grads = run(True)
    assert out.dtype == torch.float32
    assert torch.equal(out, plain_out)
    assert all(torch.equal(g, p) for g, p in zip(grads, plain_grads))
    out, grads = run(True, backward_inside=True)
    assert torch.equal(out, plain_out)
    tolerance = 0 if householder else 1e-2
    assert all(((g - p).norm() / p.norm()).item() <= tolerance for g, p in zip(grads, plain_grads))


# ---------------------------------------------------------------------------------------------
# The backend switch


def test_unknown_backend_names_the_choices():
    q, k, v, w, beta, _ = make_inputs(T=4, D=4)
    with pytest.raises(ValueError, match="'cuda'.*auto, torch, triton"):
        path_attention(q, k, v, w, beta, backend="cuda")


def test_w_without_beta_is_rejected():
    q, k, v, w, _, _ = make_inputs(T=4, D=4)
    with pytest.raises(ValueError, match="w and beta"):
        path_attention(q, k, v, w)


def test_auto_on_cpu_is_the_blockwise_torch_path():
    inputs = make_inputs(T=70, D=16)
    torch.testing.assert_close(path_attention(*inputs), path_attention_blockwise(*inputs),
                               rtol=0, atol=0)
    torch.testing.assert_close(path_attention(*inputs, backend="torch"),
                               path_attention_blockwise(*inputs), rtol=0, atol=0)


def test_triton_backend_without_the_kernel_says_so(monkeypatch):
    # As in an installation without the kernel module.
    monkeypatch.setitem(sys.modules, pathbench.kernels.TRITON_MODULE, None)
    inputs = make_inputs(T=4, D=4)
    with pytest.raises(NotImplementedError, match="triton_path.*backend='torch'"):
        path_attention(*inputs, backend="triton")


# ---------------------------------------------------------------------------------------------
# Softmax, rope and stick-breaking


@pytest.mark.parametrize("T", [40, SHORT_SEQUENCE + 36])  # written out; the fused kernel
def test_nope_and_rope_match_brute_force(T):
    q, k, v, *_ = make_inputs(B=2, T=T, H=2, D=16)
    nope_logits = brute_path_logits(q, k)
    torch.testing.assert_close(softmax_attention(q, k, v), brute_softmax_output(nope_logits, v),
                               rtol=0, atol=1e-12)
    rope_logits = brute_rope_logits(q, k)
    torch.testing.assert_close(softmax_attention(q, k, v, rope=True),
                               brute_softmax_output(rope_logits, v), rtol=0, atol=1e-12)
    torch.testing.assert_close(softmax_probs(q, k, rope=True), torch.softmax(rope_logits, -1),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("offset", [0.0, 4.0, -4.0, 25.0])
def test_sba_matches_product_definition(offset):
    # offset shifts all z: mostly-open (z >> 0) and mostly-closed (z << 0) sticks; at 25 many
    # logits lie where softplus(z) and z differ by less than 1e-9, which float64 still sees.
    q, k, v, *_ = make_inputs(B=1, T=24, H=2, D=8, seed=5)
    mean_key = k.mean(dim=1, keepdim=True)
    q = q + offset * mean_key / mean_key.norm(dim=-1, keepdim=True)
    weights = brute_sba_weights(q, k)
    expected = (weights @ v.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(sba_attention(q, k, v), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(sba_probs(q, k), weights, rtol=0, atol=1e-12)
    torch.testing.assert_close(recurrent_attention(q, k, v, stick_breaking=True), expected,
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("offset", [-8.0, 8.0])
def test_sba_float32_matches_float64(offset):
    # Long rows of nearly closed (z << 0) or nearly open (z >> 0) sticks: the log weights are
    # differences of a logit and a cumulative sum over the row, which must keep float32's
    # precision in the output and in every gradient.
    q, k, v, *_ = make_inputs(B=2, T=300, H=2, D=32, seed=7)
    mean_key = k.mean(dim=1, keepdim=True)
    q = 3 * q + offset * mean_key / mean_key.norm(dim=-1, keepdim=True)
    grad_out = torch.randn_like(v)
    results = {}
    for dtype in (F64, torch.float32):
        leaves = [x.to(dtype).detach().requires_grad_() for x in (q, k, v)]
        out = sba_attention(*leaves)
        out.backward(grad_out.to(dtype))
        results[dtype] = [out.detach()] + [x.grad for x in leaves]
    for name, low, exact in zip(("out", "dq", "dk", "dv"), results[torch.float32], results[F64]):
        error = ((low.double() - exact).norm() / exact.norm()).item()
        assert error < 1e-5, f"{name}: relative error {error:.1e}"


def test_rope_in_float32_keeps_far_positions():
    # Positions in the thousands: float32 angles alone would be off by about 1e-4 radians.
    x = torch.randn(1, 1, 2, 64, dtype=F64, generator=torch.Generator().manual_seed(3))
    positions = torch.tensor([9_973])
    exact = apply_rope(x, positions)
    low = apply_rope(x.float(), positions)
    assert (low.double() - exact).abs().max().item() < 2e-6
    R = rotation_matrix(9_973, 64)
    torch.testing.assert_close(exact[0, 0], x[0, 0] @ R.T, rtol=0, atol=1e-11)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_eager_rope_can_be_captured_in_a_cuda_graph():
    # Capture forbids copies from the host, so eager rope must not make its table on every call.
    x = torch.randn(2, 16, 2, 8, device="cuda", generator=torch.Generator("cuda").manual_seed(4))
    expected = apply_rope(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = apply_rope(x)
    graph.replay()
    torch.testing.assert_close(captured, expected, rtol=0, atol=0)


def test_short_sequences_written_out_match_the_fused_kernel_forward_and_backward():
    q, k, v, *_ = make_inputs(B=2, T=SHORT_SEQUENCE, H=2, D=16)
    for rope in (False, True):
        grads = []
        for short in (True, False):
            leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
            qr, kr = (apply_rope(x) for x in leaves[:2]) if rope else leaves[:2]
            out = (_short_softmax_attention(qr, kr, leaves[2]) if short else
                   F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (qr, kr, leaves[2])),
                                                  is_causal=True).transpose(1, 2))
            out.backward(torch.randn(out.shape, dtype=F64,
                                     generator=torch.Generator().manual_seed(1)))
            grads.append((out, *(x.grad for x in leaves)))
        for short, fused in zip(*grads):
            torch.testing.assert_close(short, fused, rtol=0, atol=1e-12)


def test_sba_and_rope_gradcheck():
    q, k, v, *_ = make_inputs(B=1, T=6, H=2, D=4)
    leaves = tuple(x.requires_grad_() for x in (q, k, v))
    assert torch.autograd.gradcheck(sba_attention, leaves, fast_mode=True)
    assert torch.autograd.gradcheck(lambda *xs: softmax_attention(*xs, rope=True), leaves,
                                    fast_mode=True)


def test_attention_probs_of_every_variant():
    q, k, _, w, beta, log_fgate = make_inputs(T=20, D=16)
    expected = [
        (softmax_probs(q, k), brute_path_logits(q, k)),
        (path_probs(q, k, log_fgate=log_fgate), brute_path_logits(q, k, log_fgate=log_fgate)),
        (path_probs(q, k, w, beta), brute_path_logits(q, k, w, beta)),
        (path_probs(q, k, w, beta, log_fgate), brute_path_logits(q, k, w, beta, log_fgate)),
    ]
    for probs, logits in expected:
        torch.testing.assert_close(probs, torch.softmax(logits, -1), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# The benchmark command


def test_bench_torch_prints_a_row_per_size(capsys):
    from pathbench.runners.cli import main

    main(["bench", "torch", "--lengths", "70,130", "--dims", "8", "--batch", "1", "--heads", "1",
          "--repeats", "1", "--threads", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert "1 threads" in lines[0] and lines[1].split() == ["D", "T", "reference", "ms",
                                                             "blockwise", "ms", "speed-up"]
    assert [line.split()[:2] for line in lines[2:]] == [["8", "70"], ["8", "130"]]
