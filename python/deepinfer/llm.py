"""LLM: offline batch generation over one engine (include/deepinfer.h,
"engine"), shaped like vLLM's `LLM` (ecosystem.md §4.1).

Every request of a generate()/chat() call is validated by the engine at
submit; if one is refused nothing of the call runs and ValueError carries
the engine's message (which names the field and the accepted range)."""
import ctypes
import json
import math

from . import _ffi
from .outputs import CompletionOutput, Logprob, RequestOutput
from .progress import make_bar
from .sampling_params import SamplingParams

# Accepted for compatibility with vLLM call sites; they select nothing here.
_IGNORED_VLLM_ARGS = {"dtype", "trust_remote_code", "tokenizer_mode", "enforce_eager", "gpu_memory_utilization",
                      "swap_space", "revision", "quantization", "disable_log_stats"}

_VALUE_ERRORS = {_ffi.DI_ERR_INVALID_ARG, _ffi.DI_ERR_FORMAT, _ffi.DI_ERR_UNSUPPORTED, _ffi.DI_ERR_LIMIT,
                 _ffi.DI_ERR_NOT_FOUND}


def _error(status, what):
    msg = "%s: %s" % (what, _ffi.last_error()) if what else _ffi.last_error()
    if status in (_ffi.DI_ERR_IO,):
        return OSError(msg)
    if status in _VALUE_ERRORS:
        return ValueError(msg)
    return RuntimeError(msg)


class Tokenizer:
    """The engine's tokenizer (lives as long as the LLM)."""

    def __init__(self, handle, owner):
        self._h = handle
        self._owner = owner

    def encode(self, text, parse_special=False):
        L = _ffi.lib()
        b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        ids, n = _ffi.c_int32_p(), ctypes.c_size_t()
        st = L.di_tokenizer_encode(self._h, b, len(b), 1 if parse_special else 0, ctypes.byref(ids), ctypes.byref(n))
        if st:
            raise _error(st, "encode")
        out = ids[:n.value]
        L.di_free(ids)
        return out

    def decode_bytes(self, ids):
        L = _ffi.lib()
        arr = (ctypes.c_int32 * len(ids))(*ids)
        text, n = ctypes.c_void_p(), ctypes.c_size_t()
        st = L.di_tokenizer_decode(self._h, ctypes.cast(arr, _ffi.c_int32_p), len(ids), ctypes.byref(text),
                                   ctypes.byref(n))
        if st:
            raise _error(st, "decode")
        out = ctypes.string_at(text, n.value)
        L.di_free(text)
        return out

    def decode(self, ids):
        return self.decode_bytes(ids).decode("utf-8", "replace")


class LLM:
    """model: a checkpoint folder; None means $DEEPINFER_HF_MODEL_DIR, else
    the embedded default tiny model. load_format="dummy": model is a
    config.json (or its folder) and the weights are generated from
    dummy_seed. seed seeds the requests that set none (vLLM's seed=0)."""

    def __init__(self, model=None, tokenizer=None, seed=0, max_model_len=None, max_num_seqs=None,
                 max_num_batched_tokens=None, load_format="auto", dummy_seed=None, num_threads=0,
                 batch_invariant=None, async_scheduling=True, memory_limit=None, tensor_parallel_size=1,
                 **kwargs):
        self._e = None
        unknown = sorted(set(kwargs) - _IGNORED_VLLM_ARGS)
        if unknown:
            raise TypeError("LLM() got unexpected keyword argument(s): %s" % ", ".join(unknown))
        if tensor_parallel_size != 1:
            raise ValueError("tensor_parallel_size=%r: this build runs on one device (expert and data "
                             "parallelism come with the parallelism work)" % (tensor_parallel_size,))
        if load_format not in ("auto", "dummy", "safetensors"):
            raise ValueError("load_format must be 'auto', 'safetensors' or 'dummy', got %r" % (load_format,))
        L = _ffi.lib()
        o = _ffi.EngineOptions()
        L.di_engine_options_default(ctypes.byref(o))
        self._keep = []
        if model is not None:
            self._keep.append(str(model).encode())
            o.model = self._keep[-1]
        if tokenizer is not None:
            self._keep.append(str(tokenizer).encode())
            o.tokenizer = self._keep[-1]
        o.load_format = _ffi.DI_LOAD_DUMMY if load_format == "dummy" else _ffi.DI_LOAD_AUTO
        if dummy_seed is not None:
            o.dummy_seed = dummy_seed
        o.seed = seed
        if max_model_len is not None:
            o.max_model_len = max_model_len
        if max_num_seqs is not None:
            o.max_batch = max_num_seqs
        if max_num_batched_tokens is not None:
            o.max_tokens_per_step = max_num_batched_tokens
        if memory_limit is not None:
            o.memory_limit = memory_limit
        o.n_threads = num_threads
        if batch_invariant is not None:
            o.batch_invariant = int(bool(batch_invariant))
        o.async_scheduling = int(bool(async_scheduling))
        h = ctypes.c_void_p()
        st = L.di_engine_open(ctypes.byref(o), ctypes.byref(h))
        if st:
            raise _error(st, "cannot open the engine")
        self._e = h
        info = _ffi.EngineInfo()
        L.di_engine_get_info(self._e, ctypes.byref(info))
        self.vocab_size = info.vocab_size
        self.max_model_len = info.max_model_len
        self.eos_token_id = info.eos_id
        self.bos_token_id = info.bos_id
        self.model_path = _ffi.cstr(info.model_path)
        self.batch_invariant = bool(info.batch_invariant)
        self.num_threads = info.n_threads
        self.accelerator = _ffi.cstr(info.accelerator)
        # the budgets in effect: the arguments, or the backend's defaults
        self.max_num_seqs = info.max_batch
        self.max_num_batched_tokens = info.max_tokens_per_step
        self.memory_limit = info.memory_limit
        # bytes of the checkpoint's weights copied into memory (the CPU's
        # choice where they fit); 0 when they are mapped from the files
        self.weights_in_memory = info.weights_in_memory
        tok = L.di_engine_tokenizer(self._e)
        self._tok = Tokenizer(tok, self) if tok else None
        self._n_req = 0

    # -- lifecycle
    def close(self):
        if self._e:
            _ffi.lib().di_engine_close(self._e)
            self._e = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def get_tokenizer(self):
        return self._tok

    def _live(self):
        if not self._e:
            raise RuntimeError("the LLM was closed")
        return self._e

    # -- public entry points
    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        """prompts: a string, {"prompt": str} / {"prompt_token_ids": [ids]},
        a list of token ids, or a list of any of these. Returns one
        RequestOutput per prompt, in input order."""
        items = self._normalize_prompts(prompts)
        params = self._normalize_params(sampling_params, len(items))
        subs = []
        for (kind, payload, text), sp in zip(items, params):
            subs.append((kind, payload, text, sp, None))
        return self._run(subs, use_tqdm)

    def chat(self, messages, sampling_params=None, use_tqdm=True, chat_template_kwargs=None, thinking=None,
             reasoning_effort=None, tools=None, add_generation_prompt=True):
        """messages: one conversation (a list of OpenAI message dicts) or a
        list of them. thinking / reasoning_effort (also read from
        chat_template_kwargs) select V4.1's thinking mode; None leaves the
        model's default (thinking on)."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError("messages must be a non-empty list of message dicts (or a list of such lists)")
        convs = [messages] if isinstance(messages[0], dict) else list(messages)
        for c in convs:
            if not isinstance(c, (list, tuple)) or not c or not all(isinstance(m, dict) for m in c):
                raise ValueError("each conversation must be a non-empty list of message dicts")
        kw = dict(chat_template_kwargs or {})
        if thinking is None:
            thinking = kw.get("thinking", kw.get("enable_thinking"))
        if reasoning_effort is None:
            reasoning_effort = kw.get("reasoning_effort")
        params = self._normalize_params(sampling_params, len(convs))
        subs = []
        for c, sp in zip(convs, params):
            body = {"messages": list(c)}
            if tools:
                body["tools"] = tools
            co = _ffi.ChatOptions()
            _ffi.lib().di_chat_options_default(ctypes.byref(co))
            co.thinking = -1 if thinking is None else int(bool(thinking))
            if reasoning_effort is not None:
                co.reasoning_effort = reasoning_effort.encode()
            co.add_generation_prompt = int(bool(add_generation_prompt))
            subs.append(("chat", json.dumps(body).encode(), None, sp, co))
        return self._run(subs, use_tqdm)

    # -- helpers
    def _normalize_prompts(self, prompts):
        def one(p):
            if isinstance(p, str):
                return ("text", p.encode("utf-8"), p)
            if isinstance(p, dict):
                if "prompt_token_ids" in p:
                    return ("tokens", list(p["prompt_token_ids"]), p.get("prompt"))
                if "prompt" in p:
                    return one(p["prompt"])
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids', got keys %s" % sorted(p))
            if isinstance(p, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                return ("tokens", list(p), None)
            raise ValueError("unsupported prompt type %s" % type(p).__name__)

        if isinstance(prompts, (str, dict)):
            return [one(prompts)]
        if isinstance(prompts, (list, tuple)):
            if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
                return [one(prompts)]  # a single token-id prompt
            if not prompts:
                raise ValueError("no prompts given")
            return [one(p) for p in prompts]
        raise ValueError("prompts must be a string, a dict, a list of token ids or a list of these")

    @staticmethod
    def _normalize_params(sp, n):
        def one(s):
            if isinstance(s, SamplingParams):
                return s
            if isinstance(s, dict):  # SGLang passes sampling parameters as a dict
                try:
                    return SamplingParams(**s)
                except TypeError as e:
                    raise ValueError("sampling_params: %s" % e) from None
            raise ValueError("sampling_params must be SamplingParams objects or dicts, got %s" % type(s).__name__)

        if sp is None:
            return [SamplingParams()] * n
        if isinstance(sp, (SamplingParams, dict)):
            return [one(sp)] * n
        if isinstance(sp, (list, tuple)):
            if len(sp) != n:
                raise ValueError("the lengths of prompts (%d) and sampling_params (%d) must be the same" % (n, len(sp)))
            return [one(s) for s in sp]
        raise ValueError("sampling_params must be a SamplingParams, a dict or a list of them")

    def _submit(self, kind, payload, sp, co):
        L = _ffi.lib()
        e = self._live()
        rid = ctypes.c_uint64()
        n_prompt = len(payload) if kind == "tokens" else 0
        p, keep = sp.to_c(self.max_model_len, n_prompt)
        if kind == "tokens":
            for t in payload:
                if not isinstance(t, int) or isinstance(t, bool):
                    raise ValueError("prompt token ids must be integers, got %r" % (t,))
                if not 0 <= t < 2 ** 31:
                    raise ValueError("Token id %d is out of vocabulary (size %d)" % (t, self.vocab_size))
            arr = (ctypes.c_int32 * max(len(payload), 1))(*payload)
            st = L.di_engine_submit_tokens(e, ctypes.cast(arr, _ffi.c_int32_p), len(payload), ctypes.byref(p),
                                           ctypes.byref(rid))
        elif kind == "text":
            st = L.di_engine_submit_text(e, payload, len(payload), ctypes.byref(p), ctypes.byref(rid))
        else:
            st = L.di_engine_submit_chat(e, payload, len(payload), ctypes.byref(co), ctypes.byref(p), ctypes.byref(rid))
        del keep
        if st:
            raise _error(st, None)
        return rid.value

    def _drop(self, ids):
        L = _ffi.lib()
        for rid in ids:
            L.di_engine_abort(self._e, rid)
        L.di_engine_run(self._e, _ffi.PROGRESS_FN(), None)
        for rid in ids:
            L.di_engine_release(self._e, rid)

    def _run(self, subs, use_tqdm):
        L = _ffi.lib()
        e = self._live()
        ids = []
        try:
            for i, (kind, payload, _text, sp, co) in enumerate(subs):
                try:
                    ids.append(self._submit(kind, payload, sp, co))
                except ValueError as ex:
                    raise ValueError("prompt %d: %s" % (i, ex) if len(subs) > 1 else str(ex)) from None
        except BaseException:
            self._drop(ids)
            raise
        bar = make_bar(len(ids), "Processed prompts", use_tqdm)
        shown = [0]
        stopped = []

        def on_progress(_user, pp):
            # Runs once a step, so Ctrl-C (raised here, where Python code
            # runs) stops the run instead of being lost inside the C loop.
            try:
                if bar is not None:
                    p = pp.contents
                    # the counts run since the engine opened; earlier calls all finished
                    done = int(p.requests_done) - (int(p.requests_total) - len(ids))
                    if done > shown[0]:
                        bar.update(done - shown[0])
                        shown[0] = done
                    bar.set_postfix_str("est. speed input: %.2f toks/s, output: %.2f toks/s" %
                                        (p.prompt_tps, p.output_tps), refresh=False)
                return 0
            except BaseException as ex:  # noqa: BLE001 — re-raised after the run stops
                stopped.append(ex)
                return 1

        cb = _ffi.PROGRESS_FN(on_progress)
        try:
            st = L.di_engine_run(e, cb, None)
        finally:
            if bar is not None:
                bar.close()
        if stopped or st:
            err = stopped[0] if stopped else _error(st, "engine step failed")
            self._drop(ids)
            raise err
        outs = [self._collect(rid, text) for rid, (_k, _p, text, _s, _c) in zip(ids, subs)]
        for rid in ids:
            L.di_engine_release(e, rid)
        return outs

    def _decoded(self, tid):
        if self._tok is None:
            return None
        try:
            return self._tok.decode([tid])
        except ValueError:
            return None

    def _logprob_rows(self, n, lp, n_top, top_ids, top_lp, ids):
        rows = []
        for i in range(n):
            row = {}
            for j in range(n_top):
                t = top_ids[i * n_top + j]
                if t >= 0:
                    row[t] = Logprob(top_lp[i * n_top + j], j + 1, self._decoded(t))
            t = ids[i]
            if t not in row:
                row[t] = Logprob(lp[i], None, self._decoded(t))
            # the sampled token first, as vLLM lists it
            rows.append({t: row[t], **{k: v for k, v in row.items() if k != t}})
        return rows

    def _collect(self, rid, prompt_text):
        L = _ffi.lib()
        ro = _ffi.RequestOutputC()
        st = L.di_engine_get_output(self._e, rid, ctypes.byref(ro))
        if st:
            raise _error(st, "output")
        prompt_ids = ro.prompt_ids[:ro.n_prompt]
        if prompt_text is None and self._tok is not None:
            prompt_text = self._tok.decode(prompt_ids)
        prompt_lps = None
        if ro.prompt_logprobs:
            rows = self._logprob_rows(ro.n_prompt, ro.prompt_logprobs, ro.n_prompt_top, ro.prompt_top_ids,
                                      ro.prompt_top_logprobs, prompt_ids)
            prompt_lps = [None] + rows[1:]
        outs = []
        for j in range(ro.n_completions):
            c = _ffi.Completion()
            st = L.di_engine_get_completion(self._e, rid, j, ctypes.byref(c))
            if st:
                raise _error(st, "completion")
            toks = c.token_ids[:c.n_tokens] if c.n_tokens else []
            text = ctypes.string_at(c.text, c.text_len).decode("utf-8", "replace") if c.text else ""
            finish = _ffi.FINISH_NAMES.get(c.finish_reason, "error")
            if c.stop_str is not None:
                stop_reason = _ffi.cstr(c.stop_str)
            elif c.stop_token >= 0 and c.stop_token != self.eos_token_id:
                stop_reason = c.stop_token
            else:
                stop_reason = None
            lps = None
            if c.logprobs:
                lps = self._logprob_rows(c.n_tokens, c.logprobs, c.n_top, c.top_ids, c.top_logprobs, toks)
            tool_calls = json.loads(c.tool_calls_json) if c.tool_calls_json else None
            co = CompletionOutput(j, text, toks, c.cumulative_logprob if not math.isnan(c.cumulative_logprob) else None,
                                  lps, finish, stop_reason, _ffi.cstr(c.reasoning_content), _ffi.cstr(c.content),
                                  tool_calls)
            co.error = _ffi.cstr(c.error)
            outs.append(co)
        return RequestOutput(str(rid), prompt_text, prompt_ids, prompt_lps, outs, bool(ro.finished))


def env_describe():
    """The DEEPINFER_* environment variables in effect, as text; ValueError
    naming the variable when one holds a bad value."""
    L = _ffi.lib()
    out = ctypes.c_void_p()
    st = L.di_engine_env_describe(ctypes.byref(out))
    if st:
        raise _error(st, None)
    s = ctypes.string_at(out).decode("utf-8", "replace")
    L.di_free(out)
    return s
