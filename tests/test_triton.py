"""The Triton PaTH kernel against the float64 reference (and, on CUDA, the torch blockwise path).

Without CUDA the kernels run under the Triton interpreter (TRITON_INTERPRET=1, set here before
the kernel package is imported, which defines its kernels) at small shapes; with CUDA the same
tests run at larger shapes on the GPU, plus long-sequence checks against the torch
implementation. Tests vary the kernels' launch settings with dataclasses.replace on
DEFAULT_SETTINGS and pass the variant in.
"""

import importlib.util
import os
from dataclasses import replace
from functools import partial
from types import SimpleNamespace

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

# Only an absent Triton skips these tests; an installed one that fails to import fails them.
if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed (pip install -e '.[test]')", allow_module_level=True)
import triton  # noqa: E402, F401

from pathbench.kernels import path_attention  # noqa: E402
from pathbench.kernels.reference import path_attention_reference  # noqa: E402
from pathbench.kernels.triton_path import DEFAULT_SETTINGS, chosen_configs, path_attention_triton  # noqa: E402
from pathbench.kernels.triton_path import attention, bwd_within, edges  # noqa: E402
from pathbench.kernels.triton_path.common import dot_precision  # noqa: E402
from pathbench.kernels.triton_path.settings import SUPPORTED_HEAD_DIMS  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
F = torch.nn.functional


def make_inputs(B, T, H, D, hh=True, gate=True, dtype=torch.float32, beta_near_two=False, seed=None):
    gen = torch.Generator().manual_seed(seed if seed is not None else int(torch.randint(0, 2**31, ()).item()))

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    q, k, v = (rnd(B, T, H, D).to(dtype) for _ in range(3))
    w = beta = lf = None
    if hh:
        w = F.normalize(rnd(B, T, H, D), dim=-1)
        if beta_near_two:
            beta = 2.0 - 1e-3 * torch.rand(B, T, H, generator=gen)
        else:
            beta = 2.0 * torch.rand(B, T, H, generator=gen)
    if gate:
        lf = F.logsigmoid(rnd(B, T, H) + 2.0)
    return [x.to(DEV) if x is not None else None for x in (q, k, v, w, beta, lf)]


def rel(x, y):
    x, y = x.double(), y.double()
    return ((x - y).norm() / y.norm().clamp_min(1e-2)).item()


def grads(fn, args, dout):
    leaves = [a.detach().clone().requires_grad_(True) if a is not None else None for a in args]
    out = fn(*leaves)
    gs = torch.autograd.grad(out, [a for a in leaves if a is not None], dout.to(out.dtype))
    return out.detach(), list(gs)


def in_pairs(*dims):
    """Settings fields: query blocks two at a time at head sizes dims, in every kernel that can."""
    return dict(fwd_pairs=dims, within_pairs=dims, cross_q_pairs=dims)


def check_against_reference(args, fwd_tol=1e-4, grad_tol=1e-3, with_grad=True, settings=None):
    kernel = partial(path_attention_triton, settings=settings)
    ref_args = [a.double() if a is not None else None for a in args]
    if not with_grad:
        with torch.no_grad():
            out = kernel(*args)
            ref = path_attention_reference(*ref_args)
        assert out.dtype == args[0].dtype
        assert rel(out, ref) <= fwd_tol, rel(out, ref)
        return
    dout = torch.randn(args[0].shape, device=DEV, dtype=torch.float64)
    out, g = grads(kernel, args, dout)
    ref, rg = grads(path_attention_reference, ref_args, dout)
    assert torch.isfinite(out).all()
    assert rel(out, ref) <= fwd_tol, ("forward", rel(out, ref))
    names = [n for n, a in zip("q k v w beta log_fgate".split(), args) if a is not None]
    for name, a, b in zip(names, g, rg):
        assert a.shape == b.shape and torch.isfinite(a).all(), name
        assert rel(a, b) <= grad_tol, (name, rel(a, b))


# (B, T, H, D, householder, gate): every D, T = 1, T not a block multiple, B and H > 1.
CPU_CASES = [
    (2, 37, 2, 16, True, True),
    (1, 1, 1, 32, True, True),
    (1, 5, 2, 32, True, False),
    (2, 67, 1, 64, True, True),
    (1, 21, 2, 128, True, True),
    (2, 37, 2, 16, False, True),  # fox
    (1, 37, 1, 32, False, False),  # plain causal softmax
    (1, 130, 2, 32, True, True),
    (1, 64, 1, 128, False, True),
]
GPU_CASES = [
    (2, 1, 3, 64, True, True),
    (2, 300, 3, 32, True, False),
    (2, 1027, 2, 64, True, True),
    (1, 700, 2, 128, True, True),
    (2, 513, 2, 16, False, True),
]


@pytest.mark.parametrize("case", GPU_CASES if CUDA else CPU_CASES, ids=str)
def test_matches_reference_float32(case):
    B, T, H, D, hh, gate = case
    check_against_reference(make_inputs(B, T, H, D, hh, gate))


@pytest.mark.skipif(CUDA, reason="interpreter settings")
def test_gpu_block_size_and_several_backward_programs():
    settings = replace(DEFAULT_SETTINGS, interpret_block=64, interpret_groups=3)
    check_against_reference(make_inputs(1, 200, 2, 32, True, True), settings=settings)
    settings = replace(settings, interpret_chunks=(1000,))  # one chunk: the within-chunk scan's groups
    check_against_reference(make_inputs(1, 200, 2, 32, True, True), settings=settings)
    settings = replace(settings, interpret_chunks=(2,), interpret_block=32)
    check_against_reference(make_inputs(2, 100, 1, 16, False, True), settings=settings)
    settings = replace(settings, interpret_block=128)
    check_against_reference(make_inputs(1, 300, 1, 64, True, True), settings=settings)


@pytest.mark.skipif(CUDA, reason="interpreter settings")
@pytest.mark.parametrize("hh", [True, False], ids=["path", "softmax"])
@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pairs"])
def test_keys_many_chunks_back(hh, pairs):
    """Soft attention without a gate, so that keys several chunks back carry real gradient;
    chunks of four blocks, the last one of three, two backward programs per head. With pairs,
    the forward and the scans take query blocks two at a time, and the last pair has one block
    past the end."""
    settings = replace(DEFAULT_SETTINGS, **in_pairs(*((32,) if pairs else ())), interpret_chunks=(4,),
                       interpret_groups=2)
    args = make_inputs(2, 170, 1, 32, hh, False)
    args[0] = args[0] * 0.3
    check_against_reference(args, grad_tol=1e-5, settings=settings)


@pytest.mark.skipif(CUDA, reason="interpreter settings")
@pytest.mark.parametrize("hh,gate", [(True, True), (False, True), (True, False)], ids=["path_fox", "fox", "path"])
def test_chunks_in_levels(monkeypatch, hh, gate):
    """Chunks of two blocks crossed inside chunks of four, which are crossed inside chunks of
    eight: sixteen blocks, the last one partial, query blocks in pairs and two programs a head.
    Every level's cross-chunk scans run (counted), and the gradients add up across levels."""
    settings = replace(DEFAULT_SETTINGS, **in_pairs(16), interpret_chunks=(2, 4, 8), interpret_groups=2)
    crossed = []
    across = attention._across_chunks
    monkeypatch.setattr(attention, "_across_chunks", lambda C, *a, **k: crossed.append(C) or across(C, *a, **k))
    args = make_inputs(1, 250, 2, 16, hh, gate)
    args[0] = args[0] * 0.3  # soft attention: keys far back carry real gradient
    check_against_reference(args, grad_tol=1e-5, settings=settings)
    assert crossed == [2, 4, 8]


def test_chunk_levels_rule():
    """Outer levels whose chunks do not divide the sequence go, and so do levels that span it.
    On the GPU, chunks of 512 tokens double level by level while the sequence holds at least
    eight of the longest (more than eight once they are 2048 tokens long); a sequence left with
    one level of more than eight chunks takes chunks of 1024 tokens. The forward takes one chunk
    up to 2048 tokens, then chunks of 512 up to 4096 and of 1024 beyond."""
    cpu = torch.device("cpu")
    settings = replace(DEFAULT_SETTINGS, interpret_chunks=(2, 4, 8))
    assert [settings.chunk_levels(N, 16, 16, cpu, 0) for N in (16, 24, 20, 8, 5, 2)] == [
        (2, 4, 8), (2, 4, 8), (2, 4), (2, 4), (2,), (2,)]
    gpu = SimpleNamespace(type="cuda")
    lengths = (768, 1024, 3584, 4096, 4160, 6144, 8192, 9216, 10048, 16384, 32768)
    blocks = {T: settings.chunk_levels(T // 64, 64, 64, gpu, 768) for T in lengths}
    assert blocks == {768: (12,), 1024: (8,), 3584: (8,), 4096: (8, 16), 4160: (16,), 6144: (8, 16), 8192: (8, 16, 32),
                      9216: (8, 16), 10048: (16,), 16384: (8, 16, 32), 32768: (8, 16, 32, 64)}
    forward = {T: settings.forward_chunk(-(-T // 64), 64, 64, gpu) for T in (2048, 2049, 4096, 4097, 16384)}
    assert forward == {2048: 32, 2049: 8, 4096: 8, 4097: 16, 16384: 16}
    assert [settings.forward_chunk(N, 16, 16, cpu) for N in (16, 20)] == [8, 4]  # the outermost level taken
    with pytest.raises(ValueError, match="each must divide the next"):
        replace(settings, interpret_chunks=(4, 6)).chunk_levels(24, 16, 16, cpu, 0)


@pytest.mark.skipif(CUDA, reason="interpreter settings")
@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pairs"])
def test_one_chunk_in_two_programs(pairs):
    """Seven blocks in one chunk, split between two within-chunk programs; with pairs, the
    forward and the within-chunk scan take query blocks two at a time, and the last pair has one
    block past the end."""
    settings = replace(DEFAULT_SETTINGS, **in_pairs(*((16,) if pairs else ())), interpret_chunks=(1000,),
                       interpret_groups=2)
    check_against_reference(make_inputs(2, 109, 2, 16, True, True), settings=settings)


@pytest.mark.skipif(CUDA, reason="interpreter settings")
@pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")  # the overflow this test makes
def test_query_pair_past_the_end_under_a_strong_gate():
    """Five blocks in chunks of two, query blocks in pairs: the last pair of the forward and of
    the scans has one block past the end. Its rows must carry no gradient even where a gate
    that forgets fast makes their unnormalised probabilities overflow."""
    settings = replace(DEFAULT_SETTINGS, **in_pairs(16), interpret_block=32)
    args = make_inputs(1, 150, 2, 16, True, True)
    args[5] = torch.full_like(args[5], -20.0)
    check_against_reference(args, settings=settings)


@pytest.mark.parametrize("D, hh_dtype, tol", [(16, torch.float32, 1e-5), (64, torch.float32, 1e-5),
                                               (64, torch.float16, 3e-3)])
def test_chunk_edges_match_torch(D, hh_dtype, tol):
    """The chunk-edge kernels against chunk_edges_reference in float64, forward and gradients:
    chunks of three blocks, the last one partial; gradients are added to what is there. With
    16-bit inputs the block products, and the products the backward keeps, are float16. The
    gradients that the scans leave zero (the first chunk's dQs and dMc, the last chunk's dKc)
    are NaN for the kernels: they must not be read. Neither are the first chunk's Qs and Mc and
    the last chunk's Kc, which the kernels leave unset."""
    B, H, BT, N, C = 2, 2, 16, 7, 3
    NC = -(-N // C)

    def rnd(*shape):
        return torch.randn(*shape, device=DEV)

    Qt, Kt = rnd(B, H, N * BT, D), rnd(B, H, N * BT, D)
    Mb = (torch.eye(D, device=DEV) + 0.3 * rnd(B, H, N, D, D) / D**0.5).to(hh_dtype)  # like a block's product
    dQs, dKc, dMc = rnd(B, H, N * BT, D), rnd(B, H, N * BT, D), rnd(B, H, NC, D, D)
    dQt, dKt, dM = rnd(B, H, N * BT, D), rnd(B, H, N * BT, D), rnd(B, H, N, D, D)
    unread = ((dQs, (slice(None), slice(None), slice(0, C * BT))), (dMc, (slice(None), slice(None), 0)),
              (dKc, (slice(None), slice(None), slice((NC - 1) * C * BT, None))))
    for x, where in unread:
        x[where] = 0.0

    ref_in = [x.double().requires_grad_(True) for x in (Qt, Kt, Mb)]
    ref_out = edges.chunk_edges_reference(*ref_in, C)
    ref_grads = torch.autograd.grad(ref_out, ref_in, (dQs.double(), dKc.double(), dMc.double()))

    prec = dot_precision(torch.float32, Qt.device)
    opts = DEFAULT_SETTINGS.launch_options("edges_fwd", BT, D, torch.float32, 4 if CUDA else None, 1)
    half = DEFAULT_SETTINGS.half_blocks(hh_dtype, D)
    Qs, Kc, Mc, PS, SS = edges.chunk_edges(Qt, Kt, Mb, C, prec, half, opts, save=True)
    assert PS.dtype == SS.dtype == hh_dtype
    read = ((slice(None), slice(None), slice(C * BT, None)), (slice(None), slice(None), slice(0, (NC - 1) * C * BT)),
            (slice(None), slice(None), slice(1, None)))
    for name, out, ref, part in zip(("Qs", "Kc", "Mc"), (Qs, Kc, Mc), ref_out, read):
        assert rel(out[part], ref[part]) <= tol, (name, rel(out[part], ref[part]))
    start = [x.clone() for x in (dQt, dKt, dM)]
    for x, where in unread:
        x[where] = float("nan")
    edges.chunk_edges_backward(Qt, Mb, PS, dQs, dMc, dQt, dM, C, prec, half, opts)
    edges.chunk_edges_backward(Kt, Mb, SS, dKc, None, dKt, dM, C, prec, half, opts)
    for name, total, before, ref in zip(("dQt", "dKt", "dM"), (dQt, dKt, dM), start, ref_grads):
        assert rel(total - before, ref) <= tol, (name, rel(total - before, ref))


@pytest.mark.skipif(CUDA, reason="interpreter settings")
def test_backward_computing_the_block_algebra_again():
    """Without the forward's block-local results the backward computes them again."""
    settings = replace(DEFAULT_SETTINGS, keep_preprocessing=False)
    check_against_reference(make_inputs(1, 37, 2, 32, True, True), settings=settings)
    check_against_reference(make_inputs(2, 40, 1, 16, True, False), settings=settings)


@pytest.mark.skipif(CUDA, reason="interpreter settings")
@pytest.mark.parametrize("keep, calls", [(True, 1), (False, 2)])
def test_backward_reuses_the_forward_block_algebra(monkeypatch, keep, calls):
    prepared = []
    original = attention.prep_forward
    monkeypatch.setattr(attention, "prep_forward", lambda *a: prepared.append(1) or original(*a))
    args = [a.requires_grad_(True) for a in make_inputs(1, 37, 2, 16, True, True)]
    path_attention_triton(*args, settings=replace(DEFAULT_SETTINGS, keep_preprocessing=keep)).sum().backward()
    assert len(prepared) == calls


@pytest.mark.parametrize("keep", [True, False])
def test_more_batch_and_head_pairs_than_a_grid_takes_go_a_slice_at_a_time(monkeypatch, keep):
    """Past CUDA's 65,535 programs in a grid's second dimension (here a limit of 5 pairs: a
    batch of 3 x 2 heads goes as 2 + 1 sequences), each slice of the batch is its own launch,
    and the results are those of one launch; also the reference's."""
    settings = replace(DEFAULT_SETTINGS, keep_preprocessing=keep)
    args = make_inputs(3, 21, 2, 16, True, True, seed=4)
    dout = torch.randn(args[0].shape, device=DEV)
    whole = grads(partial(path_attention_triton, settings=settings), args, dout)
    launched = []
    original = attention.prep_forward
    monkeypatch.setattr(attention, "prep_forward", lambda *a: launched.append(a[0].shape[0])
                        or original(*a))
    monkeypatch.setattr(attention, "MAX_HEAD_PROGRAMS", 5)
    sliced = grads(partial(path_attention_triton, settings=settings), args, dout)
    assert launched == ([2, 1] if keep else [2, 1, 2, 1])  # forward, and backward again
    for a, b in zip([whole[0], *whole[1]], [sliced[0], *sliced[1]]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    check_against_reference(args, settings=settings)


def test_values_and_output_gradient_read_in_place_with_their_strides():
    """v and dO are read where they lie: v a slice of a wider tensor, dO with heads outermost
    (as the gradient of a transposed view comes), T not a block multiple."""
    q, k, v, w, beta, lf = make_inputs(2, 45, 3, 16, True, True, seed=3)
    wide = torch.randn(2, 45, 3, 32, device=DEV)
    wide[..., 8:24] = v
    v_view = wide[..., 8:24]
    assert not v_view.is_contiguous()
    dout = torch.randn(2, 3, 45, 16, device=DEV).transpose(1, 2)
    out, g = grads(path_attention_triton, [q, k, v_view, w, beta, lf], dout)
    ref_args = [a.double() for a in (q, k, v, w, beta, lf)]
    ref, rg = grads(path_attention_reference, ref_args, dout.double())
    assert rel(out, ref) <= 1e-4
    for name, a, b in zip("q k v w beta log_fgate".split(), g, rg):
        assert rel(a, b) <= 1e-3, (name, rel(a, b))


@pytest.mark.parametrize("heads_first", [False, True], ids=["contiguous v", "v heads first"])
def test_gradients_come_back_in_their_inputs_layouts(heads_first):
    """Each gradient has its input's strides, so that autograd keeps it without a copy: q, k, w,
    beta and the gate contiguous, v contiguous or with heads outermost (as a transposed view's),
    T a block multiple."""
    q, k, v, w, beta, lf = make_inputs(2, 32, 3, 16, True, True, seed=4)
    if heads_first:
        v = v.transpose(1, 2).contiguous().transpose(1, 2)
    inputs = [q, k, v, w, beta, lf]
    _, g = grads(path_attention_triton, inputs, torch.randn(2, 32, 3, 16, device=DEV))
    for name, x, gx in zip("q k v w beta log_fgate".split(), inputs, g):
        assert gx.stride() == x.stride(), (name, gx.stride(), x.stride())


@pytest.mark.parametrize("N, QB, NG", [(12, 2, 2), (16, 2, 8), (7, 2, 2), (7, 1, 3), (40, 1, 8), (5, 1, 5)])
def test_within_chunk_programs_split_the_tiles(N, QB, NG):
    """One chunk's programs take every query tile once, in order; each other program's sums
    cover the blocks its tiles reach, packed one after another; the work is shared about evenly."""
    spans = bwd_within.within_spans(N, N, QB, NG)
    tiles = -(-N // QB)
    assert len(spans) == NG and spans[0][0] == 0 and spans[-1][1] == tiles
    at = 0
    for (lo, hi, nb, start), nxt in zip(spans, spans[1:] + [(tiles,)]):
        assert lo < hi == nxt[0] and start == at
        assert nb >= min(N, QB * hi)  # the blocks its tiles reach: their own, and those they walk
        at += nb
    assert spans[-1][2] == N
    work = [sum(QB * (t + 2) - 1 for t in range(lo, hi)) for lo, hi, _, _ in spans]
    assert max(work) <= sum(work) / NG + QB * (tiles + 1), work


def test_scan_programs_fill_the_gpu_by_their_own_warps(monkeypatch):
    """16 heads on 132 SMs: a scan of 4 warps (two programs an SM) takes 16 programs a head, one
    of 8 warps takes 8; with few blocks to share, no more programs than blocks."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(
        multi_processor_count=132))
    gpu = torch.device("cuda", 0)
    assert DEFAULT_SETTINGS.num_groups(240, 16, gpu, 4) == 16
    assert DEFAULT_SETTINGS.num_groups(240, 16, gpu, 8) == 8
    assert DEFAULT_SETTINGS.num_groups(3, 16, gpu, 4) == 3


@pytest.fixture
def nan_buffers(monkeypatch):
    """torch.empty and torch.empty_like fill floating-point tensors with NaN: a kernel that reads
    a buffer before writing it shows, in a sum or even in a product with zero."""
    empty, empty_like = torch.empty, torch.empty_like

    def filled(x):
        return x.fill_(float("nan")) if x.is_floating_point() else x

    monkeypatch.setattr(torch, "empty", lambda *a, **k: filled(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: filled(empty_like(*a, **k)))


@pytest.mark.skipif(CUDA, reason="interpreter settings")
@pytest.mark.parametrize("chunks", [(1000,), (2,), (2, 4)], ids=["one chunk", "chunks", "levels"])
def test_no_buffer_is_read_before_it_is_written(nan_buffers, chunks):
    """Every buffer the kernels use comes from torch.empty, here filled with NaN: a sum that starts
    from what was there, not from zero, shows; so does a product with a value left unset, even
    times zero. One chunk in two programs, chunks of two blocks, or those crossed inside chunks
    of four; query blocks in pairs at D = 16; with and without w and the gate."""
    settings = replace(DEFAULT_SETTINGS, **in_pairs(16), interpret_chunks=chunks, interpret_groups=2)
    T = 128 if len(chunks) > 1 else 109  # eight blocks: the levels divide them
    N = -(-T // settings.interpret_block)
    assert len(settings.chunk_levels(N, settings.interpret_block, 16, torch.device("cpu"), 0)) == len(chunks)
    for D, hh, gate in ((16, True, True), (32, True, False), (16, False, True)):
        check_against_reference(make_inputs(2, T, 1, D, hh, gate), settings=settings)


@pytest.mark.skipif(CUDA, reason="interpreter settings")
def test_one_block_needs_no_moved_queries_keys_or_block_products(nan_buffers):
    """A sequence of one block has no pair of different blocks: its queries and keys moved across
    the block, the block's product and their gradients are neither computed nor read (buffers
    from torch.empty filled with NaN show a read), with query blocks in pairs asked for at every
    head size; with and without w and the gate."""
    settings = replace(DEFAULT_SETTINGS, **in_pairs(*SUPPORTED_HEAD_DIMS))
    for T, D, hh, gate in ((16, 16, True, True), (9, 32, True, False), (1, 16, True, True),
                           (12, 16, False, True), (5, 32, False, False)):
        assert -(-T // settings.interpret_block) == 1
        check_against_reference(make_inputs(2, T, 2, D, hh, gate), settings=settings)


def test_second_backward_gives_the_same_gradients():
    """The first backward overwrites the kept intra-block logits with their gradient; a second one
    through the same graph (retain_graph) must not read them, and gives the same gradients."""
    args = [a.requires_grad_(True) for a in make_inputs(1, 37, 2, 16, True, True, seed=5)]
    out = path_attention_triton(*args)
    dout = torch.randn_like(out)
    first = torch.autograd.grad(out, args, dout, retain_graph=True)
    second = torch.autograd.grad(out, args, dout)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.skipif(not CUDA, reason="GPU configurations")
@pytest.mark.parametrize("D", [16, 32, 64, 128])
def test_every_gpu_configuration(D):
    """Each configuration the kernels may run under (the first, and the fallbacks for lack of
    shared memory), forced, in bfloat16 against float64; over several chunks where chunks are
    used (blocks of 64 tokens)."""
    chunked = replace(DEFAULT_SETTINGS, one_chunk_tokens=0, fwd_one_chunk_tokens=0)
    fwd, bwd = (chunked.gpu_configs(kind, D, torch.bfloat16) for kind in ("fwd", "bwd"))
    tried = 0
    for i in range(max(len(fwd), len(bwd))):
        settings = replace(chunked, force_fwd_config=fwd[min(i, len(fwd) - 1)],
                           force_bwd_config=bwd[min(i, len(bwd) - 1)])
        try:
            args = make_inputs(2, 1100, 2, D, True, False, dtype=torch.bfloat16)
            ref_args = [a.double() if a is not None else None for a in args]
            dout = torch.randn(args[0].shape, device=DEV, dtype=torch.float64)
            out, g = grads(partial(path_attention_triton, settings=settings), args, dout)
            ref, rg = grads(path_attention_reference, ref_args, dout)
        except Exception as exc:
            if "out of resource" in str(exc).lower():
                continue
            raise
        tried += 1
        assert rel(out, ref) <= 2e-2, (i, rel(out, ref))
        for a, b in zip(g, rg):
            assert rel(a, b) <= 5e-2, (i, rel(a, b))
    assert tried


def test_short_sequences_take_smaller_blocks():
    configs = DEFAULT_SETTINGS.gpu_configs
    for kind, D in [("fwd", 32), ("bwd", 32), ("fwd", 128), ("bwd", 128)]:
        every = configs(kind, D, torch.bfloat16)
        assert configs(kind, D, torch.bfloat16, 1024) == every
        assert [c[0] for c in configs(kind, D, torch.bfloat16, 32)] == [
            c[0] for c in every if c[0] <= 32]  # a 20-token sequence: no block of 64
        assert configs(kind, D, torch.bfloat16, 2) == every[-1:]  # the smallest there is
    for kind in ("fwd", "bwd"):  # a word problem of 8 to 16 tokens: blocks of 16
        for D in SUPPORTED_HEAD_DIMS:
            assert {configs(kind, D, torch.bfloat16, T)[0][0] for T in (8, 12, 16)} == {16}


@pytest.mark.skipif(not CUDA, reason="GPU configurations")
@pytest.mark.parametrize("T, block", [(20, 32), (12, 16)])
def test_word_problem_shape_on_gpu(T, block):
    """Shapes the word problems train on (D = 32) in bfloat16, under the configuration chosen
    for them, against float64."""
    args = make_inputs(64, T, 4, 32, True, True, dtype=torch.bfloat16)
    ref_args = [a.double() if a is not None else None for a in args]
    dout = torch.randn(args[0].shape, device=DEV, dtype=torch.float64)
    out, g = grads(path_attention_triton, args, dout)
    ref, rg = grads(path_attention_reference, ref_args, dout)
    assert rel(out, ref) <= 2e-2
    for a, b in zip(g, rg):
        assert rel(a, b) <= 5e-2
    chosen = {key[0]: cfg[0] for key, cfg in chosen_configs().items()
              if key[1:3] == (32, torch.bfloat16) and key[-1] == block}
    assert chosen == {"fwd": block, "bwd": block}


def test_autocast_does_not_reach_the_block_algebra():
    args = make_inputs(1, 37, 2, 32)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        out = path_attention_triton(*args)
    ref = path_attention_reference(*[a.double() for a in args])
    assert out.dtype == torch.float32
    assert rel(out, ref) <= 1e-4, rel(out, ref)


def test_beta_near_two():
    B, T, H, D = (2, 300, 2, 64) if CUDA else (1, 37, 2, 32)
    check_against_reference(make_inputs(B, T, H, D, True, True, beta_near_two=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_forward(dtype):
    """16-bit inputs: the block-local kernels take float16 operands (on the CPU at D = 32 too)."""
    B, T, H, D = (2, 1000, 2, 64) if CUDA else (1, 37, 2, 32)
    settings = replace(DEFAULT_SETTINGS, half_block_head_dims=(D,))
    args = make_inputs(B, T, H, D, True, True, dtype=dtype)
    check_against_reference(args, fwd_tol=2e-2, with_grad=False, settings=settings)
    # and the backward gives finite gradients in the input dtypes, close to float64's
    dout = torch.randn(args[0].shape, device=DEV)
    _, g = grads(partial(path_attention_triton, settings=settings), args, dout)
    _, rg = grads(path_attention_reference, [a.double() for a in args], dout.double())
    for a, x, b in zip(g, [a for a in args if a is not None], rg):
        assert a.dtype == x.dtype and torch.isfinite(a.float()).all()
        assert rel(a, b) <= 5e-2, rel(a, b)


@pytest.mark.skipif(CUDA, reason="interpreter settings")
@pytest.mark.parametrize("dout_scale", [1e-7, 1e8], ids=["tiny", "large"])
def test_bfloat16_backward_at_any_gradient_scale(dout_scale):
    """bfloat16 has float32's range, but 16-bit inputs may carry the queries' gradient back
    across blocks and chunks, and through the block-local algebra, in float16, scaled into its
    range: gradients far below float16's smallest normal number, or above its largest, keep
    their precision. Chunks of four blocks, soft attention without a gate, so that the gradient
    crosses several blocks."""
    settings = replace(DEFAULT_SETTINGS, interpret_chunks=(4,), **in_pairs(32), half_adjoint_head_dims=(32,),
                       half_block_head_dims=(32,))
    args = make_inputs(1, 170, 2, 32, True, False)
    args[0] = args[0] * 0.3
    args = [a.bfloat16() if i < 3 else a for i, a in enumerate(args)]
    dout = torch.randn(args[0].shape, device=DEV).bfloat16().double() * dout_scale
    _, g = grads(partial(path_attention_triton, settings=settings), args, dout)
    _, rg = grads(path_attention_reference, [a.double() if a is not None else None for a in args], dout)
    for name, a, b in zip("q k v w beta".split(), g, rg):
        err = ((a.double() - b).norm() / b.norm()).item()  # rel() would floor tiny norms
        assert err <= 2e-2, (name, err)


def test_parameter_dtypes_are_upcast():
    B, T, H, D = (1, 37, 2, 32)
    q, k, v, w, beta, lf = make_inputs(B, T, H, D)
    base = path_attention_triton(q, k, v, w, beta, lf)
    other = path_attention_triton(q, k, v, w.double(), beta.half(), lf.bfloat16())
    ref = path_attention_reference(q.double(), k.double(), v.double(), w.double(), beta.half().double(),
                                   lf.bfloat16().double())
    assert rel(other, ref) <= 1e-4
    assert rel(base, ref) <= 1e-2  # beta/log_fgate rounded differently


def test_backward_is_deterministic():
    B, T, H, D = (2, 1100, 2, 64) if CUDA else (2, 37, 2, 16)
    args = make_inputs(B, T, H, D, True, True)
    dout = torch.randn(args[0].shape, device=DEV)
    out1, g1 = grads(path_attention_triton, args, dout)
    out2, g2 = grads(path_attention_triton, args, dout)
    assert torch.equal(out1, out2)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)


def test_unsupported_inputs_raise(monkeypatch):
    q, k, v, w, beta, lf = make_inputs(1, 8, 1, 16)
    bad = torch.randn(1, 8, 1, 48, device=DEV)
    with pytest.raises(ValueError, match="supported"):
        path_attention_triton(bad, bad, bad)
    with pytest.raises(ValueError, match="shape"):
        path_attention_triton(q, k[:, :4], v)
    with pytest.raises(ValueError, match="beta"):
        path_attention_triton(q, k, v, w, beta[..., :1].expand(1, 8, 1)[:, :4], lf)
    with pytest.raises(ValueError, match="together"):
        path_attention_triton(q, k, v, w, None)
    with pytest.raises(ValueError, match="dtype"):
        path_attention_triton(q.long(), k.long(), v.long())
    cpu = [x.cpu() for x in (q, k, v)]
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="CUDA"):
        path_attention_triton(*cpu)


def test_dispatch_through_path_attention():
    from pathbench.kernels import path_attention

    args = make_inputs(1, 37, 2, 32)
    out = path_attention(*args, backend="triton")
    assert rel(out, path_attention_triton(*args)) == 0.0


@pytest.mark.skipif(not CUDA, reason="auto picks the kernel for CUDA tensors only")
def test_auto_backend_runs_the_kernel_where_it_applies():
    """On CUDA, "auto" is the kernel at its head sizes and dtypes and the torch implementation
    at others (a model with heads of 48, or in float64), not an error."""
    from pathbench.kernels import path_attention_blockwise

    args = make_inputs(1, 37, 2, 32)
    assert rel(path_attention(*args), path_attention_triton(*args)) == 0.0
    for args in (make_inputs(1, 37, 2, 48), [x.double() for x in make_inputs(1, 37, 2, 32)]):
        assert rel(path_attention(*args), path_attention_blockwise(*args)) == 0.0


@pytest.mark.skipif(not CUDA, reason="GPU only")
@pytest.mark.parametrize("D", [16, 32, 64, 128])
def test_float16_on_gpu(D):
    """float16 q/k/v against float64 over 1100 tokens, with gate: in chunks of 512 tokens where
    the head size takes chunks, else in one."""
    settings = replace(DEFAULT_SETTINGS, one_chunk_tokens=0, fwd_one_chunk_tokens=0)
    check_against_reference(make_inputs(2, 1100, 2, D, True, True, dtype=torch.float16), fwd_tol=2e-2, grad_tol=5e-2,
                            settings=settings)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("gate", [True, False], ids=["fox", "softmax"])
def test_without_householder_in_16_bit(dtype, gate):
    """FoX and plain softmax, the kernels without their Householder part, with 16-bit q/k/v
    against float64, forward and gradients: on the GPU in chunks of 512 tokens at both chunked
    head sizes, the specialisations FoX models train on there."""
    settings = replace(DEFAULT_SETTINGS, one_chunk_tokens=0)
    B, T, H = (2, 1100, 2) if CUDA else (1, 70, 2)
    for D in (64, 128) if CUDA else (32,):
        check_against_reference(make_inputs(B, T, H, D, False, gate, dtype=dtype), fwd_tol=2e-2, grad_tol=5e-2,
                                settings=settings)


@pytest.mark.skipif(not CUDA, reason="GPU chunk sizes")
@pytest.mark.parametrize("D,gate", [(32, True), (64, False), (128, True)], ids=str)
def test_chunks_on_gpu(D, gate):
    """Sequences longer than one_chunk_tokens run in chunks; forced here at a moderate length,
    in float32 also at the smaller blocks of the backward at D = 128."""
    settings = replace(DEFAULT_SETTINGS, one_chunk_tokens=0, fwd_one_chunk_tokens=0, chunked_head_dims=(D,),
                       chunked_blocks=(16, 32, 64))
    check_against_reference(make_inputs(1, 1100, 2, D, True, gate), settings=settings)
    check_against_reference(make_inputs(1, 1100, 2, D, False, gate), settings=settings)


@pytest.mark.skipif(not CUDA, reason="GPU chunk sizes")
@pytest.mark.parametrize("D", [64, 128])
def test_chunk_levels_on_gpu(D):
    """The backward's levels of chunks, forced at 2000 tokens (at most two chunks a level): chunks
    of 512 crossed inside chunks of 1024, which are crossed across the sequence; bfloat16 with
    gate and float32 without, against float64."""
    settings = replace(DEFAULT_SETTINGS, level_chunks=2, one_chunk_tokens=0)
    assert settings.chunk_levels(32, 64, D, torch.device(DEV), 0) == (8, 16)
    check_against_reference(make_inputs(2, 2000, 2, D, True, True, dtype=torch.bfloat16), fwd_tol=2e-2, grad_tol=5e-2,
                            settings=settings)
    check_against_reference(make_inputs(2, 2000, 2, D, True, False), settings=settings)


@pytest.mark.skipif(not CUDA, reason="long sequences run on the GPU only")
@pytest.mark.parametrize("D,gate", [(64, True), (128, False)], ids=str)
def test_long_sequence_matches_torch_blockwise(D, gate):
    from pathbench.kernels import path_attention

    args = make_inputs(1, 4096, 2, D, True, gate)
    dout = torch.randn(args[0].shape, device=DEV)
    out, g = grads(lambda *a: path_attention(*a, backend="triton"), args, dout)
    ref, rg = grads(lambda *a: path_attention(*a, backend="torch"), args, dout)
    assert rel(out, ref) <= 1e-4, rel(out, ref)
    for a, b in zip(g, rg):
        assert rel(a, b) <= 1e-3, rel(a, b)


@pytest.mark.skipif(not CUDA, reason="GPU only")
def test_long_sequence_bf16_against_float64():
    args = make_inputs(1, 4096, 2, 64, True, True, dtype=torch.bfloat16)
    check_against_reference(args, fwd_tol=2e-2, with_grad=False)


@pytest.mark.skipif(CUDA, reason="checks the message without a GPU")
def test_bench_kernel_without_gpu_exits_2(capsys):
    from pathbench.runners.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "kernel"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GPU" in err[0]


def test_bench_kernel_tables_and_csv(tmp_path, monkeypatch):
    """The benchmark's two tables (calls launched from Python, and replayed from a CUDA graph)
    put ours against the others, and its CSV is replaced whole or not at all."""
    import csv

    from pathbench.runners.bench import kernel as bench_kernel

    rows = [dict(impl=impl, mode=mode, D=128, T=768, H=2, B=32, ms=ms, graph_ms=graph, peak_mb=mb)
            for impl, ms, graph, mb in (("ours", 2.0, 1.2, 300.0), ("fla", 1.6, 1.6, 320.0), ("sdpa", 0.5, 0.3, 40.0))
            for mode in ("fwd", "fwd+bwd")]
    launched = bench_kernel._table(rows).splitlines()
    replayed = bench_kernel._table(rows, "graph_ms").splitlines()
    assert launched[2].split("|")[2].split() == ["1.25", "4.00"]  # ours/fla, ours/sdpa
    assert replayed[2].split("|")[2].split() == ["0.75", "4.00"]
    assert "MB" in launched[0] and "MB" not in replayed[0]

    path = tmp_path / "kernel_bench.csv"
    bench_kernel._write_csv(rows, path)
    with open(path) as fh:
        back = list(csv.DictReader(fh))
    assert [(r["impl"], r["mode"], float(r["graph_ms"])) for r in back] == [
        (r["impl"], r["mode"], r["graph_ms"]) for r in rows]

    def killed(fd):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", killed)  # stopped after the new rows are written, before the rename
        with pytest.raises(KeyboardInterrupt):
            bench_kernel._write_csv(rows[:2], path)
    with open(path) as fh:
        assert len(list(csv.DictReader(fh))) == len(rows)
    assert os.listdir(tmp_path) == ["kernel_bench.csv"]


@pytest.mark.parametrize("hh, gate", [(True, True), (True, False), (False, True)], ids=str)
def test_compiled_call_is_one_graph_with_the_eager_results(hh, gate):
    """Under torch.compile the kernel is an operator in the graph (fullgraph: no break), and
    its output and gradients are those of the eager call."""
    B, T, H, D = (2, 300, 2, 64) if CUDA else (2, 37, 2, 16)
    args = make_inputs(B, T, H, D, hh, gate)
    dout = torch.randn(args[0].shape, device=DEV)
    compiled = torch.compile(lambda *xs: path_attention(*xs, backend="triton"),
                             backend="aot_eager", fullgraph=True)
    out, g = grads(compiled, args, dout)
    ref, rg = grads(path_attention_triton, args, dout)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    for a, b in zip(g, rg):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_operators_pass_opcheck():
    """Schema, fake (shape-only) implementations and autograd registration of the operators
    agree with what they compute (torch.library.opcheck)."""
    B, T, H, D = (1, 70, 2, 32) if CUDA else (1, 19, 2, 16)
    q, k, v, w, beta, lf = make_inputs(B, T, H, D)
    leaves = [x.requires_grad_() for x in (q, k, v, w, beta, lf)]
    torch.library.opcheck(torch.ops.pathbench.path_attention_forward.default,
                          (*leaves, D**-0.5))
    O, LSE = torch.ops.pathbench.path_attention_forward(*leaves, D**-0.5)
    assert O.requires_grad and not LSE.requires_grad  # only O carries gradients back
    q, k, v, w, beta, lf = make_inputs(B, T, H, D, gate=False)
    O, LSE = torch.ops.pathbench.path_attention_forward(q, k, v, w, beta, None, D**-0.5)
    torch.library.opcheck(torch.ops.pathbench.path_attention_backward.default,
                          (q, k, v, w, beta, None, O, LSE, torch.randn_like(q), D**-0.5))


def test_model_checks_loss_keeps_a_float64_models_precision():
    """gpu_check's loss: bf16 logits go to float32, float64 ones stay float64 (near a loss of
    0 a float32 loss is mostly rounding, so a float64 reference needs its own precision)."""
    from pathbench.runners.bench.gpu_check import _loss

    class Logits(torch.nn.Module):
        def __init__(self, dtype):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(4, 4, dtype=dtype))

        def forward(self, inputs):
            return self.table[inputs]

    inputs, targets = torch.tensor([[0, 1, 2, 3]]), torch.tensor([[0, 1, 2, 3]])
    for dtype, expected in ((torch.bfloat16, torch.float32), (torch.float32, torch.float32),
                            (torch.float64, torch.float64)):
        assert _loss(Logits(dtype), inputs, targets).dtype == expected
