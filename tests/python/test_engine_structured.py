"""Structured output through the whole engine (include/deepinfer.h, "engine"),
validated by the Python oracles: every JSON Schema generation parses and passes
`jsonschema`, every regex generation fully matches under Python's `re`.
The golden tiny model generates; its weights are random, so the constraint
alone makes the output valid."""
import ctypes
import json
import os
import pathlib

from cli_lib import find_shared_dir
import re

import jsonschema
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def shared_dir():
    return find_shared_dir()


class EngineOptions(ctypes.Structure):
    _fields_ = [
        ("model", ctypes.c_char_p), ("load_format", ctypes.c_int), ("dummy_seed", ctypes.c_uint64),
        ("tokenizer", ctypes.c_char_p), ("accelerator", ctypes.c_int), ("n_threads", ctypes.c_int),
        ("max_batch", ctypes.c_int), ("max_tokens_per_step", ctypes.c_int64),
        ("max_prefill_chunk", ctypes.c_int64), ("memory_limit", ctypes.c_uint64),
        ("max_model_len", ctypes.c_int64), ("batch_invariant", ctypes.c_int),
        ("async_scheduling", ctypes.c_int), ("bf16_numerics", ctypes.c_int), ("seed", ctypes.c_uint64),
    ]


class SamplingParams(ctypes.Structure):
    _fields_ = [
        ("n", ctypes.c_int32), ("temperature", ctypes.c_double), ("top_p", ctypes.c_double),
        ("top_k", ctypes.c_int32), ("min_p", ctypes.c_double), ("presence_penalty", ctypes.c_double),
        ("frequency_penalty", ctypes.c_double), ("repetition_penalty", ctypes.c_double),
        ("has_seq_seed", ctypes.c_int), ("seq_seed", ctypes.c_uint64),
        ("stop", ctypes.POINTER(ctypes.c_char_p)), ("n_stop", ctypes.c_size_t),
        ("stop_token_ids", ctypes.POINTER(ctypes.c_int32)), ("n_stop_token_ids", ctypes.c_size_t),
        ("include_stop_str_in_output", ctypes.c_int), ("ignore_eos", ctypes.c_int),
        ("max_tokens", ctypes.c_int64), ("min_tokens", ctypes.c_int64), ("logprobs", ctypes.c_int32),
        ("prompt_logprobs", ctypes.c_int32), ("logit_bias_ids", ctypes.POINTER(ctypes.c_int32)),
        ("logit_bias_values", ctypes.POINTER(ctypes.c_float)), ("n_logit_bias", ctypes.c_size_t),
        ("skip_special_tokens", ctypes.c_int), ("json_schema", ctypes.c_char_p), ("regex", ctypes.c_char_p),
        ("ebnf", ctypes.c_char_p), ("choice", ctypes.POINTER(ctypes.c_char_p)), ("n_choice", ctypes.c_size_t),
        ("json_object", ctypes.c_int), ("disable_any_whitespace", ctypes.c_int),
        ("disable_additional_properties", ctypes.c_int), ("thinking_token_budget", ctypes.c_int64),
    ]


class Completion(ctypes.Structure):
    _fields_ = [
        ("index", ctypes.c_int32), ("token_ids", ctypes.POINTER(ctypes.c_int32)), ("n_tokens", ctypes.c_size_t),
        ("text", ctypes.c_char_p), ("text_len", ctypes.c_size_t), ("finish_reason", ctypes.c_int),
        ("stop_str", ctypes.c_char_p), ("stop_token", ctypes.c_int32), ("error", ctypes.c_char_p),
        ("cumulative_logprob", ctypes.c_double), ("logprobs", ctypes.POINTER(ctypes.c_float)),
        ("n_top", ctypes.c_int32), ("top_ids", ctypes.POINTER(ctypes.c_int32)),
        ("top_logprobs", ctypes.POINTER(ctypes.c_float)), ("reasoning_content", ctypes.c_char_p),
        ("content", ctypes.c_char_p), ("tool_calls_json", ctypes.c_char_p), ("message_json", ctypes.c_char_p),
    ]


@pytest.fixture(scope="module")
def engine():
    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared (golden fixtures) not found; set DEEPINFER_SHARED_DIR")
    lib = ctypes.CDLL(str(ROOT / os.environ.get("DEEPINFER_BUILD", "build") / "libdeepinfer.so"))
    lib.di_last_error.restype = ctypes.c_char_p
    opts = EngineOptions()
    lib.di_engine_options_default(ctypes.byref(opts))
    model = str(shared / "golden" / "v41-tiny").encode()
    opts.model = model
    eng = ctypes.c_void_p()
    assert lib.di_engine_open(ctypes.byref(opts), ctypes.byref(eng)) == 0, lib.di_last_error()
    yield lib, eng
    lib.di_engine_close(eng)


PROMPT = "<｜begin▁of▁sentence｜><｜User｜>Answer in JSON.<｜Assistant｜></think>".encode()

SCHEMAS = [
    {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                                               "maxItems": 3}},
     "required": ["id", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"enum": ["cat", "dog", "owl"]},
                                      "pos": {"type": "object",
                                              "properties": {"x": {"type": "boolean"}, "y": {"type": "null"}},
                                              "required": ["x", "y"], "additionalProperties": False}},
     "required": ["kind", "pos"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
]

REGEXES = [r"[A-Z][a-z]{1,6} [0-9]{2}", r"(yes|no|maybe)!?", r"\d{4}-\d{2}-\d{2}"]


def generate(lib, eng, seeds, **constraint):
    ids = []
    for seed in seeds:
        p = SamplingParams()
        lib.di_sampling_params_default(ctypes.byref(p))
        p.temperature = 1.0
        p.max_tokens = 160
        p.has_seq_seed = 1
        p.seq_seed = seed
        p.disable_any_whitespace = 1
        for k, v in constraint.items():
            setattr(p, k, v.encode() if isinstance(v, str) else v)
        rid = ctypes.c_uint64()
        assert lib.di_engine_submit_text(eng, PROMPT, len(PROMPT), ctypes.byref(p), ctypes.byref(rid)) == 0, \
            lib.di_last_error()
        ids.append(rid.value)
    assert lib.di_engine_run(eng, None, None) == 0, lib.di_last_error()
    out = []
    for rid in ids:
        c = Completion()
        assert lib.di_engine_get_completion(eng, ctypes.c_uint64(rid), ctypes.c_size_t(0), ctypes.byref(c)) == 0
        out.append((c.finish_reason, ctypes.string_at(c.text, c.text_len).decode("utf-8")))
    return out


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys {keys}"
    return dict(pairs)


@pytest.mark.parametrize("schema", SCHEMAS)
def test_json_schema_outputs_validate(engine, schema):
    lib, eng = engine
    for finish, text in generate(lib, eng, [1, 2, 3], json_schema=json.dumps(schema)):
        assert finish == 1, f"finish {finish}: {text!r}"
        value = json.loads(text, object_pairs_hook=no_duplicates)
        jsonschema.validate(value, schema)


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_outputs_fully_match(engine, pattern):
    lib, eng = engine
    for finish, text in generate(lib, eng, [4, 5, 6], regex=pattern):
        assert finish == 1, f"finish {finish}: {text!r}"
        assert re.fullmatch(pattern, text), text
