"""SamplingParams: vLLM's field names and defaults (ecosystem.md §4.1), plus
DeepInfer's `seq_seed` and the structured-output fields `json_schema`,
`regex`, `ebnf`, `choice` and `json_object` (SGLang's names; at most one).
SGLang's `max_new_tokens` / `min_new_tokens` are accepted as aliases.

Values are checked when the object is built, as vLLM does, so a bad value
raises ValueError at the line that wrote it; the engine checks again at
submit."""
import ctypes
import json
import math

from . import _ffi

_CONSTRAINTS = ("json_schema", "regex", "ebnf", "choice", "json_object")


class SamplingParams:
    def __init__(self, n=1, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, presence_penalty=0.0,
                 frequency_penalty=0.0, repetition_penalty=1.0, seed=None, seq_seed=None, stop=None,
                 stop_token_ids=None, include_stop_str_in_output=False, ignore_eos=False, max_tokens=16,
                 min_tokens=0, logprobs=None, prompt_logprobs=None, logit_bias=None, skip_special_tokens=True,
                 json_schema=None, regex=None, ebnf=None, choice=None, json_object=False,
                 disable_any_whitespace=False, disable_additional_properties=False,
                 thinking_token_budget=None, max_new_tokens=None, min_new_tokens=None, grammar=None):
        if max_new_tokens is not None:
            if max_tokens not in (16, None) and max_tokens != max_new_tokens:
                raise ValueError("max_tokens (%r) and its alias max_new_tokens (%r) disagree" %
                                 (max_tokens, max_new_tokens))
            max_tokens = max_new_tokens
        if min_new_tokens is not None:
            min_tokens = min_new_tokens
        if grammar is not None:  # vLLM's StructuredOutputsParams spelling of an EBNF grammar
            if ebnf is not None:
                raise ValueError("grammar is an alias of ebnf: set only one")
            ebnf = grammar
        if seed is not None and seq_seed is not None and seed != seq_seed:
            raise ValueError("seed (%r) and seq_seed (%r) disagree: seq_seed is DeepInfer's name for the "
                             "per-request seed" % (seed, seq_seed))
        self.n = n
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.presence_penalty = presence_penalty
        self.frequency_penalty = frequency_penalty
        self.repetition_penalty = repetition_penalty
        self.seq_seed = seq_seed if seq_seed is not None else seed
        self.stop = [stop] if isinstance(stop, str) else list(stop or [])
        self.stop_token_ids = list(stop_token_ids or [])
        self.include_stop_str_in_output = bool(include_stop_str_in_output)
        self.ignore_eos = bool(ignore_eos)
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.logprobs = logprobs
        self.prompt_logprobs = prompt_logprobs
        self.logit_bias = dict(logit_bias or {})
        self.skip_special_tokens = bool(skip_special_tokens)
        self.json_schema = json_schema
        self.regex = regex
        self.ebnf = ebnf
        self.choice = list(choice) if choice is not None else None
        self.json_object = bool(json_object)
        self.disable_any_whitespace = bool(disable_any_whitespace)
        self.disable_additional_properties = bool(disable_additional_properties)
        self.thinking_token_budget = thinking_token_budget
        self._verify()

    @property
    def seed(self):
        return self.seq_seed

    @property
    def max_new_tokens(self):
        return self.max_tokens

    def _verify(self):
        def num(name, v):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                raise ValueError("%s must be a number, got %r" % (name, v))
            return v

        def integer(name, v):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError("%s must be an integer, got %r" % (name, v))
            return v

        if not 1 <= integer("n", self.n) <= 64:
            raise ValueError("n must be in 1..64, got %d" % self.n)
        if not 0 <= num("temperature", self.temperature) <= 100:
            raise ValueError("temperature must be in [0, 100] (0 = greedy), got %r" % self.temperature)
        if not 0 < num("top_p", self.top_p) <= 1:
            raise ValueError("top_p must be in (0, 1], got %r" % self.top_p)
        if integer("top_k", self.top_k) < -1:
            raise ValueError("top_k must be -1, 0 (disable) or at least 1, got %d" % self.top_k)
        if not 0 <= num("min_p", self.min_p) <= 1:
            raise ValueError("min_p must be in [0, 1], got %r" % self.min_p)
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= num(name, getattr(self, name)) <= 2:
                raise ValueError("%s must be in [-2, 2], got %r" % (name, getattr(self, name)))
        if not 0 < num("repetition_penalty", self.repetition_penalty) <= 2:
            raise ValueError("repetition_penalty must be in (0, 2], got %r" % self.repetition_penalty)
        if self.seq_seed is not None and not 0 <= integer("seed", self.seq_seed) < 2 ** 64:
            raise ValueError("seed must be in 0..2^64-1, got %d" % self.seq_seed)
        if self.max_tokens is not None:
            lo = 0 if self.prompt_logprobs is not None else 1
            if integer("max_tokens", self.max_tokens) < lo:
                raise ValueError("max_tokens must be at least %d, got %d" % (lo, self.max_tokens))
        if integer("min_tokens", self.min_tokens) < 0:
            raise ValueError("min_tokens must be >= 0, got %d" % self.min_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens (%d) must be at most max_tokens (%d)" % (self.min_tokens, self.max_tokens))
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and not 0 <= integer(name, v) <= 20:
                raise ValueError("%s must be in 0..20 (top-k alternatives), got %d" % (name, v))
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError("stop strings must be non-empty strings, got %r" % (s,))
        for t in self.stop_token_ids:
            if integer("stop_token_ids", t) < 0:
                raise ValueError("stop_token_ids must be >= 0, got %d" % t)
        for t, b in self.logit_bias.items():
            integer("logit_bias key", t)
            if not -100 <= num("logit_bias value", b) <= 100:
                raise ValueError("logit_bias values must be in [-100, 100], got %r for token %d" % (b, t))
        if self.thinking_token_budget is not None and integer("thinking_token_budget", self.thinking_token_budget) < 0:
            raise ValueError("thinking_token_budget must be >= 0, got %d" % self.thinking_token_budget)
        set_ = [c for c in _CONSTRAINTS if getattr(self, c) not in (None, False)]
        if len(set_) > 1:
            raise ValueError("only one structured-output constraint may be set, got %s" % " and ".join(set_))
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) for c in self.choice)):
            raise ValueError("choice must be a non-empty list of strings")
        for name in ("regex", "ebnf"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise ValueError("%s must be a string, got %s" % (name, type(v).__name__))
        if self.json_schema is not None and not isinstance(self.json_schema, (str, dict, bool)):
            raise ValueError("json_schema must be a dict or a JSON string, got %s" % type(self.json_schema).__name__)

    def constraint(self):
        """(kind, value) of the structured-output constraint, or None."""
        for c in _CONSTRAINTS:
            v = getattr(self, c)
            if v not in (None, False):
                return c, v
        return None

    def __repr__(self):
        fields = ", ".join("%s=%r" % (k, v) for k, v in self.__dict__.items() if not k.startswith("_"))
        return "SamplingParams(%s)" % fields

    def to_c(self, max_model_len=None, n_prompt=0):
        """The C structure plus the Python objects whose memory it points into
        (keep both alive until the submit returns)."""
        L = _ffi.lib()
        p = _ffi.CSamplingParams()
        L.di_sampling_params_default(ctypes.byref(p))
        keep = []
        p.n = self.n
        p.temperature = float(self.temperature)
        p.top_p = float(self.top_p)
        p.top_k = self.top_k
        p.min_p = float(self.min_p)
        p.presence_penalty = float(self.presence_penalty)
        p.frequency_penalty = float(self.frequency_penalty)
        p.repetition_penalty = float(self.repetition_penalty)
        if self.seq_seed is not None:
            p.has_seq_seed = 1
            p.seq_seed = self.seq_seed
        if self.stop:
            arr = (ctypes.c_char_p * len(self.stop))(*[s.encode() for s in self.stop])
            keep.append(arr)
            p.stop, p.n_stop = ctypes.cast(arr, _ffi.c_char_pp), len(self.stop)
        if self.stop_token_ids:
            arr = (ctypes.c_int32 * len(self.stop_token_ids))(*self.stop_token_ids)
            keep.append(arr)
            p.stop_token_ids, p.n_stop_token_ids = ctypes.cast(arr, _ffi.c_int32_p), len(self.stop_token_ids)
        p.include_stop_str_in_output = int(self.include_stop_str_in_output)
        p.ignore_eos = int(self.ignore_eos)
        if self.max_tokens is None:  # vLLM: up to the model's length
            p.max_tokens = max(1, (max_model_len or 1) - n_prompt)
        else:
            p.max_tokens = self.max_tokens
        p.min_tokens = self.min_tokens
        p.logprobs = -1 if self.logprobs is None else self.logprobs
        p.prompt_logprobs = -1 if self.prompt_logprobs is None else self.prompt_logprobs
        if self.logit_bias:
            ids = (ctypes.c_int32 * len(self.logit_bias))(*self.logit_bias.keys())
            vals = (ctypes.c_float * len(self.logit_bias))(*self.logit_bias.values())
            keep += [ids, vals]
            p.logit_bias_ids, p.logit_bias_values = ctypes.cast(ids, _ffi.c_int32_p), ctypes.cast(vals, _ffi.c_float_p)
            p.n_logit_bias = len(self.logit_bias)
        p.skip_special_tokens = int(self.skip_special_tokens)
        if self.json_schema is not None:
            s = self.json_schema if isinstance(self.json_schema, str) else json.dumps(self.json_schema)
            p.json_schema = s.encode()
        if self.regex is not None:
            p.regex = self.regex.encode()
        if self.ebnf is not None:
            p.ebnf = self.ebnf.encode()
        if self.choice is not None:
            arr = (ctypes.c_char_p * len(self.choice))(*[c.encode() for c in self.choice])
            keep.append(arr)
            p.choice, p.n_choice = ctypes.cast(arr, _ffi.c_char_pp), len(self.choice)
        p.json_object = int(self.json_object)
        p.disable_any_whitespace = int(self.disable_any_whitespace)
        p.disable_additional_properties = int(self.disable_additional_properties)
        p.thinking_token_budget = -1 if self.thinking_token_budget is None else self.thinking_token_budget
        return p, keep
