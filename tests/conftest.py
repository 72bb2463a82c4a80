"""Shared helpers and fixtures: running the command line in this process or in a subprocess,
reading a sweep's closing counts, the same global random state for every test, and the example
task plugin.

The plugin package in tests/plugin is installed with pip into a temporary folder (``--target``)
that the command's subprocess gets on its PYTHONPATH, where Python's entry-point discovery finds
it exactly as in site-packages. The environment running the tests is left unchanged, so test
sessions never see each other's plugins.
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

PLUGIN_SOURCE = Path(__file__).parent / "plugin"

# Without a GPU, Triton kernels run in Triton's interpreter, which must be chosen before Triton
# is first imported; importing torch.compiler (any test module may) imports it.
if importlib.util.find_spec("torch") is not None:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def cli(capsys, *args) -> tuple[int, str, str]:
    """Run ``pathbench ARGS`` in this process: (exit status, stdout, stderr)."""
    from pathbench.runners.cli import main

    try:
        main([str(arg) for arg in args])
        code = 0
    except SystemExit as exit_:
        code = exit_.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def sweep_counts(stdout: str) -> dict[str, int]:
    """The outcome counts of a sweep's closing line ("sweep finished: 1 ok, 1 lost; ...")."""
    [line] = [line for line in stdout.splitlines() if line.startswith("sweep finished: ")]
    summary = line.removeprefix("sweep finished: ").rsplit("; records in ", 1)[0]
    if summary == "nothing to do":
        return {}
    return {outcome: int(count) for count, outcome in
            (re.fullmatch(r"(\d+) (.+)", part).groups() for part in summary.split(", "))}


def run_pathbench(args, cwd, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    """``pathbench ARGS`` in a fresh interpreter, with ``extra_path`` first on its sys.path."""
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pathbench.runners.cli", *map(str, args)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )


@pytest.fixture
def pathbench_cli(tmp_path):
    """Run the command line in a subprocess (cwd = the test's tmp_path); no plugins added."""
    return lambda *args: run_pathbench(args, cwd=tmp_path)


def _can_build_without_network() -> bool:
    """Whether this environment can build the plugin's wheel itself (no build isolation).

    setuptools builds wheels on its own from version 70.1; older ones (a fresh Python 3.11
    virtual environment has 65) need the separate `wheel` package.
    """
    if importlib.util.find_spec("setuptools") is None:
        return False
    major, minor = (int(part) for part in version("setuptools").split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory) -> Path:
    """A folder holding the installed example plugin (distribution pathbench-plugin-parity)."""
    workdir = tmp_path_factory.mktemp("plugin")
    source, site = workdir / "source", workdir / "site"
    shutil.copytree(PLUGIN_SOURCE, source)  # pip builds in place; keep the repository clean
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site]
    if _can_build_without_network():
        command.append("--no-build-isolation")
    result = subprocess.run([*command, source], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"pip could not install the example plugin:\n{result.stderr}")
    return site


@pytest.fixture
def plugin_cli(tmp_path, plugin_site):
    """Run the command line in a subprocess that sees the installed example plugin."""
    return lambda *args: run_pathbench(args, cwd=tmp_path, extra_path=plugin_site)


@pytest.fixture(autouse=True)
def fixed_global_seeds():
    """Every test starts from the same global random state, whatever ran before it: a test
    that draws from torch's, numpy's or Python's global generator gives the same inputs alone,
    in any order, and on every run."""
    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture
def one_thread():
    """Tiny tensors: one thread is as fast, and immune to other processes on a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
