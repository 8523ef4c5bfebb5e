/* Unicode classes for the tokenizer (ecosystem.md §2.1). */
#include "recipe/unicode.h"

#include <pthread.h>
#include <utf8proc.h>

static unsigned ascii_class(int32_t c) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) return DI_UC_L | DI_UC_ASCII_ALPHA;
    if (c >= '0' && c <= '9') return DI_UC_N;
    if (c == ' ') return DI_UC_WS | DI_UC_SPACE;
    if (c == '\r' || c == '\n') return DI_UC_WS | DI_UC_CRLF;
    if (c == '\t' || c == '\v' || c == '\f') return DI_UC_WS;
    if (c < 0x20 || c == 0x7F) return 0;
    /* The remaining 32 printable characters: Unicode files $+<=>^`|~ under
     * symbols and the rest under punctuation. */
    switch (c) {
    case '$': case '+': case '<': case '=': case '>': case '^': case '`': case '|': case '~':
        return DI_UC_S | DI_UC_ASCII_PUNCT;
    default:
        return DI_UC_P | DI_UC_ASCII_PUNCT;
    }
}

/* Code points whose class differs between Unicode 16.0 (the tables of the
 * Oniguruma that HF tokenizers runs the reference regexes with) and
 * utf8proc's Unicode 15.0: characters assigned in 15.1 and 16.0. Generated
 * from the Unicode Character Database 16.0 by tests/python/gen_unicode_delta.py. */
static const struct { int32_t lo, hi; unsigned cls; } unicode16_delta[] = {
{0x00897, 0x00897, DI_UC_M},
    {0x01B4E, 0x01B4F, DI_UC_P},
    {0x01B7F, 0x01B7F, DI_UC_P},
    {0x01C89, 0x01C8A, DI_UC_L},
    {0x02427, 0x02429, DI_UC_S},
    {0x02FFC, 0x02FFF, DI_UC_S},
    {0x031E4, 0x031E5, DI_UC_S},
    {0x031EF, 0x031EF, DI_UC_S},
    {0x0A7CB, 0x0A7CD, DI_UC_L},
    {0x0A7DA, 0x0A7DC, DI_UC_L},
    {0x105C0, 0x105F3, DI_UC_L},
    {0x10D40, 0x10D49, DI_UC_N},
    {0x10D4A, 0x10D65, DI_UC_L},
    {0x10D69, 0x10D6D, DI_UC_M},
    {0x10D6E, 0x10D6E, DI_UC_P},
    {0x10D6F, 0x10D85, DI_UC_L},
    {0x10D8E, 0x10D8F, DI_UC_S},
    {0x10EC2, 0x10EC4, DI_UC_L},
    {0x10EFC, 0x10EFC, DI_UC_M},
    {0x11380, 0x11389, DI_UC_L},
    {0x1138B, 0x1138B, DI_UC_L},
    {0x1138E, 0x1138E, DI_UC_L},
    {0x11390, 0x113B5, DI_UC_L},
    {0x113B7, 0x113B7, DI_UC_L},
    {0x113B8, 0x113C0, DI_UC_M},
    {0x113C2, 0x113C2, DI_UC_M},
    {0x113C5, 0x113C5, DI_UC_M},
    {0x113C7, 0x113CA, DI_UC_M},
    {0x113CC, 0x113D0, DI_UC_M},
    {0x113D1, 0x113D1, DI_UC_L},
    {0x113D2, 0x113D2, DI_UC_M},
    {0x113D3, 0x113D3, DI_UC_L},
    {0x113D4, 0x113D5, DI_UC_P},
    {0x113D7, 0x113D8, DI_UC_P},
    {0x113E1, 0x113E2, DI_UC_M},
    {0x116D0, 0x116E3, DI_UC_N},
    {0x11BC0, 0x11BE0, DI_UC_L},
    {0x11BE1, 0x11BE1, DI_UC_P},
    {0x11BF0, 0x11BF9, DI_UC_N},
    {0x11F5A, 0x11F5A, DI_UC_M},
    {0x13460, 0x143FA, DI_UC_L},
    {0x16100, 0x1611D, DI_UC_L},
    {0x1611E, 0x1612F, DI_UC_M},
    {0x16130, 0x16139, DI_UC_N},
    {0x16D40, 0x16D6C, DI_UC_L},
    {0x16D6D, 0x16D6F, DI_UC_P},
    {0x16D70, 0x16D79, DI_UC_N},
    {0x18CFF, 0x18CFF, DI_UC_L},
    {0x1CC00, 0x1CCEF, DI_UC_S},
    {0x1CCF0, 0x1CCF9, DI_UC_N},
    {0x1CD00, 0x1CEB3, DI_UC_S},
    {0x1E5D0, 0x1E5ED, DI_UC_L},
    {0x1E5EE, 0x1E5EF, DI_UC_M},
    {0x1E5F0, 0x1E5F0, DI_UC_L},
    {0x1E5F1, 0x1E5FA, DI_UC_N},
    {0x1E5FF, 0x1E5FF, DI_UC_P},
    {0x1F8B2, 0x1F8BB, DI_UC_S},
    {0x1F8C0, 0x1F8C1, DI_UC_S},
    {0x1FA89, 0x1FA89, DI_UC_S},
    {0x1FA8F, 0x1FA8F, DI_UC_S},
    {0x1FABE, 0x1FABE, DI_UC_S},
    {0x1FAC6, 0x1FAC6, DI_UC_S},
    {0x1FADC, 0x1FADC, DI_UC_S},
    {0x1FADF, 0x1FADF, DI_UC_S},
    {0x1FAE9, 0x1FAE9, DI_UC_S},
    {0x1FBCB, 0x1FBEF, DI_UC_S},
    {0x2EBF0, 0x2EE5D, DI_UC_L},
};

static unsigned delta_class(int32_t cp, unsigned fallback) {
    size_t lo = 0, hi = sizeof unicode16_delta / sizeof *unicode16_delta;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < unicode16_delta[mid].lo) hi = mid;
        else if (cp > unicode16_delta[mid].hi) lo = mid + 1;
        else return unicode16_delta[mid].cls;
    }
    return fallback;
}

static int is_white_space(int32_t c) {
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static unsigned class_slow(int32_t cp) {
    unsigned f = 0;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
        f = DI_UC_L; break;
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
        f = DI_UC_M; break;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        f = DI_UC_N; break;
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE: case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
        f = DI_UC_P; break;
    case UTF8PROC_CATEGORY_SM: case UTF8PROC_CATEGORY_SC: case UTF8PROC_CATEGORY_SK:
    case UTF8PROC_CATEGORY_SO:
        f = DI_UC_S; break;
    case UTF8PROC_CATEGORY_CN:
        f = delta_class(cp, 0); break;
    default:
        break;
    }
    if (is_white_space(cp)) f |= DI_UC_WS;
    if ((cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x309F) ||
        (cp >= 0x30A0 && cp <= 0x30FF))
        f |= DI_UC_CJK;
    return f;
}

/* Classes of the Basic Multilingual Plane, computed once (128 KiB): most
 * text never leaves it, and a table read beats utf8proc's two-level lookup. */
static uint16_t bmp_class[0x10000];
static pthread_once_t bmp_once = PTHREAD_ONCE_INIT;

static void bmp_init(void) {
    for (int32_t cp = 0; cp < 0x10000; cp++)
        bmp_class[cp] = (uint16_t)(cp < 0x80 ? ascii_class(cp) : class_slow(cp));
}

const uint16_t *di_unicode_bmp_classes(void) {
    pthread_once(&bmp_once, bmp_init);
    return bmp_class;
}

unsigned di_unicode_class(int32_t cp) {
    if (cp < 0x80) return cp < 0 ? DI_UC_S : ascii_class(cp);
    if (cp < 0x10000) {
        pthread_once(&bmp_once, bmp_init);
        return bmp_class[cp];
    }
    return class_slow(cp);
}
