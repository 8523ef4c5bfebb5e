/* JSON Schema numbers → lexemes: decimal ranges for integer and fractional
 * bounds (digit by digit), multipleOf 1 and 10^-k, and the internal
 * keywords negation produces (x-di-not-values, x-di-non-integer). Numbers
 * that must differ from a value are written in at most 9 integer and 6
 * fraction digits, where comparing literals is comparing doubles.
 * Spec: ecosystem.md §1.1 (keyword coverage), §1.4 (refuse what cannot be
 * enforced). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_schema.h"
#include "grammar/regex.h"

static void append(char *out, size_t cap, size_t *k, const char *str) {
    size_t n = strlen(str);
    if (*k + n + 1 > cap) n = *k + 1 < cap ? cap - *k - 1 : 0;
    memcpy(out + *k, str, n);
    *k += n;
    out[*k] = 0;
}

/* Regex for decimal integers with digits in [lo, hi] of the same length. */
static void range_same_len(const char *lo, const char *hi, char *out, size_t cap) {
    size_t n = strlen(lo), k = 0;
    char tmp[64];
    out[0] = 0;
    if (n == 0) return;
    if (n == 1) {
        snprintf(tmp, sizeof tmp, "[%c-%c]", lo[0], hi[0]);
        append(out, cap, &k, tmp);
        return;
    }
    int full = 1;
    for (size_t i = 0; i < n; i++) full &= lo[i] == '0' && hi[i] == '9';
    if (full) {
        snprintf(tmp, sizeof tmp, "[0-9]{%zu}", n);
        append(out, cap, &k, tmp);
        return;
    }
    char *sub = malloc(cap);
    if (!sub) return;
    if (lo[0] == hi[0]) {
        range_same_len(lo + 1, hi + 1, sub, cap);
        tmp[0] = lo[0]; tmp[1] = 0;
        append(out, cap, &k, tmp);
        append(out, cap, &k, sub);
        free(sub);
        return;
    }
    char nines[32], zeros[32];
    memset(nines, '9', n - 1); nines[n - 1] = 0;
    memset(zeros, '0', n - 1); zeros[n - 1] = 0;
    range_same_len(lo + 1, nines, sub, cap);
    snprintf(tmp, sizeof tmp, "(%c", lo[0]);
    append(out, cap, &k, tmp);
    append(out, cap, &k, sub);
    if (hi[0] - lo[0] >= 2) {
        snprintf(tmp, sizeof tmp, "|[%c-%c][0-9]{%zu}", lo[0] + 1, hi[0] - 1, n - 1);
        append(out, cap, &k, tmp);
    }
    range_same_len(zeros, hi + 1, sub, cap);
    snprintf(tmp, sizeof tmp, "|%c", hi[0]);
    append(out, cap, &k, tmp);
    append(out, cap, &k, sub);
    append(out, cap, &k, ")");
    free(sub);
}

/* Regex for non-negative integers in [lo, hi] (hi < 0: unbounded),
 * canonical (no leading zeros). Empty string when the range is empty. */
static void int_range(long long lo, long long hi, char *out, size_t cap) {
    out[0] = 0;
    if (lo < 0) lo = 0;
    if (hi >= 0 && hi < lo) return;
    char los[32], his[32];
    snprintf(los, sizeof los, "%lld", lo);
    size_t ll = strlen(los), hl;
    size_t k = 0;
    k += (size_t)snprintf(out + k, cap - k, "(");
    int first = 1;
    if (hi < 0) {
        /* same length as lo and >= lo, or longer */
        char nines[32];
        memset(nines, '9', ll); nines[ll] = 0;
        char sub[4096];
        range_same_len(los, nines, sub, sizeof sub);
        k += (size_t)snprintf(out + k, cap - k, "%s|[1-9][0-9]{%zu,}", sub, ll);
        snprintf(out + k, cap - k, ")");
        return;
    }
    snprintf(his, sizeof his, "%lld", hi);
    hl = strlen(his);
    for (size_t L = ll; L <= hl && k < cap; L++) {
        char a[32], b[32];
        if (L == ll) strcpy(a, los);
        else { a[0] = '1'; memset(a + 1, '0', L - 1); a[L] = 0; }
        if (L == hl) strcpy(b, his);
        else { memset(b, '9', L); b[L] = 0; }
        char sub[4096];
        range_same_len(a, b, sub, sizeof sub);
        k += (size_t)snprintf(out + k, cap - k, "%s%s", first ? "" : "|", sub);
        first = 0;
    }
    if (k < cap) snprintf(out + k, cap - k, ")");
}

/* Non-negative magnitudes m with lo (<|<=) m (<|<=) hi, lo/hi integers,
 * hi < 0 unbounded; integer_only: no fraction except zeros. */
static void mag_range(long long lo, int lo_ex, long long hi, int hi_ex, int integer_only, char *out, size_t cap) {
    const char *frac = integer_only ? "" : "(\\.[0-9]+)?";
    char r[8192];
    size_t k = 0;
    out[0] = 0;
    int first = 1;
#define ALT(...) do { k += (size_t)snprintf(out + k, cap - k, "%s", first ? "" : "|"); first = 0; \
                      k += (size_t)snprintf(out + k, cap - k, __VA_ARGS__); } while (0)
    if (hi >= 0 && (hi < lo || (hi == lo && (lo_ex || hi_ex)))) return;
    /* integer part == lo */
    if (!lo_ex) ALT("%lld%s", lo, (hi == lo) ? (integer_only ? "" : "(\\.0+)?") : frac);
    else if (!integer_only && (hi < 0 || hi > lo)) ALT("%lld\\.[0-9]*[1-9][0-9]*", lo);
    /* integer part strictly between */
    if (hi < 0) {
        int_range(lo + 1, -1, r, sizeof r);
        if (r[0]) ALT("%s%s", r, frac);
    } else if (hi - 1 >= lo + 1) {
        int_range(lo + 1, hi - 1, r, sizeof r);
        if (r[0]) ALT("%s%s", r, frac);
    }
    /* integer part == hi */
    if (hi >= 0 && hi > lo) {
        if (!hi_ex) ALT("%lld%s", hi, integer_only ? "" : "(\\.0+)?");
        else if (!integer_only) { /* m < hi with integer part hi-1 handled above; nothing here */ }
    }
    if (hi >= 0 && hi_ex && !integer_only && hi > lo) {
        /* integer part hi-1 with any fraction is covered above unless hi-1 == lo */
    }
#undef ALT
}

/* Fraction digit strings d (after the point, at least one digit) compared
 * with the fraction digits f of a bound (f without trailing zeros, maybe
 * empty), as decimals: which = 1 for d > f, 0 for d = f, -1 for d < f.
 * Appends alternatives ("|" separated, none when empty) to out. */
static void frac_cmp_rx(const char *f, int which, char *out, size_t cap) {
    size_t k = strlen(out), n = strlen(f);
    int first = out[0] == 0;
#define FALT(...) do { k += (size_t)snprintf(out + k, cap - k, "%s", first ? "" : "|"); first = 0; \
                       k += (size_t)snprintf(out + k, cap - k, __VA_ARGS__); } while (0)
    if (which == 0) {
        FALT("%s%s0*", f, n ? "" : "0");
        return;
    }
    for (size_t j = 0; j < n; j++) {
        int dj = f[j] - '0';
        if (which > 0 && dj < 9) FALT("%.*s[%d-9][0-9]*", (int)j, f, dj + 1);
        if (which < 0 && dj > 0) FALT("%.*s[0-%d][0-9]*", (int)j, f, dj - 1);
        if (which < 0 && j > 0) FALT("%.*s", (int)j, f); /* a shorter prefix: smaller */
    }
    if (which > 0) FALT("%s[0-9]*[1-9][0-9]*", f);
#undef FALT
}

/* Unsigned decimals m (canonical integer part, optional fraction) with
 * m > b (ge = 1) or m < b (ge = 0), or equal too when !strict; b = bi.bf. */
static void mag_cmp_rx(long long bi, const char *bf, int ge, int strict, char *out, size_t cap) {
    char ir[8192], fr[4096];
    size_t k = 0;
    out[0] = 0;
    int first = 1;
#define MALT(...) do { k += (size_t)snprintf(out + k, cap - k, "%s", first ? "" : "|"); first = 0; \
                       k += (size_t)snprintf(out + k, cap - k, __VA_ARGS__); } while (0)
    ir[0] = 0;
    if (ge) int_range(bi + 1, -1, ir, sizeof ir);
    else if (bi >= 1) int_range(0, bi - 1, ir, sizeof ir); /* (a negative hi means unbounded) */
    if (ir[0]) MALT("%s(\\.[0-9]+)?", ir);
    /* integer part bi: no fraction (value bi.0), or a fraction compared */
    fr[0] = 0;
    frac_cmp_rx(bf, ge ? 1 : -1, fr, sizeof fr);
    if (!strict) frac_cmp_rx(bf, 0, fr, sizeof fr);
    int bare = ge ? (!strict && !bf[0]) : (bf[0] || !strict);
    if (bare) MALT("%lld", bi);
    if (fr[0]) MALT("%lld\\.(%s)", bi, fr);
#undef MALT
}

/* Decimal digits of |b| as integer and fraction parts (fraction without
 * trailing zeros); -1 when b needs more than 6 fraction digits or 9
 * integer digits (beyond the exact-comparison language). */
static int bound_digits(double b, long long *bi, char *bf, size_t cap) {
    double a = fabs(b);
    if (a >= 1e9) return -1;
    char t[64];
    snprintf(t, sizeof t, "%.6f", a);
    if (strtod(t, NULL) != a) return -1;
    char *dot = strchr(t, '.');
    *dot = 0;
    *bi = atoll(t);
    size_t e = strlen(dot + 1);
    while (e > 0 && dot[e] == '0') e--;
    snprintf(bf, cap, "%.*s", (int)e, dot + 1);
    return 0;
}

/* Regex of the numbers x >= b (ge) or x <= b (!ge), strictly when strict,
 * for a fractional bound b: the sign decides which magnitudes. */
static int number_side_rx(js_ctx *c, double b, int ge, int strict, char *out, size_t cap) {
    long long bi;
    char bf[16], mag[16384];
    if (bound_digits(b, &bi, bf, sizeof bf))
        return FAIL(c, DI_ERR_UNSUPPORTED, "numeric bound %.17g needs more than 9 integer or 6 fraction digits", b);
    const char *any = "(0|[1-9][0-9]*)(\\.[0-9]+)?";
    int pos = b >= 0;
    /* x >= b: b positive: magnitudes >= b; b negative: non-negatives, or
     * negatives with magnitude <= |b|. Mirrored for x <= b. */
    mag_cmp_rx(bi, bf, ge == pos, strict, mag, sizeof mag);
    if (ge == pos) snprintf(out, cap, "%s(%s)", pos ? "" : "\\-", mag);
    else snprintf(out, cap, "(%s%s|%s(%s))", ge ? "" : "\\-", any, pos ? "" : "\\-", mag);
    return 0;
}

/* Regex of the decimal literals equal to number v within lang_digits (see
 * number_emit) into buf; 0 when no such literal exists, -1 when v cannot
 * be excluded exactly. */
static int number_literal_rx(js_ctx *c, double v, int integer_only, char *buf, size_t cap) {
    if (integer_only) {
        if (v != floor(v)) return 0; /* no integer equals it */
        if (fabs(v) >= 9007199254740992.0)
            return FAIL(c, DI_ERR_UNSUPPORTED, "excluding the integer %.17g (beyond 2^53) is not supported", v);
        snprintf(buf, cap, "%s%.0f(\\.0+)?", v < 0 ? "\\-" : (v == 0 ? "-?" : ""), fabs(v));
        return 1;
    }
    if (fabs(v) >= 1e9) return 0;
    char t[64];
    snprintf(t, sizeof t, "%.6f", fabs(v));
    if (strtod(t, NULL) != fabs(v)) return 0; /* needs more digits than the language has */
    char *dot = strchr(t, '.');
    size_t e = strlen(t);
    while (e > 0 && t[e - 1] == '0') e--;
    if (dot && e == (size_t)(dot - t) + 1) e--; /* drop the point too */
    t[e] = 0;
    const char *sign = v < 0 ? "\\-" : (v == 0 ? "-?" : "");
    if (dot && (size_t)(dot - t) < e) {
        *dot = 0;
        snprintf(buf, cap, "%s%s\\.%s0*", sign, t, dot + 1);
    } else snprintf(buf, cap, "%s%s(\\.0+)?", sign, t);
    return 1;
}

/* Symbol for the number language given as a regex or a DFA (taken),
 * narrowed by the internal keywords negation produces: x-di-not-values
 * (equal to none of these; numbers are then written with at most 9 integer
 * and 6 fraction digits, so that two different literals are two different
 * doubles and equality is decided on the text) and x-di-non-integer (a
 * non-zero fraction, in the same digits so that the double is not integral).
 * Exclusive bounds on numbers use the same digits: a long literal just
 * below a bound could round to it. */
static int number_emit(js_ctx *c, const cJSON *s, int integer_only, int exclusive, const char *rx, di_dfa *dfa,
                       di_sym *out) {
    const cJSON *nv = cJSON_GetObjectItemCaseSensitive(s, "x-di-not-values");
    const cJSON *ni = cJSON_GetObjectItemCaseSensitive(s, "x-di-non-integer");
    if (!nv && !(ni && cJSON_IsTrue(ni)) && !exclusive) {
        if (rx) return di_js_regex_sym(c, rx, 0, out);
        return di_cfg_dfa_sym(c->g, dfa, NULL, out, c->err) ? -1 : 0;
    }
    di_dfa d;
    if (rx) {
        if (di_js_regex_compile(c, rx, strlen(rx), 0, c->o->max_lexer_states, &d, c->err)) return -1;
    } else d = *dfa;
    char lim[256];
    size_t k = 0;
    lim[0] = 0;
    if (ni && cJSON_IsTrue(ni)) snprintf(lim, sizeof lim, "-?(0|[1-9][0-9]{0,8})\\.[0-9]{0,5}[1-9]");
    else if ((nv || exclusive) && !integer_only) snprintf(lim, sizeof lim, "-?(0|[1-9][0-9]{0,8})(\\.[0-9]{1,6})?");
    int r = 0;
    if (lim[0]) {
        di_dfa l, x;
        r = di_js_regex_compile(c, lim, strlen(lim), 0, c->o->max_lexer_states, &l, c->err) ? -1 : 0;
        if (!r) {
            r = di_dfa_product(&d, &l, 0, c->o->max_lexer_states, &x, c->err) ? -1 : 0;
            di_dfa_free(&l);
            if (!r) { di_dfa_free(&d); d = x; }
        }
    }
    if (!r && nv) {
        if (!cJSON_IsArray(nv)) { di_dfa_free(&d); return FAIL(c, DI_ERR_INTERNAL, "x-di-not-values"); }
        size_t cap = 64 + (size_t)cJSON_GetArraySize(nv) * 96;
        char *ex = malloc(cap);
        if (!ex) { di_dfa_free(&d); return FAIL(c, DI_ERR_NOMEM, "out of memory"); }
        k = 0;
        ex[0] = 0;
        for (const cJSON *v = nv->child; v && !r; v = v->next) {
            char one[96];
            int has = cJSON_IsNumber(v) ? number_literal_rx(c, v->valuedouble, integer_only, one, sizeof one) : 0;
            if (has < 0) r = -1;
            else if (has) k += (size_t)snprintf(ex + k, cap - k, "%s(%s)", k ? "|" : "", one);
        }
        if (!r && k) {
            di_dfa e, x;
            r = di_js_regex_compile(c, ex, k, 0, c->o->max_lexer_states, &e, c->err) ? -1 : 0;
            if (!r) {
                r = di_dfa_product(&d, &e, 1, c->o->max_lexer_states, &x, c->err) ? -1 : 0;
                di_dfa_free(&e);
                if (!r) { di_dfa_free(&d); d = x; }
            }
        }
        free(ex);
    }
    if (r) { di_dfa_free(&d); return -1; }
    return di_cfg_dfa_sym(c->g, &d, NULL, out, c->err) ? -1 : 0;
}

int di_js_number_sym(js_ctx *c, const cJSON *s, int integer_only, di_sym *out) {
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minimum");
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, "maximum");
    const cJSON *emn = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum");
    const cJSON *emx = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
    const cJSON *mul = cJSON_GetObjectItemCaseSensitive(s, "multipleOf");
    const cJSON *bs[4] = {mn, mx, emn, emx};
    for (int i = 0; i < 4; i++)
        if (bs[i] && !cJSON_IsNumber(bs[i])) {
            if (cJSON_IsBool(bs[i]))
                return FAIL(c, DI_ERR_UNSUPPORTED, "boolean exclusiveMinimum/exclusiveMaximum (draft 4) is not supported");
            return FAIL(c, DI_ERR_FORMAT, "numeric bound must be a number");
        }
    const char *frac_re = "";
    char fr[32];
    if (mul) {
        if (!cJSON_IsNumber(mul) || mul->valuedouble <= 0) return FAIL(c, DI_ERR_FORMAT, "'multipleOf' must be > 0");
        double m = mul->valuedouble;
        if (m == 1.0) integer_only = 1;
        else {
            int dec = -1;
            for (int d = 1; d <= 8; d++)
                if (fabs(m - pow(10, -d)) < 1e-12 * pow(10, -d)) dec = d;
            if (dec < 0 || integer_only) {
                if (c->o->lenient) goto no_mul;
                return FAIL(c, DI_ERR_UNSUPPORTED, "'multipleOf' %g is not supported (only 1 and powers of 1/10)", m);
            }
            snprintf(fr, sizeof fr, "(\\.[0-9]{1,%d})?", dec);
            frac_re = fr;
        }
    }
no_mul:;
    /* bounds as [lo, hi] with exclusivity; +-inf when absent */
    double lo = -INFINITY, hi = INFINITY;
    int lo_ex = 0, hi_ex = 0;
    if (mn) lo = mn->valuedouble;
    if (emn && emn->valuedouble >= lo) { lo = emn->valuedouble; lo_ex = 1; }
    if (mx) hi = mx->valuedouble;
    if (emx && emx->valuedouble <= hi) { hi = emx->valuedouble; hi_ex = 1; }
    char buf[65536];
    const char *intpart = "(0|[1-9][0-9]*)";
    if (isinf(lo) && isinf(hi)) {
        if (integer_only) snprintf(buf, sizeof buf, "-?%s%s", intpart, c->int_zero_frac ? "(\\.0+)?" : "");
        else if (frac_re[0]) snprintf(buf, sizeof buf, "-?%s%s", intpart, frac_re);
        else snprintf(buf, sizeof buf, "-?%s(\\.[0-9]+)?([eE][+-]?[0-9]+)?", intpart);
        return number_emit(c, s, integer_only, 0, buf, NULL, out);
    }
    /* Fractional bounds are tightened to integers for integer-only
     * values (exact); otherwise refused. */
    if (integer_only) {
        if (!isinf(lo)) { double l = lo_ex ? floor(lo) + 1 : ceil(lo); lo = l; lo_ex = 0; }
        if (!isinf(hi)) { double h = hi_ex ? ceil(hi) - 1 : floor(hi); hi = h; hi_ex = 0; }
    } else if ((!isinf(lo) && lo != floor(lo)) || (!isinf(hi) && hi != floor(hi))) {
        /* fractional bounds: one regex per side, intersected, in the digits
         * where comparing literals is comparing doubles */
        di_dfa d, e, x;
        char side[20000];
        int have = 0;
        const double bv[2] = {lo, hi};
        const int ex[2] = {lo_ex, hi_ex};
        for (int i = 0; i < 2; i++) {
            if (isinf(bv[i])) continue;
            if (number_side_rx(c, bv[i], i == 0, ex[i], side, sizeof side)) {
                if (have) di_dfa_free(&d);
                return -1;
            }
            if (di_js_regex_compile(c, side, strlen(side), 0, c->o->max_lexer_states, have ? &e : &d, c->err)) {
                if (have) di_dfa_free(&d);
                return -1;
            }
            if (have) {
                di_status st = di_dfa_product(&d, &e, 0, c->o->max_lexer_states, &x, c->err);
                di_dfa_free(&d);
                di_dfa_free(&e);
                if (st) return -1;
                d = x;
            }
            have = 1;
        }
        if (frac_re[0]) {
            snprintf(side, sizeof side, "-?(0|[1-9][0-9]*)%s", frac_re);
            if (di_js_regex_compile(c, side, strlen(side), 0, c->o->max_lexer_states, &e, c->err)) {
                di_dfa_free(&d);
                return -1;
            }
            di_status st = di_dfa_product(&d, &e, 0, c->o->max_lexer_states, &x, c->err);
            di_dfa_free(&e);
            di_dfa_free(&d);
            if (st) return -1;
            d = x;
        }
        return number_emit(c, s, 0, 1, NULL, &d, out);
    }
    if ((!isinf(lo) && fabs(lo) > 1e15) || (!isinf(hi) && fabs(hi) > 1e15))
        return FAIL(c, DI_ERR_UNSUPPORTED, "numeric bound beyond 1e15 is not supported");
    if (!isinf(lo) && !isinf(hi) && (lo > hi || (lo == hi && (lo_ex || hi_ex)))) {
        int32_t nt = di_js_new_nt(c); /* empty */
        if (nt < 0) return -1;
        *out = nt;
        return 0;
    }
    int io = integer_only || (frac_re[0] && 0);
    char pos[32768], neg[32768];
    pos[0] = neg[0] = 0;
    /* non-negative part: x in [max(lo,0), hi] */
    if (isinf(hi) || hi >= 0) {
        long long plo = (isinf(lo) || lo < 0) ? 0 : (long long)lo;
        int plo_ex = (!isinf(lo) && lo >= 0) ? lo_ex : 0;
        long long phi = isinf(hi) ? -1 : (long long)hi;
        mag_range(plo, plo_ex, phi, hi_ex, io, pos, sizeof pos);
    }
    /* negative part: x = -m, m in (0, -lo], m >= -hi when hi < 0 */
    if (isinf(lo) || lo < 0) {
        long long nlo = (!isinf(hi) && hi < 0) ? (long long)-hi : 0;
        int nlo_ex = (!isinf(hi) && hi < 0) ? hi_ex : 1;
        long long nhi = isinf(lo) ? -1 : (long long)-lo;
        mag_range(nlo, nlo_ex, nhi, lo_ex, io, neg, sizeof neg);
    }
    size_t k = 0;
    k += (size_t)snprintf(buf + k, sizeof buf - k, "(");
    if (pos[0]) k += (size_t)snprintf(buf + k, sizeof buf - k, "%s", pos);
    if (neg[0]) k += (size_t)snprintf(buf + k, sizeof buf - k, "%s-(%s)", pos[0] ? "|" : "", neg);
    snprintf(buf + k, sizeof buf - k, ")");
    if (!pos[0] && !neg[0]) {
        int32_t nt = di_js_new_nt(c);
        if (nt < 0) return -1;
        *out = nt;
        return 0;
    }
    if (frac_re[0] && !integer_only) {
        /* multipleOf 10^-d with bounds: intersect the two languages */
        char b2[64];
        snprintf(b2, sizeof b2, "-?(0|[1-9][0-9]*)%s", frac_re);
        di_dfa d1, d2, d;
        if (di_js_regex_compile(c, buf, strlen(buf), 0, c->o->max_lexer_states, &d1, c->err)) return -1;
        if (di_js_regex_compile(c, b2, strlen(b2), 0, c->o->max_lexer_states, &d2, c->err)) { di_dfa_free(&d1); return -1; }
        di_status st = di_dfa_product(&d1, &d2, 0, c->o->max_lexer_states, &d, c->err);
        di_dfa_free(&d1);
        di_dfa_free(&d2);
        if (st) return -1;
        return number_emit(c, s, integer_only, (lo_ex || hi_ex) && !integer_only, NULL, &d, out);
    }
    return number_emit(c, s, integer_only, (lo_ex || hi_ex) && !integer_only, buf, NULL, out);
}
