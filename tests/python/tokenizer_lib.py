"""ctypes access to the tokenizer section of libdeepinfer (include/deepinfer.h)."""
import ctypes
import os

_P32 = ctypes.POINTER(ctypes.c_int32)


def library_path():
    build = os.environ.get("DEEPINFER_BUILD", "build")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = build if os.path.isabs(build) else os.path.join(root, build)
    return os.path.join(path, "libdeepinfer.so")


def load_library(path=None):
    # A build with the CUDA backend links C++ runtime objects; make its
    # symbols available in case the library does not name libstdc++ itself.
    try:
        ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        pass
    L = ctypes.CDLL(path or library_path())
    L.di_last_error.restype = ctypes.c_char_p
    L.di_free.argtypes = [ctypes.c_void_p]
    L.di_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    L.di_tokenizer_load_memory.argtypes = [ctypes.c_char_p, ctypes.c_size_t,
                                           ctypes.POINTER(ctypes.c_void_p)]
    L.di_tokenizer_free.argtypes = [ctypes.c_void_p]
    L.di_tokenizer_vocab_size.argtypes = [ctypes.c_void_p]
    L.di_tokenizer_vocab_size.restype = ctypes.c_size_t
    L.di_tokenizer_encode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                      ctypes.c_uint, ctypes.POINTER(_P32),
                                      ctypes.POINTER(ctypes.c_size_t)]
    L.di_tokenizer_decode.argtypes = [ctypes.c_void_p, _P32, ctypes.c_size_t,
                                      ctypes.POINTER(ctypes.c_void_p),
                                      ctypes.POINTER(ctypes.c_size_t)]
    L.di_tokenizer_token_bytes.argtypes = [ctypes.c_void_p, ctypes.c_int32,
                                           ctypes.POINTER(ctypes.c_void_p),
                                           ctypes.POINTER(ctypes.c_size_t)]
    L.di_tokenizer_token_id.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _P32]
    L.di_tokenizer_is_special.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    L.di_tokenizer_engram_map.argtypes = [ctypes.c_void_p, _P32, ctypes.POINTER(ctypes.c_int)]
    L.di_detokenizer_new.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
    L.di_detokenizer_push.argtypes = [ctypes.c_void_p, ctypes.c_int32,
                                      ctypes.POINTER(ctypes.c_void_p),
                                      ctypes.POINTER(ctypes.c_size_t)]
    L.di_detokenizer_flush.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(ctypes.c_size_t)]
    L.di_detokenizer_free.argtypes = [ctypes.c_void_p]
    return L


PARSE_SPECIAL = 1
DETOK_LOSSY = 1


class DiError(RuntimeError):
    def __init__(self, status, message):
        super().__init__(f"status {status}: {message}")
        self.status = status
        self.message = message


class Tokenizer:
    def __init__(self, lib, path=None, json_bytes=None):
        self.L = lib
        self.h = ctypes.c_void_p()
        if path is not None:
            rc = lib.di_tokenizer_load(os.fsencode(path), ctypes.byref(self.h))
        else:
            rc = lib.di_tokenizer_load_memory(json_bytes, len(json_bytes), ctypes.byref(self.h))
        self._check(rc)

    def _check(self, rc):
        if rc:
            raise DiError(rc, self.L.di_last_error().decode("utf-8", "replace"))

    def close(self):
        if self.h:
            self.L.di_tokenizer_free(self.h)
            self.h = ctypes.c_void_p()

    def __del__(self):
        self.close()

    @property
    def vocab_size(self):
        return self.L.di_tokenizer_vocab_size(self.h)

    def encode(self, text, parse_special=False):
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        p, n = _P32(), ctypes.c_size_t()
        self._check(self.L.di_tokenizer_encode(self.h, data, len(data),
                                               PARSE_SPECIAL if parse_special else 0,
                                               ctypes.byref(p), ctypes.byref(n)))
        ids = p[:n.value]
        self.L.di_free(ctypes.cast(p, ctypes.c_void_p))
        return ids

    def decode(self, ids):
        arr = (ctypes.c_int32 * max(1, len(ids)))(*ids)
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        self._check(self.L.di_tokenizer_decode(self.h, arr, len(ids), ctypes.byref(p),
                                               ctypes.byref(n)))
        data = ctypes.string_at(p, n.value)
        self.L.di_free(p)
        return data

    def token_bytes(self, i):
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        self._check(self.L.di_tokenizer_token_bytes(self.h, i, ctypes.byref(p), ctypes.byref(n)))
        return ctypes.string_at(p, n.value)

    def token_id(self, spelling):
        i = ctypes.c_int32()
        self._check(self.L.di_tokenizer_token_id(self.h, spelling.encode("utf-8"), ctypes.byref(i)))
        return i.value

    def is_special(self, i):
        return bool(self.L.di_tokenizer_is_special(self.h, i))

    def engram_map(self):
        m = (ctypes.c_int32 * self.vocab_size)()
        k = ctypes.c_int()
        self._check(self.L.di_tokenizer_engram_map(self.h, m, ctypes.byref(k)))
        return list(m), k.value

    def stream(self, ids, lossy=False):
        """Chunks the streaming detokenizer returns for ids, then the flush."""
        d = ctypes.c_void_p()
        self._check(self.L.di_detokenizer_new(self.h, DETOK_LOSSY if lossy else 0, ctypes.byref(d)))
        out = []
        try:
            p, n = ctypes.c_void_p(), ctypes.c_size_t()
            for i in ids:
                self._check(self.L.di_detokenizer_push(d, i, ctypes.byref(p), ctypes.byref(n)))
                out.append(ctypes.string_at(p, n.value))
            self._check(self.L.di_detokenizer_flush(d, ctypes.byref(p), ctypes.byref(n)))
            out.append(ctypes.string_at(p, n.value))
        finally:
            self.L.di_detokenizer_free(d)
        return out
