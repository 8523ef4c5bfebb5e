"""`deepinfer ppl`: perplexity from prompt logprobs in windows, checked
against the same sum computed here from the Python API's prompt_logprobs
over windows cut by hand, and against its own definition
(ppl = exp(nll / scored))."""
import json
import math
import random

import pytest

from api_lib import deepinfer  # noqa: F401  (puts python/ on sys.path)
from cli_lib import need_bin, run

from deepinfer import LLM, SamplingParams


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    need_bin()
    rng = random.Random(5)
    words = "the of and to in is was for on that with as by at from his her an it be this are which".split()
    p = tmp_path_factory.mktemp("ppl") / "t.txt"
    p.write_text(" ".join(rng.choice(words) for _ in range(150)))
    return p


def python_nll(ids, win):
    with LLM() as llm:
        nll, scored = 0.0, 0
        sp = SamplingParams(max_tokens=0, prompt_logprobs=0)
        windows = [ids[b:b + win] for b in range(0, len(ids), win)]
        if len(windows) > 1 and len(windows[-1]) < 2:
            windows.pop()
        for o in llm.generate([{"prompt_token_ids": w} for w in windows], sp, use_tqdm=False):
            for tok, row in zip(o.prompt_token_ids[1:], o.prompt_logprobs[1:]):
                nll -= row[tok].logprob
                scored += 1
        return nll, scored, len(windows)


@pytest.mark.parametrize("ctx", [None, 40, 64])
def test_ppl_equals_windowed_prompt_logprobs(text, ctx):
    args = ["ppl", "--file", text, "--json"] + (["--ctx", ctx] if ctx else [])
    r = json.loads(run(*args).stdout)
    with LLM() as llm:
        ids = llm.get_tokenizer().encode(text.read_text())
    assert r["tokens"] == len(ids)
    nll, scored, n_win = python_nll(ids, ctx or 10 ** 9)
    assert (r["scored"], r["windows"]) == (scored, n_win)
    assert math.isclose(r["nll"], nll, rel_tol=1e-6)
    assert math.isclose(r["ppl"], math.exp(nll / scored), rel_tol=1e-6)


def test_ppl_text_output_and_errors(text, tmp_path):
    p = run("ppl", "--file", text)
    assert p.stdout.startswith("perplexity ") and "scored tokens" in p.stdout
    (tmp_path / "one.txt").write_text("a")
    p = run("ppl", "--file", tmp_path / "one.txt", check=False)
    assert p.returncode == 1 and "at least 2 are needed" in p.stderr
    p = run("ppl", "--file", tmp_path / "missing.txt", check=False)
    assert p.returncode == 1 and "missing.txt" in p.stderr
    p = run("ppl", "--file", text, "--ctx", "1", check=False)
    assert p.returncode == 2 and "--ctx" in p.stderr
