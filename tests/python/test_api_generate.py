"""Python API happy paths (python/deepinfer): LLM.generate / LLM.chat on the
embedded default model, checked against oracles — Hugging Face `tokenizers`
for prompt ids and output text, `re` / `jsonschema` for structured output,
and the engine's own single-request output for batching and seeding."""
import json
import math
import os
import re

import pytest

from api_lib import deepinfer, hf_tokenizer

from deepinfer import LLM, SamplingParams

PROMPTS = ["Hello world", "The quick brown fox jumps over", "1, 2, 3, 4,", "Once upon a time"]


@pytest.fixture(scope="module")
def llm():
    with LLM() as m:
        yield m


@pytest.fixture(scope="module")
def hf(llm):
    return hf_tokenizer(llm.model_path)


def greedy(n=12, **kw):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


def test_sampling_params_defaults_are_vllms():
    p = SamplingParams()
    expect = dict(n=1, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0,
                  repetition_penalty=1.0, seed=None, stop=[], stop_token_ids=[], include_stop_str_in_output=False,
                  ignore_eos=False, max_tokens=16, min_tokens=0, logprobs=None, prompt_logprobs=None,
                  skip_special_tokens=True)
    for k, v in expect.items():
        assert getattr(p, k) == v, k
    assert SamplingParams(max_new_tokens=7).max_tokens == 7
    assert SamplingParams(seed=5).seq_seed == 5
    assert SamplingParams(stop="x").stop == ["x"]


def test_generate_text_ids_and_text_match_hf_tokenizer(llm, hf):
    outs = llm.generate(PROMPTS, greedy(10), use_tqdm=False)
    assert [o.prompt for o in outs] == PROMPTS
    for p, o in zip(PROMPTS, outs):
        assert o.prompt_token_ids == hf.encode(p, add_special_tokens=False).ids
        c = o.outputs[0]
        assert len(c.token_ids) == 10 and c.finish_reason == "length" and c.stop_reason is None
        assert c.text == hf.decode(c.token_ids, skip_special_tokens=True)
        assert o.finished


def test_batch_equals_single_and_token_prompts_equal_text(llm):
    batch = llm.generate(PROMPTS, greedy(), use_tqdm=False)
    for p, b in zip(PROMPTS, batch):
        alone = llm.generate(p, greedy(), use_tqdm=False)[0]
        assert alone.outputs[0].token_ids == b.outputs[0].token_ids
        by_ids = llm.generate({"prompt_token_ids": b.prompt_token_ids}, greedy(), use_tqdm=False)[0]
        assert by_ids.outputs[0].token_ids == b.outputs[0].token_ids
    # a bare list of ids is one prompt; a list of lists is many
    assert len(llm.generate(batch[0].prompt_token_ids, greedy(2), use_tqdm=False)) == 1
    assert len(llm.generate([o.prompt_token_ids for o in batch], greedy(2), use_tqdm=False)) == len(batch)


def test_seq_seed_is_independent_of_the_batch(llm):
    sp = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seq_seed=1234, ignore_eos=True)
    alone = llm.generate(PROMPTS[1], sp, use_tqdm=False)[0].outputs[0].token_ids
    mixed = [SamplingParams(temperature=0.8, max_tokens=9, seq_seed=i) for i in range(3)] + [sp]
    in_batch = llm.generate(PROMPTS[:3] + [PROMPTS[1]], mixed, use_tqdm=False)[3].outputs[0].token_ids
    assert alone == in_batch
    other = llm.generate(PROMPTS[1], SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seq_seed=99,
                                                    ignore_eos=True), use_tqdm=False)[0].outputs[0].token_ids
    assert other != alone  # 16 draws over a 1024-token vocabulary: equal only by a bug


def test_n_completions_and_logprobs(llm):
    out = llm.generate(PROMPTS[0], SamplingParams(n=3, temperature=1.0, max_tokens=6, seq_seed=7, logprobs=3,
                                                  ignore_eos=True), use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    for c in out.outputs:
        assert len(c.logprobs) == len(c.token_ids) == 6
        total = 0.0
        for tok, row in zip(c.token_ids, c.logprobs):
            assert next(iter(row)) == tok  # the sampled token comes first
            assert 3 <= len(row) <= 4
            top = sorted((lp for lp in row.values() if lp.rank), key=lambda lp: lp.rank)
            assert [lp.rank for lp in top] == [1, 2, 3]
            assert all(a.logprob >= b.logprob for a, b in zip(top, top[1:]))
            assert row[tok].logprob <= top[0].logprob + 1e-6
            total += row[tok].logprob
        assert math.isclose(total, c.cumulative_logprob, rel_tol=1e-5, abs_tol=1e-4)


def test_greedy_token_is_rank_one_and_prompt_logprobs(llm):
    out = llm.generate(PROMPTS[1], greedy(5, logprobs=1, prompt_logprobs=2), use_tqdm=False)[0]
    for tok, row in zip(out.outputs[0].token_ids, out.outputs[0].logprobs):
        assert row[tok].rank == 1
    pl = out.prompt_logprobs
    assert len(pl) == len(out.prompt_token_ids) and pl[0] is None
    for tok, row in zip(out.prompt_token_ids[1:], pl[1:]):
        assert tok in row and row[tok].logprob <= 0
        best = max(lp.logprob for lp in row.values())
        assert row[tok].logprob <= best + 1e-6


def test_stop_string_ends_the_text(llm):
    full = llm.generate(PROMPTS[3], greedy(24), use_tqdm=False)[0].outputs[0]
    text = full.text
    # a stop string taken from the middle of the greedy text
    cut = len(text) // 2
    stop = text[cut:cut + 3]
    assert len(stop) == 3
    out = llm.generate(PROMPTS[3], greedy(24, stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[:text.index(stop)]
    kept = llm.generate(PROMPTS[3], greedy(24, stop=[stop], include_stop_str_in_output=True),
                        use_tqdm=False)[0].outputs[0]
    assert kept.text == text[:text.index(stop) + len(stop)]


def test_max_tokens_alias_and_stop_token_ids(llm):
    base = llm.generate(PROMPTS[0], greedy(8), use_tqdm=False)[0].outputs[0].token_ids
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True,
                                                  stop_token_ids=[base[4]]), use_tqdm=False)[0].outputs[0]
    first = base.index(base[4])
    assert out.token_ids == base[:first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == base[4]


def test_structured_output_validates(llm):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"], "additionalProperties": False}
    regex = r"(red|green|blue)-[0-9]{2,4}"
    ebnf = 'root ::= "yes" | "no" | "maybe " [a-z]{1,3}'
    choices = ["alpha", "beta", "gamma delta"]
    sps = [SamplingParams(temperature=0.7, seq_seed=s, max_tokens=200, json_schema=schema,
                          disable_any_whitespace=True) for s in range(3)]
    sps += [SamplingParams(temperature=0.7, seq_seed=s, max_tokens=30, regex=regex) for s in range(3)]
    sps += [SamplingParams(temperature=0.7, seq_seed=s, max_tokens=30, ebnf=ebnf) for s in range(3)]
    sps += [SamplingParams(temperature=0.7, seq_seed=s, max_tokens=30, choice=choices) for s in range(3)]
    outs = llm.generate([PROMPTS[0]] * len(sps), sps, use_tqdm=False)
    for sp, o in zip(sps, outs):
        c = o.outputs[0]
        assert c.finish_reason == "stop", (sp.constraint(), c)
        kind, _ = sp.constraint()
        if kind == "json_schema":
            jsonschema.validate(json.loads(c.text), schema)
        elif kind == "regex":
            assert re.fullmatch(regex, c.text), c.text
        elif kind == "ebnf":
            assert re.fullmatch(r"yes|no|maybe [a-z]{1,3}", c.text), c.text
        else:
            assert c.text in choices


def test_chat_thinking_switch_and_parsed_message(llm):
    msgs = [{"role": "user", "content": "Say hi."}]
    off = llm.chat(msgs, greedy(6), thinking=False, use_tqdm=False)[0]
    on = llm.chat(msgs, greedy(6), chat_template_kwargs={"thinking": True}, use_tqdm=False)[0]
    assert off.prompt.endswith("<｜Assistant｜></think>")
    assert on.prompt.endswith("<｜Assistant｜><think>")
    assert off.outputs[0].content is not None and not off.outputs[0].reasoning_content
    assert on.outputs[0].reasoning_content is not None  # the whole output is reasoning: no </think> forced
    two = llm.chat([msgs, msgs + [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"}]],
                   greedy(4), thinking=False, use_tqdm=False)
    assert len(two) == 2 and two[0].outputs[0].token_ids == off.outputs[0].token_ids[:4]


def test_progress_factory_sees_every_request(llm):
    bars = []

    class Bar:
        def __init__(self, total, desc, **_):
            self.total, self.desc, self.n, self.post = total, desc, 0, ""
            self.closed = False
            bars.append(self)

        def update(self, k):
            self.n += k

        def set_postfix_str(self, s, refresh=True):
            self.post = s

        def close(self):
            self.closed = True

    llm.generate(PROMPTS, greedy(3), use_tqdm=Bar)
    (b,) = bars
    assert (b.total, b.n, b.closed, b.desc) == (len(PROMPTS), len(PROMPTS), True, "Processed prompts")
    assert "input:" in b.post and "output:" in b.post


def test_simple_bar_without_tqdm(llm, monkeypatch, capsys):
    import builtins
    real = builtins.__import__

    def no_tqdm(name, *a, **k):
        if name.startswith("tqdm"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    llm.generate(PROMPTS[:2], greedy(2))
    err = capsys.readouterr().err
    assert "Processed prompts" in err and "2/2" in err


def test_version_and_env_describe():
    assert re.match(r"\d+\.\d+", deepinfer.version())
    assert "DEEPINFER_BATCH_INVARIANT" in deepinfer.env_describe()


def test_step_budgets_are_the_backends_unless_given(llm):
    # left out, the budgets are the backend's (include/deepinfer.h)
    if llm.accelerator == "cpu":
        assert (llm.max_num_seqs, llm.max_num_batched_tokens, llm.memory_limit) == (64, 512, 2 << 30)
    else:
        assert (llm.max_num_seqs, llm.max_num_batched_tokens) == (1024, 16384) and llm.memory_limit >= 256 << 20
    ref = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy(6), use_tqdm=False)]
    # given, they are kept; small ones only change how the steps are cut
    with LLM(max_num_seqs=2, max_num_batched_tokens=3, memory_limit=64 << 20) as m:
        assert (m.max_num_seqs, m.max_num_batched_tokens, m.memory_limit) == (2, 3, 64 << 20)
        if m.batch_invariant or m.accelerator == "cpu":
            assert [o.outputs[0].token_ids for o in m.generate(PROMPTS, greedy(6), use_tqdm=False)] == ref


def test_weights_in_memory_on_the_cpu_only(llm):
    # the default model is a checkpoint: on the CPU its weights are copied
    # into memory (a few MB: well within the rule), on a GPU they stay mapped
    if llm.accelerator == "cpu" and os.environ.get("DI_WEIGHTS_IN_MEMORY") != "0":
        assert llm.weights_in_memory > 1 << 20
    else:
        assert llm.weights_in_memory == 0


def test_sglang_style_dict_params(llm):
    ref = llm.generate(PROMPTS[0], greedy(5), use_tqdm=False)[0].outputs[0].token_ids
    d = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    assert llm.generate(PROMPTS[0], d, use_tqdm=False)[0].outputs[0].token_ids == ref
    assert llm.generate([PROMPTS[0]], [d], use_tqdm=False)[0].outputs[0].token_ids == ref
    with pytest.raises(ValueError, match="unexpected keyword"):
        llm.generate(PROMPTS[0], {"max_new_token": 5}, use_tqdm=False)


def test_interrupt_in_progress_stops_the_run_and_leaves_the_engine_usable(llm):
    class Boom(Exception):
        pass

    class Bar:
        def __init__(self, **_):
            pass

        def update(self, k):
            pass

        def set_postfix_str(self, s, refresh=True):
            raise Boom()  # as a KeyboardInterrupt would arrive in the callback

        def close(self):
            pass

    with pytest.raises(Boom):
        llm.generate(PROMPTS, greedy(50), use_tqdm=Bar)
    ref = llm.generate(PROMPTS[0], greedy(4), use_tqdm=False)
    assert len(ref) == 1 and len(ref[0].outputs[0].token_ids) == 4


def test_padded_vocabulary_draws_only_ids_with_text(llm, tmp_path):
    """A model whose vocabulary is padded past its tokenizer's ids (here the
    default model's config with vocab_size 1536 against its 1,024-id
    tokenizer, dummy weights): the padding ids have no text, so they are never
    drawn, greedy or sampled; before, such a draw ended the sequence with an
    error after its first token."""
    cfg = json.load(open(os.path.join(llm.model_path, "config.json")))
    text = cfg.get("text_config", cfg)
    n_tok = 1024
    assert text["vocab_size"] == n_tok
    text["vocab_size"] = 1536
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with LLM(model=str(path), load_format="dummy", tokenizer=os.path.join(llm.model_path, "tokenizer.json")) as m:
        for sp in (greedy(20), SamplingParams(temperature=1.5, max_tokens=20, ignore_eos=True, seed=3)):
            outs = m.generate([p + " padded" for p in PROMPTS], sp, use_tqdm=False)
            for o in outs:
                c = o.outputs[0]
                assert c.finish_reason == "length", c.error
                assert len(c.token_ids) == 20 and max(c.token_ids) < n_tok
