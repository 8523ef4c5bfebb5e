#!/usr/bin/env python3
"""Structured-output benchmark: deepinfer's constraint engine side by side
with llguidance (PyPI) in one run, on MaskBench schemas with the real V4
tokenizer (129,280 logits).

For every sampled MaskBench file, the first valid instance is encoded with
the V4 tokenizer; both engines compile the schema (time to first mask
includes compile), then for each token fill the full-vocabulary mask
(the token must be allowed) and advance. Both are called from Python in
the same process, so the call overhead (about a microsecond) is the same
on both sides. Prints compile and per-token mask percentiles and ratios.

  DEEPINFER_BUILD=build python3 bench/bench_grammar.py [--every N] [--shared DIR]
"""
import argparse
import ctypes
import glob
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import grammar_ffi as F  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--every", type=int, default=10, help="use every N-th MaskBench file")
    ap.add_argument("--shared", default=None)
    args = ap.parse_args()
    sd = args.shared or F.shared_dir()
    files = sorted(glob.glob(os.path.join(str(sd), "corpora", "maskbench", "*.json")))[:: args.every]
    import llguidance
    import numpy as np

    V = F.v4_vocab()
    L = F.lib()
    llt = llguidance.LLTokenizer(str(F.tokenizer_json_path()), n_vocab=F.N_LOGITS, eos_token=V.eos)
    llmask = np.zeros((1, (F.N_LOGITS + 31) // 32), dtype=np.int32)
    ours = {"compile": [], "mask": [], "ok": 0, "fail": 0}
    peer = {"compile": [], "mask": [], "ok": 0, "fail": 0}
    both = 0
    for path in files:
        d = json.load(open(path))
        inst = next((t["data"] for t in d["tests"] if t["valid"]), None)
        if inst is None:
            continue
        toks = F.encode(json.dumps(inst, ensure_ascii=False))
        schema = json.dumps(d["schema"])
        t0 = time.perf_counter()
        try:
            g = F.Grammar(V, F.DI_CONSTRAINT_JSON_SCHEMA, schema)
            m = g.matcher()
        except F.CompileError:
            g = None
        t1 = time.perf_counter()
        try:
            lm = llguidance.LLMatcher(llt, llguidance.LLMatcher.grammar_from_json_schema(schema))
            if lm.is_error():
                lm = None
        except Exception:  # noqa: BLE001 - any refusal counts as a compile error
            lm = None
        t2 = time.perf_counter()
        if g is not None:
            ours["ok"] += 1
            ours["compile"].append(t1 - t0)
        else:
            ours["fail"] += 1
        if lm is not None:
            peer["ok"] += 1
            peer["compile"].append(t2 - t1)
        else:
            peer["fail"] += 1
        if g is None or lm is None:
            continue
        both += 1
        ptr = llmask.ctypes.data
        nb = llmask.size * 4
        for tok in toks:
            a = time.perf_counter()
            L.di_matcher_fill_mask(m.h, m.mask, m.words)
            b = time.perf_counter()
            lm.unsafe_compute_mask_ptr(ptr, nb)
            c = time.perf_counter()
            ours["mask"].append(b - a)
            peer["mask"].append(c - b)
            if not (m.mask[tok >> 5] >> (tok & 31)) & 1 or not m.advance(tok):
                print(f"deepinfer rejected a valid token in {os.path.basename(path)}", file=sys.stderr)
                break
            if not lm.consume_token(tok):
                break
    us = 1e6
    print(f"MaskBench sample: {len(files)} files, compiled by deepinfer {ours['ok']}, by llguidance {peer['ok']}, "
          f"masks timed on the {both} both compile ({len(ours['mask'])} tokens)")
    print(f"{'':12s} {'mask p50':>9s} {'p90':>9s} {'p99':>9s} {'mean':>9s} {'compile p50':>12s} {'p99':>9s}  (us)")
    for name, r in (("deepinfer", ours), ("llguidance", peer)):
        print(f"{name:12s} {pct(r['mask'], .5) * us:9.1f} {pct(r['mask'], .9) * us:9.1f} {pct(r['mask'], .99) * us:9.1f} "
              f"{us * sum(r['mask']) / max(1, len(r['mask'])):9.1f} {pct(r['compile'], .5) * us:12.1f} {pct(r['compile'], .99) * us:9.1f}")
    for label, p in (("p50", .5), ("p90", .9), ("p99", .99)):
        print(f"ratio llguidance/deepinfer mask {label}: {pct(peer['mask'], p) / pct(ours['mask'], p):.2f}")
    print(f"ratio llguidance/deepinfer compile p50: {pct(peer['compile'], .5) / pct(ours['compile'], .5):.2f}")


if __name__ == "__main__":
    main()
