"""`deepinfer run`, the README's main job: on a fresh cache folder it
generates the embedded default model in the official format, prints the
model summary and memory plan, and generates for a batch of prompts with a
tokens/s line; a second run reuses the generated files byte for byte."""
import hashlib
import os
import re

from cli_lib import run


def _tree_digest(root):
    h = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def test_run_generates_default_model_then_reuses_it(tmp_path):
    env = dict(os.environ, DEEPINFER_CACHE_DIR=str(tmp_path))
    env.pop("DEEPINFER_HF_MODEL_DIR", None)
    first = run("run", "--max-tokens", "4", env=env)
    out = first.stdout
    assert "generating the default model" in out
    assert "memory plan" in out and "weights:" in out
    # the backend and the budgets it took (the CPU's unless DEEPINFER_ACCELERATOR says otherwise)
    m = re.search(r"engine opened in [0-9.]+ s on (cpu|nvidia): up to (\d+) sequences and (\d+) tokens a step", out)
    assert m and (m.group(1), m.group(2), m.group(3)) in (("cpu", "64", "512"), ("nvidia", "1024", "16384"))
    # every prompt gets its continuation, and the run reports its speed
    assert len(re.findall(r"^> ", out, flags=re.M)) == 4
    assert len(re.findall(r"^\[4 tokens, length\]", out, flags=re.M)) == 4
    m = re.search(r"4 prompts: (\d+) prompt tokens, (\d+) generated tokens in [0-9.]+ s: ([0-9.]+) tokens/s", out)
    assert m and int(m.group(2)) == 16 and float(m.group(3)) > 0
    model_dirs = [d for d in tmp_path.iterdir() if d.is_dir() and d.name.startswith("default-")]
    assert len(model_dirs) == 1
    names = sorted(p.name for p in model_dirs[0].iterdir())
    assert "config.json" in names and "tokenizer.json" in names
    assert "model.safetensors.index.json" in names
    assert sum(n.endswith(".safetensors") for n in names) >= 1
    digest = _tree_digest(model_dirs[0])

    second = run("run", "--max-tokens", "4", env=env)
    assert "generating the default model" not in second.stdout
    assert _tree_digest(model_dirs[0]) == digest
    # the same seeded prompts give the same text on every run
    assert second.stdout.split("generation (")[1].split("\n", 1)[1].rsplit("4 prompts:", 1)[0] == \
        out.split("generation (")[1].split("\n", 1)[1].rsplit("4 prompts:", 1)[0]
