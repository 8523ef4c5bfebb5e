#!/usr/bin/env python3
"""Offline inference with deepinfer's Python API.

    python examples/offline_inference.py                 # a few prompts on the configured model
    python examples/offline_inference.py --check_structured_output
    python examples/offline_inference.py --ep 8          # parallel layouts: validated, not run yet

The model is $DEEPINFER_HF_MODEL_DIR when set, else the embedded default
tiny model (dummy weights, generated into the cache folder on first use), or
--model DIR.

--check_structured_output runs a perplexity check (the logprobs the engine
reports while generating equal the ones it computes when the same tokens
are read back as a prompt, and the model's own greedy text is less
perplexing to it than random tokens) and regex / JSON Schema / EBNF
generations, validates every output (re.fullmatch, jsonschema, and for the
EBNF grammar a regex of the same language), and exits with status 1 on any
failure.
"""
import argparse
import json
import math
import os
import pathlib
import random
import re
import sys
import time

try:
    import deepinfer  # noqa: F401
except ImportError:  # running from a source checkout without installing
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

from deepinfer import LLM, SamplingParams

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "Explain what a mixture-of-experts layer does, in one sentence.",
    "List three prime numbers:",
]


def positive_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a positive integer, got %r" % s)
    if v < 1:
        raise argparse.ArgumentTypeError("expected a positive integer, got %d" % v)
    return v


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint folder (default: $DEEPINFER_HF_MODEL_DIR, else the "
                                                  "embedded default model)")
    ap.add_argument("--ep", type=positive_int, default=1, help="expert-parallel size")
    ap.add_argument("--dp", type=positive_int, default=1, help="attention data-parallel size")
    ap.add_argument("--cp", type=positive_int, default=1, help="context-parallel size")
    ap.add_argument("--max_tokens", "--max-tokens", type=positive_int, default=32)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--check_structured_output", "--check-structured-output", action="store_true",
                    help="perplexity check + regex / JSON Schema / EBNF generations, all validated")
    args = ap.parse_args(argv)
    if args.dp > 1 and args.cp > 1:
        ap.error("--dp and --cp are alternatives (attention data parallel or context parallel): set one")
    try:  # the sampling flags checked as the library checks them, before any model is opened
        sampling_params(args)
    except ValueError as e:
        ap.error(str(e))
    return args


def sampling_params(args):
    return SamplingParams(temperature=args.temperature, top_p=0.95, max_tokens=args.max_tokens, seed=args.seed)


def run_prompts(llm, args):
    sp = sampling_params(args)
    t0 = time.perf_counter()
    outs = llm.generate(PROMPTS, sp)
    dt = time.perf_counter() - t0
    n_in = sum(len(o.prompt_token_ids) for o in outs)
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    for o in outs:
        c = o.outputs[0]
        print("Prompt: %r\nGenerated (%d tokens, %s): %r\n" % (o.prompt, len(c.token_ids), c.finish_reason, c.text))
    print("%d prompts: %d prompt tokens, %d generated tokens in %.2f s: %.1f tokens/s generated, %.1f tokens/s in all"
          % (len(outs), n_in, n_out, dt, n_out / dt, (n_in + n_out) / dt))


class Checks:
    def __init__(self):
        self.failed = 0
        self.passed = 0

    def check(self, ok, what, detail=""):
        if ok:
            self.passed += 1
            print("  ok    %s" % what)
        else:
            self.failed += 1
            print("  FAIL  %s%s" % (what, (": " + detail) if detail else ""))


def ppl_check(llm, chk):
    print("perplexity check")
    prompt = "In the beginning"
    gen = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, logprobs=0),
                       use_tqdm=False)[0]
    c = gen.outputs[0]
    ids = gen.prompt_token_ids + c.token_ids
    back = llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=0, prompt_logprobs=0),
                        use_tqdm=False)[0]
    n_p = len(gen.prompt_token_ids)
    decode_lp = [row[t].logprob for t, row in zip(c.token_ids, c.logprobs)]
    prefill_lp = [back.prompt_logprobs[n_p + i][t].logprob for i, t in enumerate(c.token_ids)]
    worst = max(abs(a - b) for a, b in zip(decode_lp, prefill_lp))
    chk.check(worst < 1e-3, "generation logprobs equal prompt logprobs of the same tokens", "max |diff| %.3g" % worst)
    ppl_greedy = math.exp(-sum(prefill_lp) / len(prefill_lp))
    rng = random.Random(0)
    vocab = llm.vocab_size
    rand = [rng.randrange(vocab) for _ in range(len(ids))]
    back = llm.generate({"prompt_token_ids": rand}, SamplingParams(max_tokens=0, prompt_logprobs=0),
                        use_tqdm=False)[0]
    lps = [back.prompt_logprobs[i][t].logprob for i, t in enumerate(rand) if i > 0]
    ppl_rand = math.exp(-sum(lps) / len(lps))
    print("  perplexity: greedy continuation %.2f, random tokens %.2f (vocabulary %d)" % (ppl_greedy, ppl_rand, vocab))
    chk.check(math.isfinite(ppl_greedy) and ppl_greedy < ppl_rand, "greedy text less perplexing than random tokens")


SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 130},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
          "required": ["name", "age"], "additionalProperties": False,
          # members may come in any order (the grammar does not track names
          # beyond the required ones): a cap keeps a rambling model bounded
          "maxProperties": 3}
REGEX = r"(\+1 )?[0-9]{3}-[0-9]{3}-[0-9]{4}"
EBNF = 'root ::= answer " because " reason\nanswer ::= "yes" | "no"\nreason ::= [a-z]{1,10} ("," [a-z]{1,10})?\n'
EBNF_AS_REGEX = r"(yes|no) because [a-z]{1,10}(,[a-z]{1,10})?"


def structured_checks(llm, chk, seed):
    try:
        import jsonschema
    except ImportError:
        chk.check(False, "jsonschema is installed (needed to validate JSON Schema outputs)")
        return
    print("structured output")
    cases = []
    for k in range(4):
        cases.append(("json_schema", SamplingParams(temperature=0.8, seed=seed + k, max_tokens=160, json_schema=SCHEMA,
                                                    disable_any_whitespace=True)))
        cases.append(("regex", SamplingParams(temperature=0.8, seed=seed + k, max_tokens=32, regex=REGEX)))
        cases.append(("ebnf", SamplingParams(temperature=0.8, seed=seed + k, max_tokens=40, ebnf=EBNF)))
    outs = llm.generate(["Give me an example:"] * len(cases), [sp for _, sp in cases], use_tqdm=False)
    for (kind, _), o in zip(cases, outs):
        c = o.outputs[0]
        text = c.text
        if c.finish_reason != "stop":
            chk.check(False, "%s output complete" % kind, "finish_reason %s: %r" % (c.finish_reason, text))
            continue
        if kind == "json_schema":
            try:
                jsonschema.validate(json.loads(text), SCHEMA)
                chk.check(True, "json_schema %s" % text)
            except Exception as e:  # noqa: BLE001 — report any validation failure
                chk.check(False, "json_schema %r" % text, str(e).split("\n")[0])
        elif kind == "regex":
            chk.check(re.fullmatch(REGEX, text) is not None, "regex %r" % text)
        else:
            chk.check(re.fullmatch(EBNF_AS_REGEX, text) is not None, "ebnf %r" % text)
    # thinking mode: the constraint applies after </think>; the budget forces it
    msgs = [{"role": "user", "content": "Reply with a JSON object."}]
    out = llm.chat(msgs, SamplingParams(temperature=0.8, seed=seed, max_tokens=200, json_schema=SCHEMA,
                                        disable_any_whitespace=True, thinking_token_budget=16),
                   thinking=True, use_tqdm=False)[0].outputs[0]
    try:
        jsonschema.validate(json.loads(out.content), SCHEMA)
        chk.check(out.finish_reason == "stop", "thinking + json_schema: %s" % out.content)
    except Exception as e:  # noqa: BLE001
        chk.check(False, "thinking + json_schema %r" % (out.content,), str(e).split("\n")[0])


def main(argv=None):
    args = parse_args(argv)
    if args.ep > 1 or args.dp > 1 or args.cp > 1:
        print("offline_inference: --ep %d --dp %d --cp %d asks for %d devices: expert, data and context "
              "parallelism are not available in this build yet (it runs the model on one device); run without "
              "them" % (args.ep, args.dp, args.cp, args.ep * args.dp * args.cp), file=sys.stderr)
        return 2
    llm = LLM(model=args.model, seed=args.seed)
    src = "--model" if args.model else ("DEEPINFER_HF_MODEL_DIR" if os.environ.get("DEEPINFER_HF_MODEL_DIR")
                                        else "the embedded default model")
    print("model: %s (%s); vocabulary %d, max length %d, %d threads\n" % (llm.model_path, src, llm.vocab_size,
                                                                           llm.max_model_len, llm.num_threads))
    if not args.check_structured_output:
        run_prompts(llm, args)
        return 0
    chk = Checks()
    ppl_check(llm, chk)
    structured_checks(llm, chk, args.seed)
    print("\n%d checks passed, %d failed" % (chk.passed, chk.failed))
    return 1 if chk.failed else 0


if __name__ == "__main__":
    sys.exit(main())
