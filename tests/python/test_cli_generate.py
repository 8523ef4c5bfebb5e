"""`deepinfer generate`: the CLI's output equals the Python API's for the
same request (both drive the engine; the prompt ids and text are checked
against Hugging Face `tokenizers`), structured-output flags give valid
output (`re`, `jsonschema`), and bad flags fail with a message."""
import json
import re

import pytest

from api_lib import hf_tokenizer
from cli_lib import need_bin, run

from deepinfer import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    need_bin()
    with LLM() as m:
        yield m


def gen_json(*args):
    return json.loads(run("generate", "--json", *args).stdout)


def test_greedy_text_equals_python_api(llm):
    hf = hf_tokenizer(llm.model_path)
    out = gen_json("-p", "The quick brown fox", "--temp", "0", "-n", "12", "--ignore-eos")
    ref = llm.generate("The quick brown fox", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                       use_tqdm=False)[0]
    assert out["token_ids"] == ref.outputs[0].token_ids
    assert out["prompt_tokens"] == len(hf.encode("The quick brown fox", add_special_tokens=False).ids)
    assert out["text"] == hf.decode(out["token_ids"], skip_special_tokens=True)
    assert out["finish_reason"] == "length" and out["completion_tokens"] == 12


def test_sampling_flags_reach_the_engine(llm):
    args = ["-p", "Once upon", "--temp", "0.9", "--top-p", "0.8", "--top-k", "50", "--min-p", "0.01",
            "--repeat-penalty", "1.1", "--presence-penalty", "0.5", "--frequency-penalty", "0.3", "--seed", "42",
            "-n", "10", "--ignore-eos"]
    out = gen_json(*args)
    sp = SamplingParams(temperature=0.9, top_p=0.8, top_k=50, min_p=0.01, repetition_penalty=1.1,
                        presence_penalty=0.5, frequency_penalty=0.3, seed=42, max_tokens=10, ignore_eos=True)
    assert out["token_ids"] == llm.generate("Once upon", sp, use_tqdm=False)[0].outputs[0].token_ids
    assert gen_json(*args)["token_ids"] == out["token_ids"]  # the seed makes it repeatable
    other = gen_json(*args[:-5], "--seed", "43", "-n", "10", "--ignore-eos")
    assert other["token_ids"] != out["token_ids"]


def test_chat_prompt_and_plain_text_output(llm):
    p = run("generate", "-p", "Hello", "--chat", "--no-thinking", "--temp", "0", "-n", "8")
    ref = llm.chat([{"role": "user", "content": "Hello"}], SamplingParams(temperature=0, max_tokens=8),
                   thinking=False, use_tqdm=False)[0].outputs[0]
    assert p.stdout == (ref.content or "") + "\n"
    assert re.search(r"\d+ prompt tokens, \d+ generated in [\d.]+ s: [\d.]+ tokens/s", p.stderr)


def test_messages_file_with_system_and_effort(llm, tmp_path):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]
    (tmp_path / "m.json").write_text(json.dumps(msgs))
    out = gen_json("--messages", tmp_path / "m.json", "--thinking", "--reasoning-effort", "high", "--temp", "0",
                   "-n", "6")
    ref = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=6), thinking=True, reasoning_effort="high",
                   use_tqdm=False)[0].outputs[0]
    assert out["token_ids"] == ref.token_ids
    assert out["message"].get("reasoning_content") == ref.reasoning_content


def test_structured_output_flags(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    (tmp_path / "g.gbnf").write_text('root ::= "id-" [0-9] [0-9]\n')
    for seed in range(3):
        out = gen_json("-p", "x", "--json-schema", tmp_path / "s.json", "--seed", seed, "-n", "300")
        assert out["finish_reason"] == "stop"
        jsonschema.validate(json.loads(out["text"]), schema)
        out = gen_json("-p", "x", "--regex", "[ab]{2}c", "--seed", seed, "-n", "10")
        assert re.fullmatch("[ab]{2}c", out["text"])
        out = gen_json("-p", "x", "--grammar-file", tmp_path / "g.gbnf", "--seed", seed, "-n", "10")
        assert re.fullmatch("id-[0-9]{2}", out["text"])


@pytest.mark.parametrize("args,code,msg", [
    (["-p", ""], 1, "Prompt cannot be empty"),
    (["-p", "x", "--temp", "-1"], 2, "--temp: expected a number in [0, 100]"),
    (["-p", "x", "--top-p", "1.5"], 2, "--top-p: expected a number"),
    (["-p", "x", "-n", "abc"], 2, "-n: expected an integer"),
    (["-p", "x", "-n", "0"], 2, "-n: expected -1 (up to the model length) or at least 1"),
    (["-p", "x", "--max-tokens", "0"], 2, "--max-tokens: expected -1"),
    (["-p", "x", "--regex", "a", "--json-object"], 2, "only one structured-output constraint"),
    (["-p", "x", "--regex", "(a"], 1, "regex"),
    (["-p", "x", "--load-format", "dummy"], 1, "needs --config FILE"),
    (["-p", "x", "--model", "/nonexistent/model"], 1, "/nonexistent/model"),
    (["--temp", "0"], 2, "exactly one of -p TEXT"),
    (["-p", "x", "--bogus"], 2, "unexpected argument '--bogus'"),
    (["-p", "x", "--memory-limit", "0"], 2, "--memory-limit: expected a positive byte count"),
    (["-p", "x", "--memory-limit", "3T"], 2, "--memory-limit: expected a positive byte count"),
    (["-p", "x", "--memory-limit", "-1G"], 2, "--memory-limit: expected a positive byte count"),
    # the budget reaches the engine: 1 KiB holds no sequence state
    (["-p", "x", "--memory-limit", "1K"], 1, "does not fit the memory budget (1024 bytes)"),
])
def test_errors(args, code, msg):
    p = run("generate", *args, check=False)
    assert p.returncode == code and msg in p.stderr, p.stderr


def test_n_predict_minus_one_runs_to_the_model_length():
    out = gen_json("-p", "hi", "-n", "-1", "--max-model-len", "20", "--temp", "0", "--ignore-eos")
    assert out["prompt_tokens"] + out["completion_tokens"] == 20 and out["finish_reason"] == "length"


def test_logprobs_equal_python_api(llm):
    out = gen_json("-p", "Once upon a time", "--temp", "0", "-n", "6", "--ignore-eos", "--logprobs", "3")
    ref = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3),
                       use_tqdm=False)[0].outputs[0]
    assert [t["id"] for t in out["logprobs"]] == ref.token_ids
    for t, row in zip(out["logprobs"], ref.logprobs):
        assert abs(t["logprob"] - row[t["id"]].logprob) < 1e-6
        assert [i for i, _ in t["top"]] == [k for k, v in sorted(row.items(), key=lambda kv: kv[1].rank or 99)
                                            if v.rank][:3]
        assert t["top"][0][0] == t["id"]  # greedy: the sampled token is the most likely
