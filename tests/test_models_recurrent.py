"""The recurrent mixers as models: causal, trained and packed like the attention variants,
recorded with their size and state, refused on a GPU without fla-core in one line, and drawn
with a legend that groups the families."""

from __future__ import annotations

import json

import pytest
import torch

from pathbench import UserError
from pathbench.models import build_model, model_config
from pathbench.runners.training.config import resolve_run
from conftest import cli, sweep_counts

MIXERS = ["deltanet", "gated_deltanet", "deltaproduct", "rwkv7"]
TINY = ["--steps", "4", "--batch-size", "8", "--set", "train.eval_every=2",
        "--set", "train.eval_num=16", "--set", "model.d_model=32", "--set", "model.heads=2"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", MIXERS)
def test_a_mixer_is_causal(name):
    torch.manual_seed(0)
    model = build_model(model_config({"attention": name, "vocab_size": 7, "layers": 2,
                                      "d_model": 32})).double()
    tokens = torch.randint(0, 7, (2, 12))
    changed = tokens.clone()
    changed[:, 8] = (changed[:, 8] + 1) % 7
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :8], after[:, :8], rtol=0, atol=0)
    assert not torch.allclose(before[:, 8:], after[:, 8:])


@pytest.mark.parametrize("name", MIXERS)
def test_a_mixers_q_k_and_v_see_their_token_and_the_three_before_it(name):
    from pathbench.models.recurrent import SHORT_CONV_WIDTH

    torch.manual_seed(0)
    mixer = build_model(model_config({"attention": name, "vocab_size": 7, "d_model": 32,
                                      "heads": 2})).blocks[0].attn.double()
    x = torch.randn(1, 10, 32, dtype=torch.float64)
    before = mixer.project(x)  # q, k, v [1, T, H, D]
    for changed in range(10):
        y = x.clone()
        y[0, changed] += 1.0
        after = mixer.project(y)
        for position in range(10):
            sees_it = changed <= position < changed + SHORT_CONV_WIDTH
            for old, new in zip(before, after):
                assert torch.equal(old[0, position], new[0, position]) != sees_it, \
                    (changed, position)


def test_deltaproducts_steps_are_a_model_setting():
    sizes = [build_model(model_config({"attention": "deltaproduct", "vocab_size": 7, "layers": 1,
                                       "d_model": 32, "heads": 2, "householder_steps": steps}))
             .state_size() for steps in (1, 3)]
    # more steps per token: the same matrices, and the last 3 inputs of 2 x 2 more channels
    assert sizes == [2 * 16 * 16 + 3 * 3 * 32, 2 * 16 * 16 + 3 * (3 + 4) * 32]
    one, three = (resolve_run("a5", options={"model": "deltaproduct"},
                              sets={"model": {"householder_steps": str(n)}}, device="cpu")
                  for n in (1, 3))
    assert one.run_id != three.run_id
    with pytest.raises(UserError, match="householder_steps"):
        model_config({"attention": "deltaproduct", "vocab_size": 7, "householder_steps": 0})


def test_on_a_gpu_without_fla_core_a_mixer_says_how_to_install_it(monkeypatch):
    from pathbench.models import recurrent

    monkeypatch.setattr(recurrent, "fla_installed", lambda: False)
    with pytest.raises(UserError) as error:
        resolve_run("a5", options={"model": "deltanet"}, device="cuda")
    assert "\n" not in str(error.value) and 'pip install -e ".[fla]"' in str(error.value)
    assert "model.backend=torch" in str(error.value)
    resolve_run("a5", options={"model": "path"}, device="cuda")  # attention needs no extra
    resolve_run("a5", options={"model": "deltanet"}, device="cpu")  # the CPU needs none
    # nor pathbench's own torch form on the GPU
    resolve_run("a5", options={"model": "deltanet"}, sets={"model": {"backend": "torch"}},
                device="cuda")


def test_a_sweep_packs_them_and_records_size_and_state(capsys, tmp_path):
    code, out, err = cli(capsys, "sweep", "a5", "--models", "deltanet,rwkv7", "--seeds", "0-1",
                         "--pack", "2", "--set", "task.length=4", *TINY, "--device", "cpu",
                         "--out", tmp_path)
    assert code == 0, err
    assert sweep_counts(out) == {"ok": 4}
    for path in tmp_path.glob("*/result.json"):
        record = json.loads(path.read_text())
        assert len(record["provenance"]["pack"]) == 2  # trained as a pack of two
        # layers x (heads x D^2, and the last 3 inputs of q, k and v's short convolution)
        assert record["model_size"]["state_size"] == 2 * (2 * 16 * 16 + 3 * 3 * 32)
        assert record["provenance"]["attention_backend"] == "torch"


def test_a_figure_with_both_families_groups_its_legend(capsys, tmp_path):
    from pathbench.runners.analysis.figures import render
    from pathbench.runners.analysis.records import load_frame

    code, _, err = cli(capsys, "sweep", "a5", "--models", "rope,path", "--layers",
                       "1,2", "--set", "task.length=4", *TINY, "--device", "cpu", "--out", tmp_path)
    assert code == 0, err
    # the mixer on its own backend, as the families sweep runs it: a setting of the model, not
    # a condition that splits the panels
    code, _, err = cli(capsys, "sweep", "a5", "--models", "deltanet", "--layers", "1,2",
                       "--set", "task.length=4", "--set", "model.backend=torch", *TINY,
                       "--device", "cpu", "--out", tmp_path)
    assert code == 0, err
    figure, _ = render(load_frame(tmp_path))
    assert [ax.get_title() for ax in figure.axes if ax.get_visible() and ax.get_title()][0] \
        == "a5 (length 4, 4 steps)"
    labels = [text.get_text() for text in figure.legends[0].get_texts()]
    assert labels[:6] == ["attention:", "rope", "path", "recurrent:", "deltanet", labels[5]]
    assert labels[5] not in ("rope", "path", "deltanet")  # baselines and lines come after


@pytest.mark.parametrize("capability, triton, refused", [
    ((9, 0), "3.6.0", True), ((9, 0), "3.4.0", True), ((9, 0), "3.7.0", True),
    ((9, 0), "3.6.0+git9a1b2c3", True), ((9, 0), "3.3.1", False), ((9, 0), "3.7.1", False),
    ((9, 0), "3.8.0", False), ((8, 0), "3.6.0", False), ((10, 0), "3.6.0", False),
])
def test_fla_cores_gated_backward_is_refused_on_hopper_under_triton_3_4_to_3_7_0(
        capability, triton, refused):
    from pathbench.models.recurrent import fla_gate_refused

    assert fla_gate_refused(capability, triton) is refused


def test_where_fla_core_refuses_the_gate_auto_takes_the_torch_form_and_fla_is_refused(
        monkeypatch):
    from types import SimpleNamespace

    from pathbench.models import recurrent

    monkeypatch.setattr(recurrent, "fla_installed", lambda: True)
    monkeypatch.setattr(recurrent, "_fla_gate_refused_here", lambda: True)
    on_gpu = SimpleNamespace(is_cuda=True)  # implementation() reads only where q lives

    def mixer(name, backend="auto"):
        return build_model(model_config({"attention": name, "vocab_size": 7,
                                         "backend": backend})).blocks[0].attn

    assert mixer("gated_deltanet").implementation(on_gpu) == "torch"
    assert mixer("deltanet").implementation(on_gpu) == "fla"  # ungated: fla-core runs it
    assert mixer("deltaproduct").implementation(on_gpu) == "fla"
    with pytest.raises(UserError) as error:
        resolve_run("a5", options={"model": "gated_deltanet"},
                    sets={"model": {"backend": "fla"}}, device="cuda")
    assert "\n" not in str(error.value) and "#640" in str(error.value)
    assert "model.backend=torch" in str(error.value)
    for name, backend in (("gated_deltanet", "auto"), ("deltanet", "fla")):
        resolve_run("a5", options={"model": name}, sets={"model": {"backend": backend}},
                    device="cuda")
    monkeypatch.setattr(recurrent, "_fla_gate_refused_here", lambda: False)
    assert mixer("gated_deltanet").implementation(on_gpu) == "fla"


def test_compiling_rwkv7s_torch_form_does_not_unroll_its_loop_over_tokens():
    # an unrolled loop makes compilation take time in proportion to the sequence length
    model = build_model(model_config({"attention": "rwkv7", "vocab_size": 7, "layers": 1,
                                      "heads": 2, "d_model": 32, "backend": "torch"}))
    traced = []
    for length in (8, 32):
        torch.compiler.reset()
        explained = torch._dynamo.explain(model)(torch.randint(0, 7, (2, length)))
        traced.append(sum(len(graph.graph.nodes) for graph in explained.graphs))
    torch.compiler.reset()
    assert traced[0] == traced[1] > 0
