"""The recurrent mixers' kernels (pathbench.kernels.delta_rule): the recurrences against brute
force written from their definitions (every state as an explicit sum of products of D x D
transition matrices), forward and gradients in float64; the chunked delta rule against the
recurrence; against fla-core's own plain references on the CPU (an independent oracle); and,
on a GPU, fla-core's fused operators (the CUDA path of pathbench.models.recurrent) and the
chunked form against the recurrences."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pathbench.kernels.delta_rule import (
    delta_rule_chunked,
    delta_rule_recurrence,
    rwkv7_chunked,
    rwkv7_recurrence,
)

pytestmark = pytest.mark.usefixtures("one_thread")
B, T, H, D = 2, 6, 2, 4


def fresh(*shape, generator, unit=False):
    x = torch.randn(*shape, generator=generator, dtype=torch.float64)
    return F.normalize(x, dim=-1) if unit else x


def delta_inputs(steps: int, gated: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = fresh(B, T, H, D, generator=g)
    k = fresh(B, T, steps, H, D, generator=g, unit=True)
    v = fresh(B, T, steps, H, D, generator=g)
    beta = 2 * torch.rand(B, T, steps, H, generator=g, dtype=torch.float64)  # (0, 2)
    log_gate = (F.logsigmoid(fresh(B, T, H, generator=g)) if gated else None)
    return q, k, v, beta, log_gate


def delta_rule_brute_force(q, k, v, beta, log_gate, scale):
    """o_t = scale * S_t^T q_t with S_t = sum over every write (s, j) up to t of the product of
    the transitions after it, times beta k v^T; each transition a D x D matrix: the gate
    exp(g_s) I at the start of token s, then I - beta_sj k_sj k_sj^T per step."""
    steps, eye = k.shape[2], torch.eye(D, dtype=q.dtype)
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            # every event in order: ("gate", s) or ("step", s, j)
            events = []
            for s in range(T):
                events.append(("gate", s, None))
                events += [("step", s, j) for j in range(steps)]

            def transition(event):
                kind, s, j = event
                if kind == "gate":
                    return eye * (log_gate[b, s, h].exp() if log_gate is not None else 1.0)
                key = k[b, s, j, h]
                return eye - beta[b, s, j, h] * torch.outer(key, key)

            for t in range(T):
                last = max(i for i, event in enumerate(events) if event[1] == t)
                state = torch.zeros(D, D, dtype=q.dtype)
                for i, (kind, s, j) in enumerate(events[:last + 1]):
                    if kind != "step":
                        continue
                    product = eye
                    for later in events[i + 1:last + 1]:
                        product = transition(later) @ product
                    write = beta[b, s, j, h] * torch.outer(k[b, s, j, h], v[b, s, j, h])
                    state = state + product @ write
                out[b, t, h] = scale * state.T @ q[b, t, h]
    return out


def rwkv7_brute_force(r, w, k, v, a, b_, scale):
    """o_t = scale * S_t^T r_t with S_t = sum_s (A_t ... A_{s+1}) k_s v_s^T and
    A_s = diag(exp(w_s)) + b_s a_s^T."""
    out = torch.zeros_like(r)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                state = torch.zeros(D, D, dtype=r.dtype)
                for s in range(t + 1):
                    product = torch.eye(D, dtype=r.dtype)
                    for u in range(s + 1, t + 1):
                        transition = torch.diag(w[b, u, h].exp()) + torch.outer(b_[b, u, h],
                                                                                 a[b, u, h])
                        product = transition @ product
                    state = state + product @ torch.outer(k[b, s, h], v[b, s, h])
                out[b, t, h] = scale * state.T @ r[b, t, h]
    return out


def assert_same_forward_and_gradients(fast, slow, inputs):
    leaves = [x.detach().requires_grad_() if x is not None else None for x in inputs]
    used = [x for x in leaves if x is not None]
    upstream = torch.randn(B, T, H, D, dtype=torch.float64,
                           generator=torch.Generator().manual_seed(99))
    first = fast(*leaves)
    grads = torch.autograd.grad((first * upstream).sum(), used)
    second = slow(*leaves)
    expected = torch.autograd.grad((second * upstream).sum(), used)
    torch.testing.assert_close(first, second, rtol=1e-10, atol=1e-12)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("steps, gated", [(1, False), (1, True), (3, False), (2, True)])
def test_delta_rule_recurrence_is_its_definition(steps, gated):
    inputs = delta_inputs(steps, gated, seed=torch.seed() % 2**31)
    assert_same_forward_and_gradients(
        lambda *x: delta_rule_recurrence(*x, scale=0.7),
        lambda *x: delta_rule_brute_force(*x, scale=0.7), inputs)


@pytest.mark.parametrize("steps, gated, chunk_steps", [
    (1, False, 4),  # chunks of 4 tokens, the last one shorter
    (1, True, 2),
    (3, False, 4),  # one token a chunk: its three steps
    (2, True, 4),  # two tokens a chunk
    (2, True, 64),  # the whole sequence in one chunk
])
def test_the_chunked_delta_rule_is_the_recurrence(steps, gated, chunk_steps):
    inputs = delta_inputs(steps, gated, seed=torch.seed() % 2**31)
    assert_same_forward_and_gradients(
        lambda *x: delta_rule_chunked(*x, scale=0.7, chunk_steps=chunk_steps),
        lambda *x: delta_rule_recurrence(*x, scale=0.7), inputs)


def rwkv7_inputs(seed: int, shape=(B, T, H, D), floor: float = 1.0):
    """r, w, k, v, a, b as RWKV-7's mixer makes them, the log decays w in (-floor, 0)."""
    g = torch.Generator().manual_seed(seed)
    r, k, v = (fresh(*shape, generator=g) for _ in range(3))
    w = -floor * torch.rand(*shape, generator=g, dtype=torch.float64)
    kappa = fresh(*shape, generator=g, unit=True)
    rate = torch.rand(*shape, generator=g, dtype=torch.float64)
    return r, w, k, v, -kappa, kappa * rate


def assert_float32_form_is_the_reference(fast, device, reference, inputs):
    """``fast`` in float32 on ``device`` against ``reference`` in float64 on the CPU, forward
    and gradients, each within 1e-4 of the reference's largest entry."""
    upstream = fresh(*inputs[0].shape, generator=torch.Generator().manual_seed(99))
    results = []
    for fn, where, dtype in ((fast, device, torch.float32), (reference, "cpu", torch.float64)):
        leaves = [None if x is None else x.to(where, dtype).requires_grad_() for x in inputs]
        out = fn(*leaves)
        used = [x for x in leaves if x is not None]
        grads = torch.autograd.grad((out * upstream.to(where, dtype)).sum(), used)
        results.append([t.detach().cpu().double() for t in (out, *grads)])
    for got, want in zip(*results):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * want.abs().max().item())


def test_rwkv7_recurrence_is_its_definition():
    inputs = rwkv7_inputs(seed=torch.seed() % 2**31)
    assert_same_forward_and_gradients(
        lambda *x: rwkv7_recurrence(*x, scale=0.7),
        lambda *x: rwkv7_brute_force(*x, scale=0.7), inputs)


@pytest.mark.parametrize("chunk_tokens", [1, 4, 16])  # 4: the last chunk shorter; 16: one
def test_the_chunked_rwkv7_is_the_recurrence(chunk_tokens):
    inputs = rwkv7_inputs(seed=torch.seed() % 2**31)
    assert_same_forward_and_gradients(
        lambda *x: rwkv7_chunked(*x, scale=0.7, chunk_tokens=chunk_tokens),
        lambda *x: rwkv7_recurrence(*x, scale=0.7), inputs)


def test_the_chunked_rwkv7_holds_in_float32_down_to_its_floor_of_log_decays():
    """Chunks of 16 tokens whose log decays reach -5 a token (the factored decays then span
    e^-80 to e^80), in float32, against the recurrence in float64: forward and gradients."""
    r, w, k, v, a, b = rwkv7_inputs(torch.seed() % 2**31, shape=(2, 37, 2, 8), floor=5.0)
    w[:, :16] = -5  # a whole chunk at the floor
    assert_float32_form_is_the_reference(rwkv7_chunked, "cpu", rwkv7_recurrence,
                                         (r, w, k, v, a, b))


# fla-core's plain references, an independent oracle for the same definitions


def test_delta_rule_recurrences_agree_with_fla_cores_references():
    naive = pytest.importorskip("fla.ops.delta_rule.naive")
    gated_naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")
    product_naive = pytest.importorskip("fla.ops.gated_delta_product.naive")
    seed = torch.seed() % 2**31
    q, k, v, beta, log_gate = delta_inputs(1, True, seed)
    heads_first = lambda x: x.transpose(1, 2)  # noqa: E731  [B, H, T, ...]
    expected, _ = naive.delta_rule_recurrence(*map(heads_first, (q, k[:, :, 0], v[:, :, 0],
                                                                  beta[:, :, 0])))
    torch.testing.assert_close(delta_rule_recurrence(q, k, v, beta).float(),
                               heads_first(expected).float(), rtol=1e-5, atol=1e-5)
    expected, _ = gated_naive.naive_recurrent_gated_delta_rule(
        q, k[:, :, 0], v[:, :, 0], beta[:, :, 0], log_gate)
    torch.testing.assert_close(delta_rule_recurrence(q, k, v, beta, log_gate).float(),
                               expected.float(), rtol=1e-5, atol=1e-5)
    q, k, v, beta, log_gate = delta_inputs(3, True, seed + 1)
    expected, _ = product_naive.naive_recurrent_gated_delta_product(
        q, k.flatten(1, 2), v.flatten(1, 2), log_gate, beta.flatten(1, 2), scale=D**-0.5,
        num_householder=3)
    torch.testing.assert_close(delta_rule_recurrence(q, k, v, beta, log_gate).float(),
                               expected.float(), rtol=1e-5, atol=1e-5)


def test_rwkv7_recurrence_agrees_with_fla_cores_reference():
    dplr = pytest.importorskip("fla.ops.generalized_delta_rule.dplr.naive")
    r, w, k, v, a, b = rwkv7_inputs(seed=torch.seed() % 2**31)
    heads_first = lambda x: x.transpose(1, 2)  # noqa: E731
    # in float32: the reference mixes its own float32 state with float64 inputs
    expected, _ = dplr.dplr_recurrence(*(heads_first(x).float() for x in (r, k, v, a, b, w)))
    torch.testing.assert_close(rwkv7_recurrence(r, w, k, v, a, b, scale=D**-0.5).float(),
                               heads_first(expected).float(), rtol=1e-5, atol=1e-5)


# the CUDA path: fla-core's fused operators against the recurrences, through the model layer

requires_cuda_and_fla = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="fla-core's fused operators need a CUDA GPU (run on "
                                          "the GPU machine)")


@requires_cuda_and_fla
@pytest.mark.parametrize("length", [20, 128])
@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet", "deltaproduct", "rwkv7"])
def test_fla_operators_match_the_recurrences_forward_and_backward(name, length):
    """The mixer with backend fla (bfloat16) against the same weights on backend torch in
    float64 (the chunked forms, themselves tested against the recurrences above): outputs and
    every parameter's gradient, within bfloat16's tolerance; at a length that ends inside one
    of fla-core's chunks (64 tokens for the delta rule, 16 for RWKV-7), and at whole chunks."""
    pytest.importorskip("fla")
    from pathbench.models import ATTENTIONS, model_config, recurrent

    if getattr(ATTENTIONS.get(name), "gated", False) and recurrent._fla_gate_refused_here():
        pytest.skip("fla-core refuses the gated backward on this GPU under this Triton (its "
                    "issue #640); pathbench refuses backend fla here and auto takes the torch "
                    "form, as test_models_recurrent checks")
    config = model_config({"attention": name, "vocab_size": 8, "heads": 2, "d_model": 64,
                           "backend": "fla"})
    torch.manual_seed(torch.seed() % 2**31)
    fast = ATTENTIONS.get(name)(config).cuda()
    slow = ATTENTIONS.get(name)(model_config({**vars(config), "backend": "torch"})).cuda()
    slow.load_state_dict(fast.state_dict())
    slow.double()
    x = torch.randn(2, length, 64, device="cuda")
    upstream = torch.randn(2, length, 64, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = fast(x)
    (out.float() * upstream).sum().backward()
    expected = slow(x.double())
    (expected * upstream.double()).sum().backward()
    scale = expected.abs().max().item()
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=3e-2 * scale)
    for (name_, p_fast), (_, p_slow) in zip(fast.named_parameters(), slow.named_parameters()):
        tolerance = 5e-2 * p_slow.grad.abs().max().item() + 1e-6
        torch.testing.assert_close(p_fast.grad.double(), p_slow.grad, rtol=0, atol=tolerance,
                                   msg=name_)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU "
                                                          "machine)")
@pytest.mark.parametrize("steps, gated", [(1, False), (1, True), (2, True)])
def test_on_a_gpu_the_chunked_delta_rule_is_the_recurrence(steps, gated):
    """backend torch's GPU path: the chunked form on CUDA in float32, at two chunks of 64 steps
    and a part of a third, against the recurrence in float64 on the CPU, forward and
    gradients."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    T = 80 * 2 // steps + 5
    inputs = [fresh(2, T, 4, 32, generator=g),
              fresh(2, T, steps, 4, 32, generator=g, unit=True),
              fresh(2, T, steps, 4, 32, generator=g),
              2 * torch.rand(2, T, steps, 4, generator=g, dtype=torch.float64),
              F.logsigmoid(fresh(2, T, 4, generator=g)) if gated else None]
    assert_float32_form_is_the_reference(delta_rule_chunked, "cuda", delta_rule_recurrence,
                                         inputs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU "
                                                          "machine)")
def test_on_a_gpu_the_chunked_rwkv7_is_the_recurrence():
    """backend torch's GPU path for rwkv7: the chunked form on CUDA in float32, at two chunks
    of 16 tokens and a part of a third, RWKV-7's range of log decays, against the recurrence
    in float64 on the CPU, forward and gradients."""
    inputs = rwkv7_inputs(torch.seed() % 2**31, shape=(2, 37, 4, 32), floor=math.exp(-0.5))
    assert_float32_form_is_the_reference(rwkv7_chunked, "cuda", rwkv7_recurrence, inputs)


def test_the_torch_forms_compute_in_float32_whatever_autocast_says():
    """Under bfloat16 autocast (as training on a GPU runs), the chunked delta rule and RWKV-7's
    recurrence and chunked form give exactly what they give without it, from float32 inputs."""
    delta = [x if x is None else x.float() for x in delta_inputs(2, True, seed=3)]
    rwkv = [x.float() for x in rwkv7_inputs(seed=4)]
    for fn, inputs in ((delta_rule_chunked, delta), (rwkv7_recurrence, rwkv),
                       (rwkv7_chunked, rwkv)):
        plain = fn(*inputs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(fn(*inputs), plain), fn.__name__
