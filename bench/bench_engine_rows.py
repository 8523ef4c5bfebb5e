"""The engine's rows by need against every row's logits (DI_ENGINE_ROWS=0),
through the Python API in one process: tokens/s and the step split
(di_engine_get_stats: forward, host) for greedy batches, greedy with
min_tokens, and temperature + top-p, the two settings alternated `--reps`
times; each case also checks that both settings give the same tokens and
cumulative logprobs (docs/engine.md, "Rows by need").

    python3 bench/bench_engine_rows.py MODEL TOKENIZER [--dummy] [--reps 2]
        [--prompt-words N --step-tokens T]   (long prompts, chunked prefill)

MODEL: a checkpoint directory or config.json (--dummy: random weights at
its shapes, e.g. bench/v41_flash_trunc.py's cut model on a GPU with
DEEPINFER_ACCELERATOR=nvidia). Prints "RESULT rows=<1|0> <case> b<B>: ..."
lines, then the on / off ratio of each case's median tokens/s.
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from deepinfer import LLM, SamplingParams, _ffi  # noqa: E402


class Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("steps", "prompt_tokens", "output_tokens", "preemptions",
                                                "memory_used", "memory_peak", "memory_limit")] + \
               [(n, ctypes.c_double) for n in ("forward_s", "host_s", "overlap_s", "wall_s")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("tokenizer")
    ap.add_argument("--dummy", action="store_true", help="random weights at the model's shapes")
    ap.add_argument("--reps", type=int, default=2, help="alternations of the two settings")
    ap.add_argument("--tokens", type=int, default=32, help="tokens a sequence")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--prompt-words", type=int, default=0,
                    help="prompts this many words long (0: a few words); with --step-tokens, chunked prefill")
    ap.add_argument("--step-tokens", type=int, default=None, help="token budget of a step (max_num_batched_tokens)")
    a = ap.parse_args()
    lib = _ffi.lib()
    lib.di_engine_get_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(Stats)]

    def stats(llm):
        s = Stats()
        lib.di_engine_get_stats(llm._e, ctypes.byref(s))
        return s

    batches = [int(b) for b in a.batches.split(",")]
    big = max(batches)
    cases = [("greedy", SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True), batches),
             ("greedy_min_tokens", SamplingParams(temperature=0, max_tokens=a.tokens, min_tokens=4), [big]),
             ("top_p", SamplingParams(temperature=0.8, top_p=0.95, max_tokens=a.tokens, ignore_eos=True, seed=3),
              [big])]
    rates, first, same = {}, {}, True
    kw = {"load_format": "dummy"} if a.dummy else {}
    if a.step_tokens:
        kw["max_num_batched_tokens"] = a.step_tokens
    filler = " ".join(f"word{j}" for j in range(a.prompt_words))
    for _ in range(a.reps):
        for rows in ("1", "0"):
            os.environ["DI_ENGINE_ROWS"] = rows  # read when the engine opens
            with LLM(model=a.model, tokenizer=a.tokenizer, max_num_seqs=big, **kw) as llm:
                llm.generate(["warm up"] * 8, cases[0][1], use_tqdm=False)
                for name, sp, bs in cases:
                    for b in bs:
                        s0, t0 = stats(llm), time.time()
                        outs = llm.generate([f"The quick brown fox {i} {filler}" for i in range(b)], sp, use_tqdm=False)
                        t1, s1 = time.time(), stats(llm)
                        n = sum(len(o.outputs[0].token_ids) for o in outs)
                        st = max(s1.steps - s0.steps, 1)
                        res = [(tuple(o.outputs[0].token_ids), o.outputs[0].cumulative_logprob) for o in outs]
                        key = (name, b)
                        note = ""
                        if key in first:
                            ok = first[key] == res
                            same &= ok
                            note = " same" if ok else " DIFFERENT"
                        else:
                            first[key] = res
                        rates.setdefault((rows,) + key, []).append(n / (t1 - t0))
                        print(f"RESULT rows={rows} {name} b{b}: {n / (t1 - t0):.0f} tokens/s, {st} steps, per step ms:"
                              f" wall {1e3 * (s1.wall_s - s0.wall_s) / st:.2f}"
                              f" forward {1e3 * (s1.forward_s - s0.forward_s) / st:.2f}"
                              f" host {1e3 * (s1.host_s - s0.host_s) / st:.2f}{note}", flush=True)
    os.environ.pop("DI_ENGINE_ROWS", None)
    for name, _, bs in cases:
        for b in bs:
            on = statistics.median(rates[("1", name, b)])
            off = statistics.median(rates[("0", name, b)])
            print(f"RESULT ratio {name} b{b}: rows by need / every row {on / off:.3f} (medians {on:.0f} / {off:.0f})")
    print("RESULT outputs " + ("identical" if same else "DIFFER"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
