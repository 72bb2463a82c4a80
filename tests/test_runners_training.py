"""The training loop on the CPU: the packed optimizer against torch's AdamW, a pack of runs
against the same runs trained one by one, and the warnings it keeps quiet."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch

from pathbench.models import build_model, model_config
from pathbench.models.pack import member_state_dict, pack_models
from pathbench.runners.training.config import train_config
from pathbench.runners.training.optimizer import PackedAdamW
from pathbench.runners.training.loop import Member, train
from pathbench.tasks import make_task

pytestmark = pytest.mark.usefixtures("one_thread")


def small_model(attention="path", seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    config = model_config({"attention": attention, "vocab_size": 11, "layers": 2, "heads": 2,
                           "d_model": 16})
    return build_model(config).to(dtype)


def random_gradients(model, scale, generator):
    for p in model.parameters():
        gradient = scale * torch.randn(p.shape, dtype=p.dtype, generator=generator)
        if p.grad is None:
            p.grad = gradient
        else:  # in place: a packed optimizer's gradients are views of its flat buffer
            p.grad.copy_(gradient)


def test_packed_adamw_is_torch_adamw_with_global_norm_clipping():
    ours, theirs = small_model(dtype=torch.float64), small_model(dtype=torch.float64)
    optimizer = PackedAdamW(ours, [1e-3], weight_decay=0.1, grad_clip=1.0, member_axis=False)
    decay = [p for p in theirs.parameters() if p.ndim >= 2]
    no_decay = [p for p in theirs.parameters() if p.ndim < 2]
    reference = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-3, betas=(0.9, 0.98))
    for step, scale in enumerate([0.01, 0.2, 5.0, 0.05]):  # clipping acts at 0.2 and 5
        lr = 1e-3 * (step + 1)
        optimizer.zero_grad()
        random_gradients(ours, scale, torch.Generator().manual_seed(step))
        optimizer.step(step + 1)
        random_gradients(theirs, scale, torch.Generator().manual_seed(step))
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
        for group in reference.param_groups:
            group["lr"] = lr
        reference.step()
    for (name, mine), theirs_p in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(mine, theirs_p, rtol=1e-10, atol=1e-12, msg=name)


def test_gradients_of_a_backward_land_in_the_flat_buffer():
    model = small_model()
    optimizer = PackedAdamW(model, [1e-3], weight_decay=0.1, grad_clip=1.0, member_axis=False)
    model(torch.randint(0, 11, (2, 5))).square().mean().backward()
    buffer = optimizer.grads.untyped_storage().data_ptr()
    assert all(p.grad.untyped_storage().data_ptr() == buffer for p in model.parameters())
    total = sum(p.grad.abs().sum() for p in model.parameters())
    assert total > 0
    torch.testing.assert_close(optimizer.grads.abs().sum(), total)


@pytest.mark.parametrize("attention", ["path", "deltanet", "deltaproduct", "rwkv7"])
def test_every_packed_parameter_and_gradient_starts_on_a_16_byte_boundary(attention):
    # DeltaNet's beta bias is two numbers wide: packed end to end, the parameters after it
    # would start 8 bytes off
    models = [small_model(attention, seed) for seed in (0, 1, 2)]
    pack = pack_models(models)
    PackedAdamW(pack, [1e-3] * 3, weight_decay=0.1, grad_clip=1.0, member_axis=True)
    for name, p in pack.named_parameters():
        assert p.data_ptr() % 16 == 0 and p.grad.data_ptr() % 16 == 0, name
        for member in p:
            assert member.data_ptr() % 16 == 0, name


TASK = make_task("flipflop", {"length": 16})
CONFIG = train_config({"steps": 30, "batch_size": 8, "warmup": 5, "eval_every": 10,
                       "eval_num": 32, "early_stop": None})


def train_alone(attention, seed, lr):
    model = small_model(attention, seed)
    curve = []
    outcome, = train(model, TASK, CONFIG, [Member(seed, lr, curve)], torch.device("cpu"),
                     progress=False)
    return outcome, curve


@pytest.mark.parametrize("attention", ["rope", "path_fox"])
def test_a_pack_trains_each_member_as_it_would_train_alone(attention):
    runs = [(0, 3e-3), (1, 3e-3), (0, 1e-3)]
    packed = pack_models([small_model(attention, seed) for seed, _ in runs])
    curves = [[] for _ in runs]
    outcomes = train(packed, TASK, CONFIG, [Member(seed, lr, curve)
                                           for (seed, lr), curve in zip(runs, curves)],
                     torch.device("cpu"), progress=False)
    for (seed, lr), outcome, curve in zip(runs, outcomes, curves):
        alone, alone_curve = train_alone(attention, seed, lr)
        assert outcome.status == alone.status == "ok" and outcome.steps == alone.steps == 30
        assert [point["step"] for point in curve] == [10, 20, 30]
        for point, alone_point in zip(curve, alone_curve):
            assert math.isclose(point["loss"], alone_point["loss"], rel_tol=1e-4)
            assert point["lr"] == alone_point["lr"]
        for name, value in alone.weights.items():
            torch.testing.assert_close(outcome.weights[name], value, rtol=1e-4, atol=1e-5,
                                       msg=name)
        assert outcome.metrics.keys() == alone.metrics.keys()
    # The members really differ: different seeds, different learning rates.
    assert not torch.equal(outcomes[0].weights["head.weight"], outcomes[1].weights["head.weight"])
    assert not torch.equal(outcomes[0].weights["head.weight"], outcomes[2].weights["head.weight"])


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="compiled, graph-replayed steps need a CUDA GPU (run on the GPU machine)")
@pytest.mark.parametrize("attention", ["rope", "path"])
def test_on_a_gpu_a_pack_trains_each_member_as_alone_within_bf16_rounding(attention):
    """The whole engine on the device: data drawn there, one graph a step, the schedule on
    the device; a member's curve is its curve alone up to bf16 rounding."""
    task = make_task("a5", {"length": 12})
    config = train_config({"steps": 60, "batch_size": 64, "warmup": 6, "eval_every": 20,
                           "eval_num": 256, "early_stop": None})
    device = torch.device("cuda")

    def model(seed):
        torch.manual_seed(seed)
        return build_model(model_config({"attention": attention, "vocab_size": len(task.vocab),
                                         "layers": 2, "heads": 2, "d_model": 64}))

    runs = [(0, 3e-3), (1, 1e-3)]
    curves = [[] for _ in runs]
    train(pack_models([model(seed) for seed, _ in runs]), task, config,
          [Member(seed, lr, curve) for (seed, lr), curve in zip(runs, curves)], device,
          progress=False)
    for (seed, lr), curve in zip(runs, curves):
        alone = []
        train(model(seed), task, config, [Member(seed, lr, alone)], device, progress=False)
        assert [point["step"] for point in curve] == [point["step"] for point in alone]
        assert [point["lr"] for point in curve] == [point["lr"] for point in alone]
        for point, alone_point in zip(curve, alone):
            assert math.isclose(point["loss"], alone_point["loss"], rel_tol=2e-2)
    assert curves[0][-1]["loss"] != curves[1][-1]["loss"]


def test_a_diverging_member_leaves_the_others_untouched():
    packed = pack_models([small_model("path", 0), small_model("path", 1)])
    outcomes = train(packed, TASK, CONFIG, [Member(0, 3e-3, []), Member(1, math.inf, [])],
                     torch.device("cpu"), progress=False)
    assert outcomes[1].status == "diverged" and outcomes[1].steps <= 2, outcomes[1]
    assert "loss became nan" in outcomes[1].reason
    alone, _ = train_alone("path", 0, 3e-3)
    assert outcomes[0].status == "ok" and outcomes[0].steps == 30
    for name, value in alone.weights.items():
        torch.testing.assert_close(outcomes[0].weights[name], value, rtol=1e-4, atol=1e-5)


def test_an_early_stopped_member_is_frozen_while_the_others_train_on(monkeypatch):
    import pathbench.runners.training.loop as training

    real_evaluate = training.evaluate

    def member_0_solves_validation(model, members, task, data, *args, **kwargs):
        metrics = real_evaluate(model, members, task, data, *args, **kwargs)
        if data.split == "val":  # the test splits stay real
            metrics[0] = {**metrics[0], task.primary_metric: 1.0}
        return metrics

    monkeypatch.setattr(training, "evaluate", member_0_solves_validation)
    config = train_config({**vars(CONFIG), "early_stop": 0.99})
    packed = pack_models([small_model("nope", 0), small_model("nope", 1)])
    curves = [[], []]
    outcomes = train(packed, TASK, config, [Member(0, 3e-3, curves[0]),
                                            Member(1, 3e-3, curves[1])],
                     torch.device("cpu"), progress=False)
    assert [(o.status, o.steps, o.stopped_early) for o in outcomes] == [
        ("ok", 10, True), ("ok", 30, False)]
    assert [len(curve) for curve in curves] == [1, 3]
    frozen, trained_on = member_state_dict(packed, 0), member_state_dict(packed, 1)
    for name, value in outcomes[0].weights.items():
        assert torch.equal(frozen[name], value), name  # unchanged since its stop at step 10
    assert all(torch.equal(trained_on[name], value) for name, value in outcomes[1].weights.items())
    assert outcomes[0].metrics.keys() == outcomes[1].metrics.keys() == {"test", "sparse", "dense"}


def test_runs_of_an_unpackable_model_train_one_after_another(tmp_path, monkeypatch):
    import pathbench.models.pack as pack
    from pathbench.runners.training.config import resolve_run
    from pathbench.runners.training.execute import execute_runs

    def refuse(models):
        raise pack.NotPackable("a plugin module")

    monkeypatch.setattr(pack, "pack_models", refuse)
    runs = [resolve_run("flipflop", options={"model": "nope", "d_model": 16, "steps": 4,
                                             "batch_size": 8},
                        sets={"task": {"length": "16"}, "train": {"eval_num": "16"}},
                        seed=seed, device="cpu", preset=None) for seed in (0, 1)]
    records = execute_runs(runs, tmp_path, progress=False)
    assert [record["status"] for record in records] == ["ok", "ok"]
    assert all((tmp_path / record["run_id"] / "model.pt").exists() for record in records)
    weights = [torch.load(tmp_path / record["run_id"] / "model.pt")["state_dict"]
               for record in records]
    assert weights[0]["head.weight"].shape == (len(TASK.vocab), 16)  # a single model's
    assert not torch.equal(weights[0]["head.weight"], weights[1]["head.weight"])


def test_inductor_advice_that_does_not_apply_is_not_printed():
    """Two notes inductor prints while it compiles a CUDA training step, as torch words them:
    TF32 for float32 products (PaTH's block algebra keeps float32 on purpose) and a reduction
    without online softmax. Other warnings still show."""
    code = textwrap.dedent(r"""
        import warnings
        import pathbench.runners.training.loop
        for message in (
            "TensorFloat32 tensor cores for float32 matrix multiplication available but not "
            "enabled. Consider setting `torch.set_float32_matmul_precision('high')` for better "
            "performance.",
            "\nOnline softmax is disabled on the fly since Inductor decides to\nsplit the "
            "reduction. Cut an issue to PyTorch if this is an\nimportant use case and you want "
            "to speed it up with online\nsoftmax.\n",
            "a warning of another kind",
        ):
            warnings.warn(message, UserWarning)
    """)
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stderr
    assert "a warning of another kind" in printed
    assert "TensorFloat32" not in printed and "Online softmax" not in printed


def test_evaluation_in_chunks_scores_every_sequence_once(monkeypatch):
    """A split larger than a chunk is generated a chunk at a time (chunk c from seed c) and its
    tallies add up to the metrics of all its sequences scored at once; its baselines too."""
    import numpy as np

    import pathbench.runners.training.loop as training

    monkeypatch.setattr(training, "EVAL_CHUNK", 7)
    task = make_task("mqrar", {"length": 32, "num_keys": 4, "num_values": 8, "n_back": 2})
    data = training.EvaluationSplit(task, "test", 17)
    chunks = list(data.chunks())
    assert [len(chunk) for chunk in chunks] == [7, 7, 3] and data.kept is None
    for seed, chunk in enumerate(chunks):
        assert np.array_equal(chunk.inputs, task.generate(len(chunk), seed, "test").inputs)
    model = build_model(model_config({"attention": "nope", "vocab_size": len(task.vocab),
                                      "layers": 1, "heads": 2, "d_model": 16}))
    inputs = np.concatenate([chunk.inputs for chunk in chunks])
    targets = np.concatenate([chunk.targets for chunk in chunks])
    with torch.no_grad():
        predictions = model(torch.from_numpy(inputs)).argmax(-1).numpy()
    rows = []
    model.register_forward_pre_hook(lambda module, args: rows.append(len(args[0])))
    [metrics] = training.evaluate(model, 1, task, data, 5 * 32 + 31, torch.device("cpu"))
    assert metrics == task.metrics(predictions, targets, "test")
    assert rows == [5, 2, 5, 2, 3]  # at most 5 * 32 + 31 tokens a forward
    _, baselines = training.hash_and_baselines(task, [data])
    assert baselines["test"]["latest_assignment"] == task.metrics(
        task.latest_assignment(inputs), targets, "test")["accuracy"]
    assert baselines["test"]["chance"] == 1 / 8
