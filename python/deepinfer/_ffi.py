"""ctypes view of the "engine" section of include/deepinfer.h.

The structures below mirror the C declarations field for field; the header
is the source of truth. The library is located once, at first use:
$DEEPINFER_LIB, else a copy shipped inside the package, else the build
folder of the source tree this package sits in ($DEEPINFER_BUILD or build/).
"""
import ctypes
import ctypes.util
import os
import pathlib

c_int32_p = ctypes.POINTER(ctypes.c_int32)
c_float_p = ctypes.POINTER(ctypes.c_float)
c_char_pp = ctypes.POINTER(ctypes.c_char_p)

# di_status codes (include/deepinfer.h, "status")
DI_OK = 0
DI_ERR_INVALID_ARG = 1
DI_ERR_IO = 2
DI_ERR_FORMAT = 3
DI_ERR_UNSUPPORTED = 4
DI_ERR_NOMEM = 5
DI_ERR_LIMIT = 6
DI_ERR_NOT_FOUND = 7
DI_ERR_STATE = 8

DI_LOAD_AUTO = 0
DI_LOAD_DUMMY = 1

FINISH_NAMES = {0: None, 1: "stop", 2: "length", 3: "constraint", 4: "error", 5: "abort"}


class EngineOptions(ctypes.Structure):
    _fields_ = [
        ("model", ctypes.c_char_p),
        ("load_format", ctypes.c_int),
        ("dummy_seed", ctypes.c_uint64),
        ("tokenizer", ctypes.c_char_p),
        ("accelerator", ctypes.c_int),
        ("n_threads", ctypes.c_int),
        ("max_batch", ctypes.c_int),
        ("max_tokens_per_step", ctypes.c_int64),
        ("max_prefill_chunk", ctypes.c_int64),
        ("memory_limit", ctypes.c_uint64),
        ("max_model_len", ctypes.c_int64),
        ("batch_invariant", ctypes.c_int),
        ("async_scheduling", ctypes.c_int),
        ("bf16_numerics", ctypes.c_int),
        ("seed", ctypes.c_uint64),
    ]


class EngineInfo(ctypes.Structure):
    _fields_ = [
        ("vocab_size", ctypes.c_int64),
        ("max_model_len", ctypes.c_int64),
        ("bos_id", ctypes.c_int32),
        ("eos_id", ctypes.c_int32),
        ("has_tokenizer", ctypes.c_int),
        ("batch_invariant", ctypes.c_int),
        ("async_scheduling", ctypes.c_int),
        ("n_threads", ctypes.c_int),
        ("accelerator", ctypes.c_char_p),
        ("model_path", ctypes.c_char_p),
        ("max_batch", ctypes.c_int),
        ("max_tokens_per_step", ctypes.c_int64),
        ("memory_limit", ctypes.c_uint64),
        ("weights_in_memory", ctypes.c_uint64),
    ]


class ChatOptions(ctypes.Structure):
    _fields_ = [
        ("thinking", ctypes.c_int),
        ("reasoning_effort", ctypes.c_char_p),
        ("add_generation_prompt", ctypes.c_int),
    ]


class CSamplingParams(ctypes.Structure):
    _fields_ = [
        ("n", ctypes.c_int32),
        ("temperature", ctypes.c_double),
        ("top_p", ctypes.c_double),
        ("top_k", ctypes.c_int32),
        ("min_p", ctypes.c_double),
        ("presence_penalty", ctypes.c_double),
        ("frequency_penalty", ctypes.c_double),
        ("repetition_penalty", ctypes.c_double),
        ("has_seq_seed", ctypes.c_int),
        ("seq_seed", ctypes.c_uint64),
        ("stop", c_char_pp),
        ("n_stop", ctypes.c_size_t),
        ("stop_token_ids", c_int32_p),
        ("n_stop_token_ids", ctypes.c_size_t),
        ("include_stop_str_in_output", ctypes.c_int),
        ("ignore_eos", ctypes.c_int),
        ("max_tokens", ctypes.c_int64),
        ("min_tokens", ctypes.c_int64),
        ("logprobs", ctypes.c_int32),
        ("prompt_logprobs", ctypes.c_int32),
        ("logit_bias_ids", c_int32_p),
        ("logit_bias_values", c_float_p),
        ("n_logit_bias", ctypes.c_size_t),
        ("skip_special_tokens", ctypes.c_int),
        ("json_schema", ctypes.c_char_p),
        ("regex", ctypes.c_char_p),
        ("ebnf", ctypes.c_char_p),
        ("choice", c_char_pp),
        ("n_choice", ctypes.c_size_t),
        ("json_object", ctypes.c_int),
        ("disable_any_whitespace", ctypes.c_int),
        ("disable_additional_properties", ctypes.c_int),
        ("thinking_token_budget", ctypes.c_int64),
    ]


class EngineProgress(ctypes.Structure):
    _fields_ = [
        ("requests_done", ctypes.c_uint64),
        ("requests_total", ctypes.c_uint64),
        ("prompt_tokens", ctypes.c_uint64),
        ("output_tokens", ctypes.c_uint64),
        ("elapsed_s", ctypes.c_double),
        ("prompt_tps", ctypes.c_double),
        ("output_tps", ctypes.c_double),
    ]


PROGRESS_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(EngineProgress))


class Completion(ctypes.Structure):
    _fields_ = [
        ("index", ctypes.c_int32),
        ("token_ids", c_int32_p),
        ("n_tokens", ctypes.c_size_t),
        ("text", ctypes.c_void_p),  # bytes, read with text_len (may hold partial UTF-8)
        ("text_len", ctypes.c_size_t),
        ("finish_reason", ctypes.c_int),
        ("stop_str", ctypes.c_char_p),
        ("stop_token", ctypes.c_int32),
        ("error", ctypes.c_char_p),
        ("cumulative_logprob", ctypes.c_double),
        ("logprobs", c_float_p),
        ("n_top", ctypes.c_int32),
        ("top_ids", c_int32_p),
        ("top_logprobs", c_float_p),
        ("reasoning_content", ctypes.c_char_p),
        ("content", ctypes.c_char_p),
        ("tool_calls_json", ctypes.c_char_p),
        ("message_json", ctypes.c_char_p),
    ]


class RequestOutputC(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("finished", ctypes.c_int),
        ("prompt_ids", c_int32_p),
        ("n_prompt", ctypes.c_size_t),
        ("prompt_logprobs", c_float_p),
        ("n_prompt_top", ctypes.c_int32),
        ("prompt_top_ids", c_int32_p),
        ("prompt_top_logprobs", c_float_p),
        ("n_completions", ctypes.c_size_t),
        ("error", ctypes.c_char_p),
    ]


def _candidates():
    env = os.environ.get("DEEPINFER_LIB")
    if env:
        yield pathlib.Path(env)
        return
    here = pathlib.Path(__file__).resolve().parent
    yield here / "libdeepinfer.so"
    root = here.parent.parent  # <repo>/python/deepinfer -> <repo>
    build = os.environ.get("DEEPINFER_BUILD")
    if build:
        p = pathlib.Path(build)
        yield (p if p.is_absolute() else root / p) / "libdeepinfer.so"
    yield root / "build" / "libdeepinfer.so"
    found = ctypes.util.find_library("deepinfer")  # installed system-wide
    if found:
        yield pathlib.Path(found)


_lib = None


def lib():
    """The loaded library, with argument and result types declared."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.is_file() or (not path.is_absolute() and path.name.startswith("libdeepinfer")):
            try:
                handle = ctypes.CDLL(str(path))
            except OSError:
                # A library built with the CUDA backend by an older Makefile
                # may not name libstdc++ itself: provide it globally, retry.
                ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
                handle = ctypes.CDLL(str(path))
            _lib = _declare(handle)
            return _lib
    raise OSError("libdeepinfer.so not found (looked at: %s); build it with `make`, or set DEEPINFER_LIB "
                  "to its path" % ", ".join(tried))


def _declare(L):
    P = ctypes.POINTER
    st = ctypes.c_int
    sigs = {
        "di_last_error": (ctypes.c_char_p, []),
        "di_last_status": (st, []),
        "di_version": (ctypes.c_char_p, []),
        "di_free": (None, [ctypes.c_void_p]),
        "di_engine_options_default": (None, [P(EngineOptions)]),
        "di_engine_open": (st, [P(EngineOptions), P(ctypes.c_void_p)]),
        "di_engine_close": (None, [ctypes.c_void_p]),
        "di_engine_get_info": (st, [ctypes.c_void_p, P(EngineInfo)]),
        "di_engine_tokenizer": (ctypes.c_void_p, [ctypes.c_void_p]),
        "di_engine_env_describe": (st, [P(ctypes.c_void_p)]),
        "di_sampling_params_default": (None, [P(CSamplingParams)]),
        "di_chat_options_default": (None, [P(ChatOptions)]),
        "di_engine_submit_tokens": (st, [ctypes.c_void_p, c_int32_p, ctypes.c_size_t, P(CSamplingParams),
                                         P(ctypes.c_uint64)]),
        "di_engine_submit_text": (st, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, P(CSamplingParams),
                                       P(ctypes.c_uint64)]),
        "di_engine_submit_chat": (st, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, P(ChatOptions),
                                       P(CSamplingParams), P(ctypes.c_uint64)]),
        "di_engine_abort": (st, [ctypes.c_void_p, ctypes.c_uint64]),
        "di_engine_step": (st, [ctypes.c_void_p, P(ctypes.c_size_t)]),
        "di_engine_run": (st, [ctypes.c_void_p, PROGRESS_FN, ctypes.c_void_p]),
        "di_engine_get_output": (st, [ctypes.c_void_p, ctypes.c_uint64, P(RequestOutputC)]),
        "di_engine_get_completion": (st, [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, P(Completion)]),
        "di_engine_release": (st, [ctypes.c_void_p, ctypes.c_uint64]),
        "di_tokenizer_encode": (st, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint,
                                     P(c_int32_p), P(ctypes.c_size_t)]),
        "di_tokenizer_decode": (st, [ctypes.c_void_p, c_int32_p, ctypes.c_size_t, P(ctypes.c_void_p),
                                     P(ctypes.c_size_t)]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(L, name)
        f.restype = res
        f.argtypes = args
    return L


def last_error():
    msg = lib().di_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def cstr(p):
    return p.decode("utf-8", "replace") if p else None
