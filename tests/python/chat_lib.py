"""ctypes access to the chat section of libdeepinfer (include/deepinfer.h)."""
import ctypes
import json

from tokenizer_lib import library_path, load_library  # noqa: F401 (library_path re-exported)


class ChatOptions(ctypes.Structure):
    _fields_ = [("thinking", ctypes.c_int), ("reasoning_effort", ctypes.c_char_p),
                ("add_generation_prompt", ctypes.c_int)]


class ChatLib:
    def __init__(self, path):
        L = load_library(path)
        self.L = L
        L.di_last_error.restype = ctypes.c_char_p
        L.di_free.argtypes = [ctypes.c_void_p]
        L.di_chat_render.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ChatOptions),
                                     ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
        L.di_chat_encode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                     ctypes.POINTER(ChatOptions),
                                     ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)),
                                     ctypes.POINTER(ctypes.c_size_t)]
        L.di_chat_output_flags.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ChatOptions),
                                           ctypes.POINTER(ctypes.c_uint)]
        L.di_chat_parse.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint,
                                    ctypes.POINTER(ctypes.c_void_p)]
        L.di_chat_stream_new.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
                                         ctypes.POINTER(ctypes.c_void_p)]
        L.di_chat_stream_push.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                          ctypes.POINTER(ctypes.c_void_p)]
        L.di_chat_stream_finish.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                            ctypes.POINTER(ctypes.c_void_p)]
        L.di_chat_stream_free.argtypes = [ctypes.c_void_p]
        L.di_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        L.di_tokenizer_free.argtypes = [ctypes.c_void_p]

    def error(self):
        return self.L.di_last_error().decode("utf-8", "replace")

    def _take(self, p, n=None):
        if n is None:
            data = ctypes.string_at(p.value)
        else:
            data = ctypes.string_at(p.value, n)
        self.L.di_free(p)
        return data

    @staticmethod
    def _opts(thinking, effort, add_generation_prompt):
        return ChatOptions(thinking, effort.encode() if effort else None, add_generation_prompt)

    def render(self, chat, thinking=-1, effort=None, add_generation_prompt=1):
        data = (chat if isinstance(chat, str) else json.dumps(chat, ensure_ascii=False)).encode()
        out, n = ctypes.c_void_p(), ctypes.c_size_t()
        opts = self._opts(thinking, effort, add_generation_prompt)
        st = self.L.di_chat_render(data, len(data), ctypes.byref(opts), ctypes.byref(out),
                                   ctypes.byref(n))
        if st:
            raise ValueError(self.error())
        return self._take(out, n.value).decode("utf-8")

    def output_flags(self, chat, thinking=-1, effort=None, add_generation_prompt=1):
        data = (chat if isinstance(chat, str) else json.dumps(chat, ensure_ascii=False)).encode()
        flags = ctypes.c_uint()
        opts = self._opts(thinking, effort, add_generation_prompt)
        if self.L.di_chat_output_flags(data, len(data), ctypes.byref(opts), ctypes.byref(flags)):
            raise ValueError(self.error())
        return flags.value

    def load_tokenizer(self, path):
        tok = ctypes.c_void_p()
        if self.L.di_tokenizer_load(path.encode(), ctypes.byref(tok)):
            raise ValueError(self.error())
        return tok

    def encode(self, tok, chat, thinking=-1, effort=None, add_generation_prompt=1):
        data = (chat if isinstance(chat, str) else json.dumps(chat, ensure_ascii=False)).encode()
        ids, n = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t()
        opts = self._opts(thinking, effort, add_generation_prompt)
        if self.L.di_chat_encode(tok, data, len(data), ctypes.byref(opts), ctypes.byref(ids),
                                 ctypes.byref(n)):
            raise ValueError(self.error())
        out = [ids[i] for i in range(n.value)]
        self.L.di_free(ctypes.cast(ids, ctypes.c_void_p))
        return out

    def parse(self, text, flags):
        data = text.encode()
        out = ctypes.c_void_p()
        if self.L.di_chat_parse(data, len(data), flags, ctypes.byref(out)):
            raise ValueError(self.error())
        return json.loads(self._take(out))

    def stream(self, pieces, flags, stop=()):
        """Feeds pieces; returns (accumulated message from the deltas, final message)."""
        arr = (ctypes.c_char_p * max(1, len(stop)))(*[s.encode() for s in stop])
        s = ctypes.c_void_p()
        if self.L.di_chat_stream_new(flags, arr, len(stop), ctypes.byref(s)):
            raise ValueError(self.error())
        acc = {"content": "", "reasoning_content": "", "tool_calls": []}

        def apply(delta):
            d = json.loads(delta)
            for k in ("content", "reasoning_content"):
                acc[k] += d.get(k, "")
            for tc in d.get("tool_calls", []):
                while len(acc["tool_calls"]) <= tc["index"]:
                    acc["tool_calls"].append({"name": "", "arguments": ""})
                f = tc["function"]
                acc["tool_calls"][tc["index"]]["name"] += f.get("name", "")
                acc["tool_calls"][tc["index"]]["arguments"] += f.get("arguments", "")
        try:
            for p in pieces:
                data = p.encode()
                d = ctypes.c_void_p()
                if self.L.di_chat_stream_push(s, data, len(data), ctypes.byref(d)):
                    raise ValueError(self.error())
                apply(self._take(d))
            d, m = ctypes.c_void_p(), ctypes.c_void_p()
            if self.L.di_chat_stream_finish(s, ctypes.byref(d), ctypes.byref(m)):
                raise ValueError(self.error())
            apply(self._take(d))
            return acc, json.loads(self._take(m))
        finally:
            self.L.di_chat_stream_free(s)


PARSE_THINKING, PARSE_TOOLS, PARSE_IN_CALLS, PARSE_CONTINUE = 1, 2, 4, 8
