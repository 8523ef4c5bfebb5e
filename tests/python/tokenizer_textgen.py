"""Deterministic generator of varied text for the tokenizer differential tests.

Documents mix source code in several languages, prose in many scripts, CJK and
kana, emoji with ZWJ sequences, skin tones, flags and variation selectors,
combining marks, numbers of every Unicode kind, long whitespace runs (tabs,
CRLF, lone CR, NBSP, ideographic space, line separators), added-token
spellings, and random code points from all planes. Python's `random` seeded
per document keeps the corpus identical on every machine.
"""
import random

_SCRIPTS = {
    "latin": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "latin_ext": "àáâãäåæçèéêëìíîïðñòóôõöøùúûüýþÿāăąćčďđēėęěğģīįıķłńňőœřśşšţťūůűųźżžßẞǅǈ",
    "cyrillic": "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЁЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯіїєґ",
    "greek": "αβγδεζηθικλμνξοπρστυφχψωςΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩάέήίόύώϊϋΐΰ",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهويءآأؤإئةىًٌٍَُِّْ",
    "hebrew": "אבגדהוזחטיכלמנסעפצקרשתךםןףץ",
    "devanagari": "अआइईउऊऋएऐओऔकखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसहािीुूृेैोौंःँ्",
    "thai": "กขฃคฅฆงจฉชซฌญฎฏฐฑฒณดตถทธนบปผฝพฟภมยรฤลฦวศษสหฬอฮะัาำิีึืุูเแโใไๅๆ็่้๊๋์",
    "hangul": "가각간갇갈감갑강개객거건걸검겁게겨격견결겸경계고곡곤골곰공과관광괴교구국군굴궁권귀규균그극근글금급기긴길김깊까깨꼬꽃꾸끝",
    "cjk": "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从",
    "kana": "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんがぎぐげござじずぜぞアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンー・ヴ゛゜",
    "georgian": "აბგდევზთიკლმნოპჟრსტუფქღყშჩცძწჭხჯჰ",
    "armenian": "աբգդեզէըթժիլխծկհձղճմյնշոչպջռսվտրցւփքօֆ",
    "ethiopic": "ሀሁሂሃሄህሆለሉሊላሌልሎሐሑሒሓሔሕሖመሙሚማሜምሞ",
    "tamil": "அஆஇஈஉஊஎஏஐஒஓஔகஙசஞடணதநபமயரலவழளறனாிீுூெேைொோௌ்",
    "bengali": "অআইঈউঊঋএঐওঔকখগঘঙচছজঝঞটঠডঢণতথদধনপফবভমযরলশষসহািীুূৃেৈোৌং্",
}
_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~¡¿«»“”‘’„‚‹›–—…‰′″§¶†‡•·、。，．！？：；「」『』（）【】《》〈〉〔〕・～￥＄€£¥₩₹¢°±×÷≠≤≥∞∑∏√∫∂∇∈∉∩∪⊂⊃∧∨¬→←↑↓↔⇒⇔♠♣♥♦★☆✓✗©®™"
_NUMBERS = "0123456789٠١٢٣٤٥٦٧٨٩۰۱۲۳۴۵۶۷۸۹०१२३४५६७८९০১২৩৪৫৬৭৮৯０１２３４５６７８９¹²³⁴⁵⁶⁷⁸⁹⁰₀₁₂₃½¼¾⅓⅔⅛ⅠⅡⅢⅣⅤⅥⅦⅧⅨⅩⅪⅫⅰⅱⅲ①②③④⑤⑴⑵⒈〇一二三𝟎𝟏𝟐𝟑"
_SPACES = [" ", "  ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", " \n", "\n ",
           "\u00a0", "\u3000", "\u2028", "\u2029", "\u0085", "\u2009", "\u200b", "\u000b", "\u000c",
           " " * 17, "\t \t ", "\n\t\t", " \r\n ", "        \n        "]
_COMBINING = [chr(c) for c in list(range(0x300, 0x370)) + list(range(0x1AB0, 0x1AC0)) +
              list(range(0x20D0, 0x20F1)) + [0x0903, 0x093E, 0x0488, 0x0489, 0x3099, 0x309A]]
_EMOJI = ["😀", "😂", "🥲", "❤️", "👍", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵",
          "🧑🏿‍🚀", "✈︎", "☺️", "🫠", "🫶🏻", "#️⃣", "1️⃣", "🔥", "💯", "🐍", "🦀", "👁️‍🗨️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]
_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
             "<think>", "</think>", "｜DSML｜", "<｜System｜>", "<｜▁pad▁｜>", "<|EOT|>",
             "<｜tool▁calls▁begin｜>", "<｜place▁holder▁no▁17｜>", "<｜", "｜>", "<think", "</dsml:"]

_CODE = {
    "c": ["int main(int argc, char **argv) {\n", "    for (size_t i = 0; i < n; i++) {\n",
          "        sum += a[i] * b[i];\n", "    }\n", "    return 0;\n}\n", "#include <stdio.h>\n",
          "static inline uint64_t hash(const void *p, size_t n);\n", "/* comment: x->y != NULL */\n",
          "if (x >= 0x7F && y <= -1) { *p++ = (char)c; }\n", "printf(\"%d %s\\n\", n, s);\n"],
    "python": ["def f(x, y=3):\n", "    return [i ** 2 for i in range(x) if i % 2 == 0]\n",
               "class Foo(Bar):\n    pass\n", "import numpy as np\n", "    with open(path, 'rb') as fh:\n",
               "        data = fh.read()\n", "x = {'a': 1, \"b\": [1, 2, 3]}  # comment\n",
               "print(f\"{x!r:>10}\")\n", "    @property\n    def name(self) -> str: ...\n"],
    "js": ["const f = (a, b) => a + b;\n", "let x = await fetch(`/api/${id}`);\n",
           "function foo() {\n  return this.bar?.baz ?? null;\n}\n", "export default { x: 1 };\n",
           "if (a === b && c !== d) { console.log('eq'); }\n", "</div><span class=\"x\">&nbsp;</span>\n"],
    "rust": ["fn main() -> Result<(), Box<dyn Error>> {\n", "    let v: Vec<u8> = vec![0; 16];\n",
             "    match x { Some(y) => y, None => 0 }\n", "impl<'a> Iterator for Iter<'a> {\n",
             "#[derive(Debug, Clone)]\n", "    println!(\"{:?}\", v);\n}\n"],
    "shell": ["#!/usr/bin/env bash\n", "set -euo pipefail\n", "for f in *.txt; do echo \"$f\"; done\n",
              "cat file | grep -E '^[0-9]+$' > out.log 2>&1\n", "export PATH=$HOME/bin:$PATH\n"],
    "json": ["{\"name\": \"deepinfer\", \"version\": 1.25, \"tags\": [\"a\", \"b\"]}\n",
             "[{\"id\": 123456789, \"ok\": true, \"v\": null}]\n", "{\"nested\": {\"k\": \"\\u00e9\\n\"}}\n"],
}


def _word(rng, alphabet, lo=1, hi=10):
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def _random_codepoint(rng):
    while True:
        plane = rng.choice([0, 0, 0, 1, 1, 2, 3, 14, 15, 16])
        cp = plane * 0x10000 + rng.randrange(0x10000)
        if not 0xD800 <= cp < 0xE000:
            return chr(cp)


def _segment(rng, specials):
    kind = rng.random()
    if kind < 0.22:
        lang = rng.choice(list(_CODE))
        return "".join(rng.choice(_CODE[lang]) for _ in range(rng.randint(1, 8)))
    if kind < 0.50:
        script = rng.choice(list(_SCRIPTS))
        words = [_word(rng, _SCRIPTS[script]) for _ in range(rng.randint(1, 12))]
        out = []
        for w in words:
            r = rng.random()
            if r < 0.1:
                w = w.capitalize()
            elif r < 0.15:
                w = w.upper()
            out.append(w)
            out.append(rng.choice([" ", " ", " ", ", ", ". ", "\n", "、", "。", " - ", "'s "]))
        return "".join(out)
    if kind < 0.58:
        return _word(rng, _SCRIPTS["cjk"] + _SCRIPTS["kana"] + "，。！？「」・ー 0123", 1, 30)
    if kind < 0.63:
        return "".join(rng.choice(_EMOJI) + rng.choice(["", "", " ", "\u200d", "\ufe0f"])
                       for _ in range(rng.randint(1, 6)))
    if kind < 0.68:
        base = _word(rng, rng.choice(list(_SCRIPTS.values())), 1, 6)
        return "".join(ch + "".join(rng.choice(_COMBINING) for _ in range(rng.randint(0, 3)))
                       for ch in base)
    if kind < 0.75:
        return _word(rng, _NUMBERS + "., -+:/", 1, 25)
    if kind < 0.83:
        return "".join(rng.choice(_SPACES) for _ in range(rng.randint(1, 6)))
    if kind < 0.88:
        return _word(rng, _PUNCT, 1, 8) + rng.choice(["", "abc", "\n", "\r\n", " x"])
    if kind < 0.93:
        return "".join(_random_codepoint(rng) for _ in range(rng.randint(1, 12)))
    if kind < 0.97 and specials:
        return rng.choice(specials) + rng.choice(["", " ", "\n", "x"])
    return "".join(chr(rng.randrange(0x20, 0x7F)) for _ in range(rng.randint(1, 20)))


def document(seed, approx_chars, specials=True):
    rng = random.Random(seed)
    parts, n = [], 0
    while n < approx_chars:
        s = _segment(rng, _SPECIALS if specials else None)
        parts.append(s)
        n += len(s)
    return "".join(parts)


def corpus(seed, total_bytes, doc_chars=4000, specials=True):
    """Documents whose UTF-8 sizes add up to at least total_bytes."""
    docs, size, i = [], 0, 0
    while size < total_bytes:
        d = document(seed * 1000003 + i, doc_chars, specials)
        docs.append(d)
        size += len(d.encode("utf-8"))
        i += 1
    return docs
