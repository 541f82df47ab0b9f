"""The package's shape: the layering holds (packages form a DAG, lowest first), DESIGN's public names import
from where DESIGN lists them, and every command answers --help as a console script and through launch/."""

import importlib
import os
import shutil
import subprocess
import sys

import pytest

from hang import HANG_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERING = os.path.join(ROOT, "..", "shared", "tools", "layering.py")

# DESIGN.md's public API: module -> names
PUBLIC = {
    "jaxsearch.models.qwen2": ["forward", "init_params", "Qwen2Config", "preset", "token_logprobs"],
    "jaxsearch.models.hf_io": ["load_hf", "save_hf"],
    "jaxsearch.models.tokenizer": ["QwenTokenizer"],
    "jaxsearch.eval.metrics": ["exact_match", "f1_score"],
    "jaxsearch.agent.sampler": ["generate"],
    "jaxsearch.rl.rewards": ["RewardInput", "get_reward"],
    "jaxsearch.retrieval.factory": ["make_retriever"],
    "jaxsearch.data.qa": ["load_examples"],
}
# console script -> the launch/ wrapper of the same command
COMMANDS = {
    "jaxsearch-train": "train.py",
    "jaxsearch-eval": "eval.py",
    "jaxsearch-serve": "serve_agent.py",
    "jaxsearch-retriever": "serve_retriever.py",
    "jaxsearch-index": "build_index.py",
    "jaxsearch-plan": "plan.py",
    "jaxsearch-world": "make_world.py",
    "jaxsearch-hypergraph": "build_hypergraph.py",
    "jaxsearch-convert": "convert_checkpoint.py",
}

# Packages lowest first (a top-level module is its own package); an import only ever points down.
ORDER = ["config", "registry", "files", "multihost", "parallel", "checkpoint", "models", "retrieval", "data",
         "agent", "scoring", "rl", "eval", "serving", "plan", "cli", "testing"]
CORE = set(ORDER[:6])  # the core modules may import each other (no cycle: the layering tool checks it)


def _imports():
    """(importing package, imported package, file, module) for every jaxsearch import, lazy ones included."""
    import ast

    out = []
    for folder, _, files in os.walk(os.path.join(ROOT, "jaxsearch")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
            here = parts[1] if len(parts) > 1 else parts[0]
            for node in ast.walk(ast.parse(open(path).read())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                for module in names:
                    if module.startswith("jaxsearch."):
                        out.append((here, module.split(".")[1], os.path.relpath(path, ROOT), module))
    return out


def test_every_import_points_down_the_layers():
    imports = _imports()
    assert {a for a, *_ in imports} <= set(ORDER)  # a new package must be placed in ORDER
    up = [f"{f} imports {m} ({a} -> {b})" for a, b, f, m in imports
          if a != b and not (a in CORE and b in CORE) and ORDER.index(b) > ORDER.index(a)]
    assert not up, "\n".join(up)


@pytest.mark.skipif(not os.path.exists(LAYERING), reason="../shared/tools/layering.py is not beside the repo")
def test_the_layering_tool_passes():
    out = subprocess.run([sys.executable, LAYERING], cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_designs_public_names_import_from_where_design_lists_them(module):
    imported = importlib.import_module(module)
    for name in PUBLIC[module]:
        assert callable(getattr(imported, name)), f"{module}.{name}"


@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_every_command_answers_help_as_a_console_script_and_through_launch(script):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    path = shutil.which(script)
    assert path is not None, f"{script} is not installed: pip install -e ."
    launch = [sys.executable, os.path.join(ROOT, "launch", COMMANDS[script])]
    for cmd in ([path], launch):
        out = subprocess.run([*cmd, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_S)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "usage" in out.stdout.lower() or "flags:" in out.stdout, out.stdout
