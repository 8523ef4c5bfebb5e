"""Writes tests/data/tokenizer_cases.json: texts and the ids HF tokenizers
(the reference implementation) gives them with the tiny V4.1 tokenizer
(tests/data/tokenizer-v41-tiny.json), so that the C unit tests can check the
pre-tokenizer's edge cases without Python.

    python3 tests/python/gen_tokenizer_cases.py
"""
import json
import os
import sys

from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(__file__))
from tokenizer_textgen import document  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TOK = os.path.join(ROOT, "tests", "data", "tokenizer-v41-tiny.json")

EDGE = [
    "", " ", "  ", "a", "a ", " a", "a  b", "a   ", "   a", "\n", "\r\n", "\n\n\n", "a\n\nb",
    "a \n b", "x\t\ty", " \t\n ", "foo  \r\n  bar", "\u3000\u3000x", "\u00a0a", "a\u00a0",
    "1", "12", "123", "1234", "1234567", "a1b22c333d4444", "١٢٣٤", "½¼", "Ⅻ", "x²³",
    "3.14159", "1,000,000", "-42", " 7", "v1.2.3",
    "Hello, world!", "don't", "it's", "I'M", "U.S.A.", "e.g.", "(foo)", "[bar]", "{baz}",
    "a.b", ".abc", "..abc", "#include", "@user", "$var", "<tag>", "</tag>", "->x", "::y",
    "x=>y", "a+=b", "!!!", "?!", "...\n", " ...\r\n\n", "，。", "「日本」", "、abc",
    "中文字符", "日本語のテキスト", "カタカナ・ひらがな", "ｱｲｳ", "漢字abc漢字", "한국어 텍스트",
    "中文 English 混合", "゛゜", "ー", "〆", "𠀀𠀁",
    "é", "e\u0301", "\u0301", "a\u0301\u0302", " \u0301x", "\u0915\u094d\u0937",
    "Ελληνικά", "русский текст", "עברית", "العربية", "ไทย", "हिन्दी",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "❤️", "#️⃣", " 😀 ", "a😀b",
    "\x00", "\x01\x02", "\x7f", "\u200b", "\u200d", "\ufeff", "\ufffd", "\U0010ffff",
    "\ue000", "\U000f0000", "\u0378", "\U00013460", "\U000323b0",
    "<｜User｜>", "<｜User｜>hi<｜Assistant｜>", "<think>x</think>", "<｜begin▁of▁sentence｜>",
    "<｜User", "<｜User｜", "<｜▁pad▁｜><｜▁pad▁｜>", " <think> ", "a<｜System｜>b",
    "    def f(x):\n        return x\n", "int main() {\n\treturn 0;\n}\n",
    "  \n  \n", "x \n", "x\n ", "\n \n", "a\r\rb", "a\r b", "\v\f", "\x85",
    "a" * 300, " " * 300, "ab" * 200, "!" * 100, "\n" * 50, "1" * 100, "中" * 100,
]


def main():
    hf = Tokenizer.from_file(TOK)
    # Plain text (no added-token matching): the same file without added_tokens.
    with open(TOK, encoding="utf-8") as f:
        spec = json.load(f)
    spec["added_tokens"] = []
    hf_plain = Tokenizer.from_str(json.dumps(spec))
    texts = list(EDGE) + [document(7000 + i, 30 + 2 * i) for i in range(60)]
    cases = []
    for t in texts:
        cases.append({
            "text": t,
            "hex": t.encode("utf-8").hex(),
            "ids_special": hf.encode(t, add_special_tokens=False).ids,
            "ids_plain": hf_plain.encode(t, add_special_tokens=False).ids,
        })
    out = os.path.join(ROOT, "tests", "data", "tokenizer_cases.json")
    with open(out, "w", encoding="utf-8") as f:
        head = {"tokenizer": "tokenizer-v41-tiny.json",
                "produced_with": "HF tokenizers " + __import__("tokenizers").__version__}
        f.write(json.dumps(head)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")
    print(out, len(cases))


if __name__ == "__main__":
    main()
