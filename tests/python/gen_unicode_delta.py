"""Prints the Unicode 16.0 general-category delta over utf8proc's tables.

HF tokenizers runs the pre-tokenizer regexes with Oniguruma 6.9.10, whose
property tables are Unicode 16.0; Debian 12's utf8proc 2.8 is Unicode 15.0.
This script lists, as C initializers for src/recipe/unicode.c, every range of
code points whose coarse class (L, M, N, P, S or none) differs between the
two. Run with the `unicodedata2==16.0.0` package importable:

    python3 tests/python/gen_unicode_delta.py
"""
import ctypes

import unicodedata2

assert unicodedata2.unidata_version == "16.0.0", unicodedata2.unidata_version
utf8proc = ctypes.CDLL("libutf8proc.so.2")
utf8proc.utf8proc_category.restype = ctypes.c_int
utf8proc.utf8proc_category_string.restype = ctypes.c_char_p


def coarse(cat):
    return {"L": "L", "M": "M", "N": "N", "P": "P", "S": "S"}.get(cat[0], "0")


ranges = []
for cp in range(0x110000):
    if 0xD800 <= cp < 0xE000:
        continue
    new = coarse(unicodedata2.category(chr(cp)))
    old = coarse(utf8proc.utf8proc_category_string(cp).decode())
    if new == old:
        continue
    if ranges and ranges[-1][1] == cp - 1 and ranges[-1][2] == new:
        ranges[-1][1] = cp
    else:
        ranges.append([cp, cp, new])
for a, b, c in ranges:
    print(f"    {{0x{a:05X}, 0x{b:05X}, {'0' if c == '0' else 'DI_UC_' + c}}},")
print(f"/* {len(ranges)} ranges */")
