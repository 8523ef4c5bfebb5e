"""Python API errors (ecosystem.md §4.1, §6): the bad inputs users expect a
ValueError for, with a message naming the problem — empty prompts,
out-of-vocabulary ids, over-long prompts, bad sampling values, more than one
constraint — and an engine that stays usable after each refusal."""
import math

import pytest

from api_lib import deepinfer  # noqa: F401

from deepinfer import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    with LLM(max_model_len=256) as m:
        yield m


def ok(llm):
    out = llm.generate("ok", SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert len(out) == 1 and len(out[0].outputs[0].token_ids) >= 1


@pytest.mark.parametrize("prompt", ["", {"prompt": ""}, {"prompt_token_ids": []}])
def test_empty_prompt(llm, prompt):
    with pytest.raises(ValueError, match="Prompt cannot be empty"):
        llm.generate(prompt, use_tqdm=False)
    ok(llm)


@pytest.mark.parametrize("ids", [[1, 2, 1024], [5, 99999], [-1], [2 ** 40]])
def test_out_of_vocabulary_ids(llm, ids):
    with pytest.raises(ValueError, match=r"out of vocabulary \(size 1024\)"):
        llm.generate({"prompt_token_ids": ids}, use_tqdm=False)
    ok(llm)


def test_over_long_prompt(llm):
    with pytest.raises(ValueError, match=r"The decoder prompt \(length 300\) is longer than the maximum model "
                                         r"length of 256"):
        llm.generate({"prompt_token_ids": [7] * 300}, use_tqdm=False)
    n = len(llm.get_tokenizer().encode("a b " * 200))
    with pytest.raises(ValueError, match=r"The decoder prompt \(length %d\)" % n):
        llm.generate("a b " * 200, use_tqdm=False)
    ok(llm)


BAD_VALUES = [
    (dict(n=0), "n must be in 1..64"),
    (dict(n=65), "n must be in 1..64"),
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=math.nan), "temperature must be a number"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(top_k=-2), "top_k"),
    (dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
    (dict(presence_penalty=3), "presence_penalty"),
    (dict(frequency_penalty=-3), "frequency_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty"),
    (dict(max_tokens=0), "max_tokens must be at least 1"),
    (dict(max_new_tokens=-4), "max_tokens must be at least 1"),
    (dict(min_tokens=9, max_tokens=4), "min_tokens"),
    (dict(logprobs=21), "logprobs must be in 0..20"),
    (dict(stop=[""]), "stop strings"),
    (dict(logit_bias={3: 500}), "logit_bias"),
    (dict(seed=-1), "seed"),
    (dict(seed=1, seq_seed=2), "seq_seed"),
    (dict(regex="a+", json_schema={"type": "string"}), "only one structured-output constraint"),
    (dict(choice=["a"], ebnf='root ::= "a"'), "only one structured-output constraint"),
    (dict(choice=[]), "choice must be a non-empty list"),
]


@pytest.mark.parametrize("kw,msg", BAD_VALUES, ids=[str(k) for k, _ in BAD_VALUES])
def test_bad_sampling_values(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kw)


@pytest.mark.parametrize("field,value,msg", [
    ("top_p", 2.0, "top_p"),
    ("n", 0, "n must be in 1..64"),
    ("temperature", -1.0, "temperature"),
    ("min_p", -0.5, "min_p"),
    ("regex", "[0-9]+", "only one structured-output constraint"),
])
def test_engine_checks_values_set_after_construction(llm, field, value, msg):
    """Attributes changed after the constructor's check reach the engine,
    which refuses them at submit with its own message."""
    sp = SamplingParams(temperature=0, max_tokens=4, choice=["x", "y"])
    if field != "regex":
        sp.choice = None
    setattr(sp, field, value)
    with pytest.raises(ValueError, match=msg):
        llm.generate("hi", sp, use_tqdm=False)
    ok(llm)


@pytest.mark.parametrize("kw,msg", [
    (dict(regex="(ab"), "regex"),
    (dict(json_schema='{"type": "object", "properties": '), "JSON|json"),
    (dict(ebnf='root ::= missing'), "missing|not defined|undefined"),
])
def test_constraints_that_do_not_compile(llm, kw, msg):
    with pytest.raises(ValueError, match=msg):
        llm.generate("hi", SamplingParams(max_tokens=4, **kw), use_tqdm=False)
    ok(llm)


def test_one_bad_prompt_refuses_the_whole_call_and_nothing_leaks(llm):
    prompts = ["fine", "also fine", {"prompt_token_ids": [2000]}]
    with pytest.raises(ValueError, match=r"prompt 2: .*out of vocabulary"):
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    outs = llm.generate(["fine"], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(outs) == 1 and outs[0].prompt == "fine"


def test_mismatched_params_and_bad_prompt_types(llm):
    with pytest.raises(ValueError, match="lengths of prompts"):
        llm.generate(["a", "b"], [SamplingParams()], use_tqdm=False)
    with pytest.raises(ValueError, match="unsupported prompt type"):
        llm.generate([3.5], use_tqdm=False)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate({"text": "x"}, use_tqdm=False)
    with pytest.raises(ValueError, match="messages"):
        llm.chat([], use_tqdm=False)


def test_open_errors(monkeypatch, tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword"):
        LLM(no_such_option=1)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(tensor_parallel_size=2)
    with pytest.raises((ValueError, OSError), match=str(tmp_path / "nope")):
        LLM(model=str(tmp_path / "nope"))
    monkeypatch.setenv("DEEPINFER_BATCH_INVARIANT", "maybe")
    with pytest.raises(ValueError, match="DEEPINFER_BATCH_INVARIANT"):
        LLM()
    monkeypatch.setenv("DEEPINFER_BATCH_INVARIANT", "1")
    monkeypatch.setenv("DEEPINFER_ACCELERATOR", "ascend")
    with pytest.raises(ValueError, match="not supported in this build"):
        LLM()


def test_closed_llm():
    m = LLM(max_model_len=64)
    m.close()
    with pytest.raises(RuntimeError, match="closed"):
        m.generate("x", use_tqdm=False)


def test_max_tokens_none_runs_to_the_model_length(llm):
    """Not an error: vLLM's max_tokens=None (and a max_tokens past the end)
    stop at max_model_len with finish_reason "length"."""
    for mt in (None, 10 ** 6):
        o = llm.generate("hello", SamplingParams(max_tokens=mt, temperature=0, ignore_eos=True), use_tqdm=False)[0]
        assert len(o.prompt_token_ids) + len(o.outputs[0].token_ids) == 256
        assert o.outputs[0].finish_reason == "length"
