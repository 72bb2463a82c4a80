"""An attention variant from another package (tests/plugin), as `pathbench ls --models` sees it."""

import os
import subprocess
import sys

PLUGIN = "pathbench-plugin-parity"


def parameters(listing: str) -> dict[str, str]:
    """{name: "51,392 ..." or "error: ..."} from the lines of `pathbench ls --models` (the
    families' headings left out)."""
    rows = {}
    for line in listing.splitlines()[1:]:
        if line.strip().endswith(":"):  # "attention:", "recurrent:", "not loaded:"
            continue
        name, rest = line.strip().split(maxsplit=1)
        rows[name] = rest
    return rows


def test_ls_models_lists_builtins_and_the_plugin_variant(plugin_cli):
    result = plugin_cli("ls", "--models", "--layers", "2", "--heads", "4", "--d-model", "32")
    assert result.returncode == 0, result.stderr
    assert "layers=2 heads=4 d_model=32" in result.stdout.splitlines()[0]
    rows = parameters(result.stdout)
    assert list(rows)[:6] == ["nope", "rope", "sba", "fox", "path", "path_fox"]
    assert rows["nope"].endswith("(built-in)")
    # ALiBi adds no parameters to a softmax layer; its row names the package it comes from.
    assert rows["alibi"] == rows["nope"].replace("(built-in)", f"({PLUGIN})")
    # A plugin that fails to import is listed with its error and does not stop the listing.
    assert rows["broken"].startswith("error:") and PLUGIN in rows["broken"]
    assert "pathbench_plugin_missing_dependency" in rows["broken"]


def test_plugin_variant_builds_and_is_causal(plugin_site, tmp_path):
    script = (
        "import torch\n"
        "from pathbench.models import build_model, model_config\n"
        "model = build_model(model_config({'attention': 'alibi', 'vocab_size': 7}))\n"
        "tokens = torch.randint(0, 7, (2, 9))\n"
        "logits = model(tokens)\n"
        "changed = tokens.clone(); changed[:, 5] = (changed[:, 5] + 1) % 7\n"
        "assert torch.equal(model(changed)[:, :5], logits[:, :5])\n"
        "logits.sum().backward()\n"
        "print(tuple(logits.shape))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(plugin_site)}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(2, 9, 7)"
