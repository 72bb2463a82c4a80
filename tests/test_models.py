"""The transformer and its attention variants: shapes, sizes, causality, decoding, config."""

from __future__ import annotations

import pytest
import torch

from pathbench import UserError
from pathbench.models import (
    ATTENTIONS,
    ModelConfig,
    build_model,
    count_parameters,
    describe_models,
    model_config,
)

VARIANTS = ["nope", "rope", "sba", "fox", "path", "path_fox"]
VOCAB = 11


pytestmark = pytest.mark.usefixtures("one_thread")


def make_model(attention, dtype=torch.float64, seed=0, **sizes):
    torch.manual_seed(seed)
    config = model_config({"attention": attention, "vocab_size": VOCAB, **sizes})
    return build_model(config).to(dtype)


def random_tokens(B=2, T=70, seed=0):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def test_builtin_variants_are_registered():
    assert ATTENTIONS.names()[:6] == VARIANTS
    assert all(ATTENTIONS.origin(name) == "built-in" for name in VARIANTS)


@pytest.mark.parametrize("attention", VARIANTS)
def test_forward_backward_and_parameter_count(attention):
    model = make_model(attention, dtype=torch.float32, layers=2, heads=2, d_model=64)
    logits = model(random_tokens())
    assert logits.shape == (2, 70, VOCAB) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())

    d, heads, layers = 64, 2, 2
    per_layer = 12 * d * d + 2 * d  # q, k, v, out projections, MLP (ratio 4), two norms
    if attention in ("fox", "path_fox"):
        per_layer += d * heads + heads  # forget gate
    if attention in ("path", "path_fox"):
        per_layer += 2 * 32 * d + 3 * d + d * heads + heads  # low-rank w, its conv, beta
    assert count_parameters(model) == 2 * VOCAB * d + d + layers * per_layer


@pytest.mark.parametrize("attention", VARIANTS)
def test_model_compiles_to_one_graph(attention):
    # Training on a GPU compiles the model; a break in its graph splits it into pieces that
    # pass tensors between compiled parts, which is slower and, on the H200, was fragile.
    model = make_model(attention, dtype=torch.float32, layers=2, d_model=32, heads=2)
    tokens = random_tokens(T=21)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(tokens), model(tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", VARIANTS)
def test_future_tokens_do_not_change_earlier_logits(attention):
    model = make_model(attention, layers=2)
    tokens = random_tokens()
    changed = tokens.clone()
    changed[:, 40] = (changed[:, 40] + 1) % VOCAB
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(after[:, :40], before[:, :40], rtol=0, atol=1e-12)
    assert (after[:, 40] - before[:, 40]).abs().max() > 1e-6


@pytest.mark.parametrize("attention", VARIANTS)
def test_a_repeated_first_token_is_invisible_where_attention_weights_sum_to_one(attention):
    """A sequence that opens with one token three times: where attention's weights sum to one,
    each of those positions averages identical values, and gets the first one's output
    whatever the position encoding; stick-breaking's weights sum to less than one and tell
    them apart. On A5 in the generator framing this caps position 1 (g g = g^-1, not g) at
    5/6 and position 2 (g g g = e) at 35/36 for every variant but SBA."""
    logits = make_model(attention, layers=2)(torch.tensor([[3, 3, 3, 5, 7]]))[0]
    repeated = [torch.allclose(logits[t], logits[0], rtol=0, atol=1e-12) for t in (1, 2)]
    assert repeated == ([False, False] if attention == "sba" else [True, True])


@pytest.mark.parametrize("attention", VARIANTS)
def test_step_by_step_decoding_equals_forward(attention):
    model = make_model(attention, layers=2)
    tokens = random_tokens(T=70)  # longer than one block of the blockwise PaTH
    expected = model(tokens)
    states = model.start_decoding()
    steps = torch.stack([model.decode_step(tokens[:, t], states) for t in range(70)], dim=1)
    torch.testing.assert_close(steps, expected, rtol=0, atol=1e-10)


def test_generate_greedy_continues_with_forward_argmax():
    model = make_model("path_fox", layers=2)
    prefix = random_tokens(T=9)
    generated = model.generate(prefix, num_new_tokens=6)
    assert generated.shape == (2, 15)
    assert torch.equal(generated[:, :9], prefix)
    with torch.no_grad():
        for t in range(9, 15):
            assert torch.equal(generated[:, t], model(generated[:, :t])[:, -1].argmax(-1))


def test_generate_sampling_is_reproducible_with_a_generator():
    model = make_model("rope", dtype=torch.float32)
    prefix = random_tokens(T=5)
    draws = [model.generate(prefix, 8, greedy=False, generator=torch.Generator().manual_seed(1))
             for _ in range(2)]
    assert torch.equal(draws[0], draws[1])
    with pytest.raises(ValueError, match="at least one token"):
        model.generate(prefix[:, :0], 3)


def test_generate_samples_each_token_from_the_softmax_of_its_logits():
    """20,000 continuations of one prefix, two tokens each: the first token's frequencies
    follow the softmax of the model's logits (total variation under 0.03, where about 0.01 is
    expected by chance; always taking the argmax would be over 0.4 away), and so do the second
    token's given the most frequent first."""
    model = make_model("rope", dtype=torch.float32)
    with torch.no_grad():
        model.head.weight.mul_(6)  # a next-token distribution far from uniform
    prefix = random_tokens(B=1, T=5).expand(20_000, 5)
    drawn = model.generate(prefix, 2, greedy=False, generator=torch.Generator().manual_seed(3))

    def distance(tokens, context):
        with torch.no_grad():
            expected = torch.softmax(model(context[None])[0, -1].double(), dim=-1)
        observed = torch.bincount(tokens, minlength=VOCAB).double() / len(tokens)
        assert expected.max() < 0.6  # the test can tell sampling from taking the argmax
        return 0.5 * (observed - expected).abs().sum().item()

    assert distance(drawn[:, 5], prefix[0]) < 0.03
    first = drawn[:, 5].mode().values
    given_first = drawn[drawn[:, 5] == first]
    assert distance(given_first[:, 6], given_first[0, :6]) < 0.06


@pytest.mark.parametrize("attention", VARIANTS)
def test_attention_maps(attention):
    model = make_model(attention, layers=2, heads=4)
    maps = model.attention_maps(random_tokens(T=20))
    assert len(maps) == 2
    for probs in maps:
        assert probs.shape == (2, 4, 20, 20)
        assert torch.equal(probs.triu(1), torch.zeros_like(probs))
        row_sums = probs.sum(-1)
        if attention == "sba":
            assert (row_sums <= 1 + 1e-12).all()
        else:
            torch.testing.assert_close(row_sums, torch.ones_like(row_sums))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_models(dtype):
    for attention in VARIANTS:
        model = make_model(attention, dtype=dtype)
        logits = model(random_tokens())
        assert logits.dtype == dtype and torch.isfinite(logits.float()).all()


@pytest.mark.parametrize("width", [3, 4])
def test_causal_depthwise_sum_is_the_depthwise_convolution(width):
    from pathbench.models.attention import causal_depthwise_sum

    gen = torch.Generator().manual_seed(width)
    window = torch.randn(3, 9 + width - 1, 5, dtype=torch.float64, generator=gen,
                         requires_grad=True)
    taps = torch.randn(5, width, dtype=torch.float64, generator=gen, requires_grad=True)
    fast = causal_depthwise_sum(window, taps)
    reference = torch.nn.functional.conv1d(window.transpose(1, 2), taps[:, None],
                                           groups=5).transpose(1, 2)
    torch.testing.assert_close(fast, reference)
    grad = torch.randn_like(fast)
    fast_grads = torch.autograd.grad(fast, (window, taps), grad)
    reference_grads = torch.autograd.grad(reference, (window, taps), grad)
    for a, b in zip(fast_grads, reference_grads):
        torch.testing.assert_close(a, b)
    # under bf16 inputs: products in the taps' float32, the result in bfloat16
    low = causal_depthwise_sum(window.detach().bfloat16(), taps.detach().float())
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.double(), reference.detach(), rtol=2e-2, atol=2e-2)


def test_beta_max_clips_beta():
    model = make_model("path", beta_max=0.5)
    layer = model.blocks[0].attn
    layer.beta_proj.bias.data.fill_(10.0)  # unclipped beta would be close to 2
    x = torch.randn(2, 30, 64, dtype=torch.float64)
    _, beta, _, _ = layer.position_inputs(x)
    assert beta.max() == 0.5


def test_config_defaults_and_string_values():
    assert model_config({"vocab_size": 5}) == ModelConfig(vocab_size=5)
    config = model_config({"vocab_size": "7", "layers": "3", "beta_max": "1.5", "heads": 4.0})
    assert (config.vocab_size, config.layers, config.beta_max, config.heads) == (7, 3, 1.5, 4)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"vocab_size": 5, "depth": 2}, "unknown model config key 'depth'; valid keys: vocab_size"),
        ({"layers": 2}, "needs 'vocab_size'"),
        ({"vocab_size": 5, "attention": "bogus"}, "unknown attention 'bogus'; valid choices: "),
        ({"vocab_size": 5, "layers": "two"}, "'layers' expects int, got 'two'"),
        ({"vocab_size": 5, "layers": 1.5}, "'layers' expects int, got 1.5"),
        ({"vocab_size": 5, "layers": True}, "'layers' expects int, got True"),
        ({"vocab_size": 5, "layers": 0}, "'layers' must be an integer from 1 to 256, got 0"),
        ({"vocab_size": 5, "layers": 100000}, "'layers' must be an integer from 1 to 256"),
        ({"vocab_size": 5, "d_model": 64, "heads": 3}, r"'d_model' \(64\) must be divisible by"),
        ({"vocab_size": 5, "attention": "rope", "d_model": 30}, "rope needs an even head"),
        ({"vocab_size": 5, "beta_max": 2.5}, "'beta_max' must be in \\(0, 2\\]"),
        ({"vocab_size": 5, "beta_max": 0}, "'beta_max' must be in \\(0, 2\\]"),
        ({"vocab_size": 5, "backend": "cuda"}, "'backend' 'cuda' is not available for attention "
                                               "'path'; valid choices: auto, torch, triton"),
        ({"vocab_size": 5, "attention": "rope", "backend": "triton"},
         "not available for attention 'rope'; valid choices: auto, torch$"),
    ],
)
def test_config_errors_name_the_problem(values, message):
    with pytest.raises(UserError, match=message):
        model_config(values)


def test_describe_models():
    rows = describe_models(layers=2, heads=2, d_model=64, vocab_size=VOCAB)
    assert [row["name"] for row in rows][:6] == VARIANTS
    for row in rows[:6]:
        assert row["origin"] == "built-in"
        assert row["parameters"] == count_parameters(make_model(row["name"], layers=2))
        assert (row["family"], row["state_size"]) == ("attention", None)  # a growing cache
    recurrent = {row["name"]: row for row in rows if row["family"] == "recurrent"}
    assert list(recurrent) == ["deltanet", "gated_deltanet", "deltaproduct", "rwkv7"]
    for name, row in recurrent.items():
        # a 32 x 32 matrix per head and layer, and the short convolutions' last 3 inputs of q,
        # k and v (and of deltaproduct's second key and value)
        convolved = 3 * 64 + (2 * 64 if name == "deltaproduct" else 0)
        assert row["state_size"] == 2 * (2 * 32 * 32 + 3 * convolved)
        assert row["parameters"] == count_parameters(make_model(row["name"], layers=2))
    with pytest.raises(UserError, match="divisible"):
        describe_models(layers=1, heads=3, d_model=64, vocab_size=VOCAB)


def test_backend_setting_reaches_the_kernel(monkeypatch):
    """model.backend is what the PaTH-family layers hand to path_attention, and what they report
    as their implementation (on the CPU, auto is the torch path)."""
    import pathbench.models.attention as attention_module

    seen = []
    real = attention_module.path_attention

    def spy(*args, backend):
        seen.append(backend)
        return real(*args, backend="torch")

    monkeypatch.setattr(attention_module, "path_attention", spy)
    for backend in ("auto", "torch", "triton"):
        model = make_model("path_fox", layers=2, backend=backend)
        model(torch.randint(0, VOCAB, (1, 5)))
        assert seen[-2:] == [backend, backend]
    q = torch.zeros(1, 1, 2, 32, dtype=torch.float64)
    assert make_model("path", backend="auto").blocks[0].attn.implementation(q) == "torch"
    assert make_model("path", backend="triton").blocks[0].attn.implementation(q) == "triton"
    assert make_model("rope").attention_backend(torch.device("cpu"), torch.float32) == "torch"


def test_registries_take_only_their_base_class():
    from pathbench.registry import Entry

    with pytest.raises(TypeError, match="is not a pathbench.models.Attention subclass"):
        ATTENTIONS.register("not_an_attention")(object)
    # A plugin entry that names something else is a one-line error naming its package.
    entries = ATTENTIONS.entries()
    ATTENTIONS._plugins["impostor"] = Entry("impostor", "impostor-pkg", lambda: torch.nn.Linear)
    try:
        with pytest.raises(UserError, match="attention 'impostor' from plugin package "
                                            "'impostor-pkg' is not a pathbench.models.Attention"):
            model_config({"vocab_size": 5, "attention": "impostor"})
    finally:
        del ATTENTIONS._plugins["impostor"]
    assert ATTENTIONS.entries() == entries
