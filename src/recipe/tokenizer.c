/* Byte-level BPE tokenizer: tokenizer.json loading, added tokens, encoding
 * and decoding (ecosystem.md §2.1-2.2, architecture.md §9.1, deepinfer.md
 * §7.2).
 *
 * Encoding follows HF tokenizers step by step: added tokens are split off
 * first (with DI_TOKENIZE_PARSE_SPECIAL only), then each remaining span goes
 * through the pre-tokenizer and each piece through BPE. ByteLevel's
 * byte-to-character mapping is applied once, at load time, to the
 * vocabulary instead of to every piece: BPE works on raw bytes. */
#include "recipe/tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file_read.h"
#include "recipe/bpe_cache.h"
#include "recipe/pretokenize.h"
#include "recipe/unicode.h"

enum { TOK_VOCAB = 8 }; /* the id is in model.vocab (merges may only name these) */

/* ------------------------------------------------------------ byte level */

/* GPT-2's byte-to-character table: printable bytes keep their code point,
 * the other 68 bytes map in order to U+0100 onwards. */
static int32_t bytelevel_char(int b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return b;
    int k = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF)))
            k++;
    return 0x100 + k;
}

/* Inverse of bytelevel_char for U+0000..U+0143, -1 outside the alphabet;
 * filled once, thread-safely, by the first tokenizer load. */
static int16_t bytelevel_inverse[0x144];
static pthread_once_t bytelevel_once = PTHREAD_ONCE_INIT;

static void bytelevel_init(void) {
    for (int i = 0; i < 0x144; i++) bytelevel_inverse[i] = -1;
    for (int b = 0; b < 256; b++) bytelevel_inverse[bytelevel_char(b)] = (int16_t)b;
}

/* ------------------------------------------------------------- hashing */

static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    /* The 0-7 byte tail without a variable-length memcpy call. */
    uint64_t v = 0;
    if (n >= 4) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + n - 4, 4);
        v = (uint64_t)lo << 32 | hi;
    } else {
        for (size_t i = 0; i < n; i++) v = v << 8 | p[i];
    }
    h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 29);
}

int32_t di_tokenizer_lookup(const di_tokenizer *t, const char *s, size_t n) {
    if (!t->str_cap) return -1;
    size_t mask = t->str_cap - 1, i = hash_bytes((const uint8_t *)s, n) & mask;
    for (;;) {
        int32_t id = t->str_index[i];
        if (id < 0) return -1;
        if (t->str_off[id + 1] - t->str_off[id] - 1 == n && !memcmp(t->strs + t->str_off[id], s, n))
            return id;
        i = (i + 1) & mask;
    }
}

/* --------------------------------------------------------- added tokens */

typedef struct di_trie_node {
    int32_t token;    /* id ending here, -1 if none */
    uint32_t child;   /* first child, 0 = none (the root is nobody's child) */
    uint32_t sibling; /* next sibling, 0 = none */
    uint8_t byte;
} trie_node;

static void trie_free(di_added_trie *tr) {
    free(tr->nodes);
    memset(tr, 0, sizeof *tr);
}

static int32_t trie_new_node(di_added_trie *tr, uint8_t byte) {
    if (tr->n_nodes == tr->cap) {
        size_t cap = tr->cap ? tr->cap * 2 : 256;
        trie_node *n = realloc(tr->nodes, cap * sizeof *n);
        if (!n) return -1;
        tr->nodes = n;
        tr->cap = cap;
    }
    tr->nodes[tr->n_nodes] = (trie_node){-1, 0, 0, byte};
    return (int32_t)tr->n_nodes++;
}

static int trie_insert(di_added_trie *tr, const uint8_t *s, size_t n, int32_t id) {
    if (!tr->n_nodes && trie_new_node(tr, 0) < 0) return -1;
    uint32_t node = 0;
    for (size_t k = 0; k < n; k++) {
        uint32_t c = tr->nodes[node].child;
        while (c && tr->nodes[c].byte != s[k]) c = tr->nodes[c].sibling;
        if (!c) {
            int32_t nn = trie_new_node(tr, s[k]);
            if (nn < 0) return -1;
            tr->nodes[nn].sibling = tr->nodes[node].child;
            tr->nodes[node].child = (uint32_t)nn;
            c = (uint32_t)nn;
        }
        node = c;
    }
    tr->nodes[node].token = id;
    tr->first[s[0]] = 1;
    tr->n_tokens++;
    return 0;
}

/* Longest spelling starting at s[0]: its length (0 = none) and id. */
static size_t trie_match(const di_added_trie *tr, const uint8_t *s, size_t n, int32_t *id) {
    uint32_t node = 0;
    size_t best = 0;
    for (size_t k = 0; k < n; k++) {
        uint32_t c = tr->nodes[node].child;
        while (c && tr->nodes[c].byte != s[k]) c = tr->nodes[c].sibling;
        if (!c) break;
        node = c;
        if (tr->nodes[node].token >= 0) {
            best = k + 1;
            *id = tr->nodes[node].token;
        }
    }
    return best;
}

/* ------------------------------------------------------------- loading */

static di_status type_error(di_err *err, const char *path, const char *want) {
    return di_err_set(err, DI_ERR_FORMAT, "%s: expected %s", path, want);
}

/* A token id from a JSON number: an integer in [0, DI_TOKENIZER_MAX_ID]. */
static di_status json_id(const cJSON *v, const char *path, int32_t *id, di_err *err) {
    if (!cJSON_IsNumber(v)) return type_error(err, path, "an integer token id");
    double d = v->valuedouble;
    if (d != floor(d) || d < 0)
        return di_err_set(err, DI_ERR_FORMAT, "%s: token id %g is not a non-negative integer",
                          path, d);
    if (d > DI_TOKENIZER_MAX_ID)
        return di_err_set(err, DI_ERR_LIMIT, "%s: token id %.0f exceeds the supported maximum %d",
                          path, d, DI_TOKENIZER_MAX_ID);
    *id = (int32_t)d;
    return DI_OK;
}

static int is_null_or_absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

static const char *type_name(const cJSON *obj) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static int bool_is(const cJSON *obj, const char *key, int want, int absent_ok) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return absent_ok;
    return cJSON_IsBool(v) && (cJSON_IsTrue(v) ? 1 : 0) == want;
}

/* normalizer, pre_tokenizer, decoder, post_processor, truncation, padding:
 * only the DeepSeek pipeline is accepted, everything else is named. */
static di_status check_pipeline(const cJSON *root, di_err *err) {
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (!is_null_or_absent(norm)) {
        const char *tn = type_name(norm);
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(norm, "normalizers");
        if (!tn || strcmp(tn, "Sequence") || !cJSON_IsArray(list) || cJSON_GetArraySize(list)) {
            const cJSON *first = cJSON_IsArray(list) ? cJSON_GetArrayItem(list, 0) : NULL;
            return di_err_set(err, DI_ERR_UNSUPPORTED,
                              "normalizer %s is not supported (only none or an empty Sequence)",
                              first && type_name(first) ? type_name(first) : tn ? tn : "?");
        }
    }
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (is_null_or_absent(pre))
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "pre_tokenizer: none is not supported (expected the DeepSeek Sequence)");
    const char *tn = type_name(pre);
    if (!tn || strcmp(tn, "Sequence"))
        return di_err_set(err, DI_ERR_UNSUPPORTED, "pre_tokenizer %s is not supported",
                          tn ? tn : "(no type)");
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    if (!cJSON_IsArray(steps)) return type_error(err, "pre_tokenizer.pretokenizers", "an array");
    int n = cJSON_GetArraySize(steps);
    for (int i = 0; i < n; i++) {
        const cJSON *st = cJSON_GetArrayItem(steps, i);
        const char *sn = type_name(st);
        if (!sn)
            return di_err_set(err, DI_ERR_FORMAT, "pre_tokenizer.pretokenizers[%d]: no type", i);
        if (i < DI_PRETOKENIZE_STEPS) {
            if (strcmp(sn, "Split"))
                return di_err_set(err, DI_ERR_UNSUPPORTED,
                                  "pre_tokenizer.pretokenizers[%d]: %s is not supported here "
                                  "(expected Split)", i, sn);
            const cJSON *pat = cJSON_GetObjectItemCaseSensitive(st, "pattern");
            const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
            if (!cJSON_IsString(rx))
                return di_err_set(err, DI_ERR_UNSUPPORTED,
                                  "pre_tokenizer.pretokenizers[%d]: Split needs a Regex pattern "
                                  "(string patterns are not supported)", i);
            if (strcmp(rx->valuestring, di_pretokenize_pattern(i)))
                return di_err_set(err, DI_ERR_UNSUPPORTED,
                                  "pre_tokenizer.pretokenizers[%d]: Split regex \"%.200s\" is not "
                                  "supported (expected \"%s\")", i, rx->valuestring,
                                  di_pretokenize_pattern(i));
            const cJSON *beh = cJSON_GetObjectItemCaseSensitive(st, "behavior");
            if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated"))
                return di_err_set(err, DI_ERR_UNSUPPORTED,
                                  "pre_tokenizer.pretokenizers[%d]: Split behavior %s is not "
                                  "supported (expected Isolated)", i,
                                  cJSON_IsString(beh) ? beh->valuestring : "(missing)");
            if (!bool_is(st, "invert", 0, 1))
                return di_err_set(err, DI_ERR_UNSUPPORTED,
                                  "pre_tokenizer.pretokenizers[%d]: inverted Split is not "
                                  "supported", i);
        } else if (i == DI_PRETOKENIZE_STEPS) {
            if (strcmp(sn, "ByteLevel"))
                return di_err_set(err, DI_ERR_UNSUPPORTED,
                                  "pre_tokenizer.pretokenizers[%d]: %s is not supported here "
                                  "(expected ByteLevel)", i, sn);
            if (!bool_is(st, "add_prefix_space", 0, 1) || !bool_is(st, "use_regex", 0, 0))
                return di_err_set(err, DI_ERR_UNSUPPORTED,
                                  "pre_tokenizer.pretokenizers[%d]: ByteLevel is supported only "
                                  "with add_prefix_space=false and use_regex=false", i);
        } else {
            return di_err_set(err, DI_ERR_UNSUPPORTED,
                              "pre_tokenizer.pretokenizers[%d]: extra step %s is not supported",
                              i, sn);
        }
    }
    if (n != DI_PRETOKENIZE_STEPS + 1)
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "pre_tokenizer: %d steps; the supported DeepSeek pipeline has 3 Split "
                          "steps and ByteLevel", n);
    static const char *const bytelevel_only[] = {"decoder", "post_processor"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, bytelevel_only[i]);
        if (is_null_or_absent(v)) continue;
        const char *vn = type_name(v);
        if (!vn || strcmp(vn, "ByteLevel"))
            return di_err_set(err, DI_ERR_UNSUPPORTED, "%s %s is not supported (only ByteLevel)",
                              bytelevel_only[i], vn ? vn : "(no type)");
    }
    static const char *const must_be_null[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++)
        if (!is_null_or_absent(cJSON_GetObjectItemCaseSensitive(root, must_be_null[i])))
            return di_err_set(err, DI_ERR_UNSUPPORTED, "%s is not supported (must be null)",
                              must_be_null[i]);
    return DI_OK;
}

static di_status check_model(const cJSON *model, di_err *err) {
    if (!cJSON_IsObject(model)) return type_error(err, "model", "an object");
    const char *tn = type_name(model);
    if (!tn || strcmp(tn, "BPE"))
        return di_err_set(err, DI_ERR_UNSUPPORTED, "model type %s is not supported (only BPE)",
                          tn ? tn : "(missing)");
    static const char *const must_be_null[] = {"dropout", "unk_token", "continuing_subword_prefix",
                                               "end_of_word_suffix"};
    for (size_t i = 0; i < sizeof must_be_null / sizeof *must_be_null; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, must_be_null[i]);
        if (!is_null_or_absent(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
            return di_err_set(err, DI_ERR_UNSUPPORTED, "model.%s is not supported (must be null)",
                              must_be_null[i]);
    }
    if (!bool_is(model, "byte_fallback", 0, 1))
        return di_err_set(err, DI_ERR_UNSUPPORTED, "model.byte_fallback=true is not supported");
    if (!bool_is(model, "ignore_merges", 0, 1))
        return di_err_set(err, DI_ERR_UNSUPPORTED, "model.ignore_merges=true is not supported");
    return DI_OK;
}

/* Growable byte arena. */
typedef struct arena {
    char *p;
    size_t n, cap;
} arena;

static int arena_put(arena *a, const void *s, size_t n) {
    if (a->n + n + 1 > a->cap) {
        size_t cap = a->cap ? a->cap : 1 << 16;
        while (a->n + n + 1 > cap) cap *= 2;
        char *p = realloc(a->p, cap);
        if (!p) return -1;
        a->p = p;
        a->cap = cap;
    }
    memcpy(a->p + a->n, s, n);
    a->p[a->n + n] = '\0';
    a->n += n + 1;
    return 0;
}

/* Bytes a spelling decodes to: through the byte-level alphabet when every
 * character belongs to it, else its own UTF-8 (HF's ByteLevel decoder). */
static int put_decoded(arena *a, const char *s) {
    size_t n = strlen(s), k = 0, m = 0;
    uint8_t tmp[256];
    uint8_t *buf = n <= sizeof tmp ? tmp : malloc(n);
    if (!buf) return -1;
    while (k < n) {
        int32_t cp;
        size_t len = di_utf8_decode((const uint8_t *)s + k, n - k, &cp);
        int b = len && cp < 0x144 ? bytelevel_inverse[cp] : -1;
        if (b < 0) break;
        buf[m++] = (uint8_t)b;
        k += len;
    }
    int rc = k == n ? arena_put(a, buf, m) : arena_put(a, s, n);
    if (buf != tmp) free(buf);
    return rc;
}

static di_status build_index(di_tokenizer *t, di_err *err) {
    size_t cap = 16;
    while (cap < t->n_ids * 2) cap *= 2;
    t->str_index = malloc(cap * sizeof *t->str_index);
    if (!t->str_index) return di_err_set(err, DI_ERR_NOMEM, "token index: out of memory");
    memset(t->str_index, 0xFF, cap * sizeof *t->str_index);
    t->str_cap = cap;
    for (size_t id = 0; id < t->n_ids; id++) {
        if (!(t->flags[id] & DI_TOK_PRESENT)) continue;
        const char *s = t->strs + t->str_off[id];
        size_t n = t->str_off[id + 1] - t->str_off[id] - 1;
        size_t i = hash_bytes((const uint8_t *)s, n) & (cap - 1);
        while (t->str_index[i] >= 0) {
            int32_t o = t->str_index[i];
            if (t->str_off[o + 1] - t->str_off[o] - 1 == n && !memcmp(t->strs + t->str_off[o], s, n))
                return di_err_set(err, DI_ERR_FORMAT, "token \"%.100s\" has two ids, %d and %zu",
                                  s, o, id);
            i = (i + 1) & (cap - 1);
        }
        t->str_index[i] = (int32_t)id;
    }
    return DI_OK;
}

/* The merge list: "a b" strings or ["a", "b"] pairs; rank = position. */
static di_status load_merges(di_tokenizer *t, const cJSON *merges, di_err *err) {
    if (!cJSON_IsArray(merges)) return type_error(err, "model.merges", "an array");
    size_t n = (size_t)cJSON_GetArraySize(merges);
    di_status rc = di_bpe_init(&t->bpe, n, err);
    if (rc) return rc;
    char *join = NULL;
    size_t join_cap = 0;
    uint32_t rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        const char *a, *b;
        size_t na, nb;
        if (cJSON_IsString(m)) {
            a = m->valuestring;
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = di_err_set(err, DI_ERR_FORMAT,
                                "model.merges[%u]: \"%.100s\" is not two tokens separated by one "
                                "space", rank, a);
                break;
            }
            na = (size_t)(sp - a);
            b = sp + 1;
            nb = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            a = cJSON_GetArrayItem(m, 0)->valuestring;
            b = cJSON_GetArrayItem(m, 1)->valuestring;
            na = strlen(a);
            nb = strlen(b);
        } else {
            rc = di_err_set(err, DI_ERR_FORMAT,
                            "model.merges[%u]: expected \"a b\" or [\"a\", \"b\"]", rank);
            break;
        }
        int32_t ia = di_tokenizer_lookup(t, a, na), ib = di_tokenizer_lookup(t, b, nb);
        if (ia < 0 || !(t->flags[ia] & TOK_VOCAB) || ib < 0 || !(t->flags[ib] & TOK_VOCAB)) {
            int bad_a = ia < 0 || !(t->flags[ia] & TOK_VOCAB);
            rc = di_err_set(err, DI_ERR_FORMAT,
                            "model.merges[%u]: token \"%.*s\" is not in the vocabulary", rank,
                            bad_a ? (int)(na > 100 ? 100 : na) : (int)(nb > 100 ? 100 : nb),
                            bad_a ? a : b);
            break;
        }
        if (na + nb > join_cap) {
            join_cap = (na + nb) * 2 + 64;
            char *p = realloc(join, join_cap);
            if (!p) {
                rc = di_err_set(err, DI_ERR_NOMEM, "model.merges: out of memory");
                break;
            }
            join = p;
        }
        memcpy(join, a, na);
        memcpy(join + na, b, nb);
        int32_t im = di_tokenizer_lookup(t, join, na + nb);
        if (im < 0 || !(t->flags[im] & TOK_VOCAB)) {
            rc = di_err_set(err, DI_ERR_FORMAT,
                            "model.merges[%u]: merged token \"%.*s\" is not in the vocabulary",
                            rank, (int)(na + nb > 100 ? 100 : na + nb), join);
            break;
        }
        di_bpe_add(&t->bpe, ia, ib, im, rank);
        rank++;
    }
    free(join);
    return rc;
}

static di_status load_tokens(di_tokenizer *t, const cJSON *vocab, const cJSON *added,
                             di_err *err) {
    char path[160];
    const cJSON *v;
    int32_t max_id = -1, id;
    di_status rc;
    if (!cJSON_IsObject(vocab)) return type_error(err, "model.vocab", "an object");
    if (!is_null_or_absent(added) && !cJSON_IsArray(added))
        return type_error(err, "added_tokens", "an array");
    cJSON_ArrayForEach(v, vocab) {
        if (json_id(v, "", &id, NULL)) {
            snprintf(path, sizeof path, "model.vocab[\"%.100s\"]", v->string);
            return json_id(v, path, &id, err);
        }
        if (id > max_id) max_id = id;
    }
    int i = 0;
    cJSON_ArrayForEach(v, added) {
        snprintf(path, sizeof path, "added_tokens[%d]", i);
        if (!cJSON_IsObject(v)) return type_error(err, path, "an object");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (!cJSON_IsString(c) || !c->valuestring[0])
            return type_error(err, path, "a non-empty string \"content\"");
        snprintf(path, sizeof path, "added_tokens[%d].id", i);
        if ((rc = json_id(cJSON_GetObjectItemCaseSensitive(v, "id"), path, &id, err))) return rc;
        if (id > max_id) max_id = id;
        static const char *const flags_off[] = {"lstrip", "rstrip", "single_word"};
        for (int f = 0; f < 3; f++)
            if (!bool_is(v, flags_off[f], 0, 1))
                return di_err_set(err, DI_ERR_UNSUPPORTED,
                                  "added_tokens[%d] (\"%.100s\"): %s=true is not supported", i,
                                  c->valuestring, flags_off[f]);
        i++;
    }
    if (max_id < 0) return di_err_set(err, DI_ERR_FORMAT, "model.vocab: empty vocabulary");
    pthread_once(&bytelevel_once, bytelevel_init);
    t->n_ids = (size_t)max_id + 1;
    const char **spell = calloc(t->n_ids, sizeof *spell);
    t->flags = calloc(t->n_ids, 1);
    if (!spell || !t->flags) {
        free(spell);
        return di_err_set(err, DI_ERR_NOMEM, "vocabulary of %zu ids: out of memory", t->n_ids);
    }
    rc = DI_OK;
    cJSON_ArrayForEach(v, vocab) {
        id = (int32_t)v->valuedouble;
        if (spell[id]) {
            rc = di_err_set(err, DI_ERR_FORMAT, "model.vocab: id %d is used by \"%.100s\" and "
                            "\"%.100s\"", id, spell[id], v->string);
            break;
        }
        spell[id] = v->string;
        t->flags[id] = DI_TOK_PRESENT | TOK_VOCAB;
    }
    i = 0;
    if (!rc) cJSON_ArrayForEach(v, added) {
        const char *c = cJSON_GetObjectItemCaseSensitive(v, "content")->valuestring;
        id = (int32_t)cJSON_GetObjectItemCaseSensitive(v, "id")->valuedouble;
        if (spell[id] && (strcmp(spell[id], c) || (t->flags[id] & DI_TOK_ADDED))) {
            rc = di_err_set(err, DI_ERR_FORMAT, "added_tokens[%d] (\"%.100s\"): id %d is "
                            "already token \"%.100s\"", i, c, id, spell[id]);
            break;
        }
        spell[id] = c;
        t->flags[id] |= DI_TOK_PRESENT | DI_TOK_ADDED;
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "special")))
            t->flags[id] |= DI_TOK_SPECIAL;
        i++;
    }
    arena strs = {0}, bytes = {0};
    t->str_off = malloc((t->n_ids + 1) * sizeof *t->str_off);
    t->bytes_off = malloc((t->n_ids + 1) * sizeof *t->bytes_off);
    if (!rc && (!t->str_off || !t->bytes_off))
        rc = di_err_set(err, DI_ERR_NOMEM, "vocabulary: out of memory");
    for (size_t k = 0; !rc && k < t->n_ids; k++) {
        t->str_off[k] = (uint32_t)strs.n;
        t->bytes_off[k] = (uint32_t)bytes.n;
        const char *s = spell[k] ? spell[k] : "";
        if (arena_put(&strs, s, strlen(s)) || put_decoded(&bytes, s) ||
            strs.n > UINT32_MAX / 2 || bytes.n > UINT32_MAX / 2)
            rc = di_err_set(err, DI_ERR_NOMEM, "vocabulary strings: out of memory");
    }
    if (!rc) {
        t->str_off[t->n_ids] = (uint32_t)strs.n;
        t->bytes_off[t->n_ids] = (uint32_t)bytes.n;
    }
    t->strs = strs.p;
    t->bytes = (uint8_t *)bytes.p;
    free(spell);
    if (rc) return rc;
    if (!t->strs) return di_err_set(err, DI_ERR_NOMEM, "vocabulary: out of memory");
    return build_index(t, err);
}

static di_status build_added(di_tokenizer *t, const cJSON *added, di_err *err) {
    const cJSON *v;
    cJSON_ArrayForEach(v, added) {
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(v, "id")->valuedouble;
        const char *c = cJSON_GetObjectItemCaseSensitive(v, "content")->valuestring;
        int normalized = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "normalized"));
        if (trie_insert(&t->added[normalized], (const uint8_t *)c, strlen(c), id))
            return di_err_set(err, DI_ERR_NOMEM, "added tokens: out of memory");
    }
    return DI_OK;
}

static di_status build_bytes(di_tokenizer *t, di_err *err) {
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        size_t n = di_utf8_encode(bytelevel_char(b), u);
        int32_t id = di_tokenizer_lookup(t, (const char *)u, n);
        t->bpe.byte_id[b] = id >= 0 && (t->flags[id] & TOK_VOCAB) ? id : -1;
    }
    return di_bpe_finish(&t->bpe, err);
}

/* Line and column of byte offset pos in text, for parse errors. */
static void line_col(const char *text, size_t pos, size_t *line, size_t *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < pos; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

di_status di_tokenizer_parse(const char *json, size_t len, const char *what, di_tokenizer **out,
                             di_err *err) {
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t pos = end && end >= json && end <= json + len ? (size_t)(end - json) : 0, line, col;
        line_col(json, pos, &line, &col);
        return di_err_set(err, DI_ERR_FORMAT, "%s:%zu:%zu: invalid JSON", what, line, col);
    }
    di_tokenizer *t = calloc(1, sizeof *t);
    di_status rc = t ? DI_OK : di_err_set(err, DI_ERR_NOMEM, "tokenizer: out of memory");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!rc && !cJSON_IsObject(root)) rc = type_error(err, "top level", "an object");
    if (!rc) rc = check_pipeline(root, err);
    if (!rc) rc = check_model(model, err);
    if (!rc) rc = load_tokens(t, cJSON_GetObjectItemCaseSensitive(model, "vocab"), added, err);
    if (!rc) rc = load_merges(t, cJSON_GetObjectItemCaseSensitive(model, "merges"), err);
    if (!rc) rc = build_bytes(t, err);
    if (!rc) rc = build_added(t, added, err);
    if (!rc) t->serial = di_bpe_cache_serial();
    cJSON_Delete(root);
    if (rc) {
        di_err_prefix(err, "%s: ", what);
        di_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return DI_OK;
}

/* ------------------------------------------------------------ encoding */

typedef struct cache_entry {
    uint64_t hash;
    const uint8_t *piece; /* NULL = empty slot */
    uint32_t len;
    uint32_t start; /* the piece's ids, at ids[start .. start + count) */
    uint32_t count;
} cache_entry;

#define CACHE_MAX_PIECE 256 /* longer pieces are rare: encode them each time */

typedef struct encoder {
    const di_tokenizer *t;
    const uint8_t *base; /* the span being pre-tokenized */
    size_t text_len;     /* of the whole call */
    di_bpe_cache *shared; /* this thread's cache across calls, or NULL */
    int32_t *ids;
    size_t n, cap;
    cache_entry *cache; /* [cache_cap] pieces seen in this call */
    size_t cache_n, cache_cap;
    di_pretok_scratch pre;
    di_bpe_scratch bpe;
} encoder;

static int reserve(encoder *e, size_t more) {
    if (e->n + more <= e->cap) return 0;
    size_t cap = e->cap ? e->cap : 256;
    while (cap < e->n + more) cap *= 2;
    int32_t *p = realloc(e->ids, cap * sizeof *p);
    if (!p) return -1;
    e->ids = p;
    e->cap = cap;
    return 0;
}

static void cache_insert(encoder *e, uint64_t h, const uint8_t *p, size_t n, size_t start,
                         size_t count) {
    if ((e->cache_n + 1) * 2 > e->cache_cap) {
        /* First size from the text length (a piece is ~4 bytes on average),
         * so short texts do not pay for a large table. */
        size_t cap = e->cache_cap * 2;
        if (!cap)
            for (cap = 64; cap < e->text_len / 4 && cap < 65536;) cap *= 2;
        cache_entry *c = calloc(cap, sizeof *c);
        if (!c) return; /* the cache is an optimization only */
        for (size_t i = 0; i < e->cache_cap; i++) {
            if (!e->cache[i].piece) continue;
            size_t s = e->cache[i].hash & (cap - 1);
            while (c[s].piece) s = (s + 1) & (cap - 1);
            c[s] = e->cache[i];
        }
        free(e->cache);
        e->cache = c;
        e->cache_cap = cap;
    }
    size_t s = h & (e->cache_cap - 1);
    while (e->cache[s].piece) s = (s + 1) & (e->cache_cap - 1);
    e->cache[s] = (cache_entry){h, p, (uint32_t)n, (uint32_t)start, (uint32_t)count};
    e->cache_n++;
}

static int encode_piece(void *ctx, size_t start, size_t end) {
    encoder *e = ctx;
    const uint8_t *p = e->base + start;
    size_t n = end - start;
    if (reserve(e, n)) return 1;
    if (n == 1) {
        int32_t id = e->t->bpe.byte_id[p[0]];
        if (id >= 0) e->ids[e->n++] = id;
        return 0;
    }
    uint64_t h = 0;
    if (n <= DI_BPE_CACHE_BYTES && e->shared) {
        h = hash_bytes(p, n);
        di_bpe_cache_slot *sl = di_bpe_cache_slot_of(e->shared, (uint32_t)h);
        if (sl->len == n && sl->hash == (uint32_t)h && !memcmp(sl->bytes, p, n)) {
            memcpy(e->ids + e->n, sl->ids, sl->n_ids * sizeof *e->ids);
            e->n += sl->n_ids;
            return 0;
        }
        size_t got = di_bpe_word(&e->t->bpe, p, n, e->ids + e->n, &e->bpe);
        if (got == (size_t)-1) return 1;
        if (got <= DI_BPE_CACHE_IDS) {
            sl->hash = (uint32_t)h;
            sl->len = (uint8_t)n;
            sl->n_ids = (uint8_t)got;
            memcpy(sl->bytes, p, n);
            memcpy(sl->ids, e->ids + e->n, got * sizeof *e->ids);
        }
        e->n += got;
        return 0;
    }
    if (n <= CACHE_MAX_PIECE) {
        h = hash_bytes(p, n);
        if (e->cache_cap) {
            size_t s = h & (e->cache_cap - 1);
            for (; e->cache[s].piece; s = (s + 1) & (e->cache_cap - 1)) {
                const cache_entry *c = &e->cache[s];
                if (c->hash == h && c->len == n && !memcmp(c->piece, p, n)) {
                    memcpy(e->ids + e->n, e->ids + c->start, c->count * sizeof *e->ids);
                    e->n += c->count;
                    return 0;
                }
            }
        }
    }
    size_t got = di_bpe_word(&e->t->bpe, p, n, e->ids + e->n, &e->bpe);
    if (got == (size_t)-1) return 1;
    if (n <= CACHE_MAX_PIECE && e->n <= UINT32_MAX / 2) cache_insert(e, h, p, n, e->n, got);
    e->n += got;
    return 0;
}

static di_status encode_plain(encoder *e, const uint8_t *s, size_t n, di_err *err) {
    e->base = s;
    int stopped = 0;
    di_status rc = di_pretokenize(s, n, &e->pre, encode_piece, e, &stopped, err);
    if (rc && stopped) return di_err_set(err, DI_ERR_NOMEM, "encode: out of memory");
    return rc;
}

/* Splits s[0..n) at the spellings of trie `level` (leftmost-longest) and
 * passes the gaps to the next level (the other trie, then plain text). */
static di_status encode_added(encoder *e, int level, const uint8_t *s, size_t n, di_err *err) {
    if (level == 2) return encode_plain(e, s, n, err);
    const di_added_trie *tr = &e->t->added[level];
    if (!tr->n_tokens) return encode_added(e, level + 1, s, n, err);
    size_t gap = 0, i = 0;
    di_status rc;
    while (i < n) {
        int32_t id;
        size_t m = tr->first[s[i]] ? trie_match(tr, s + i, n - i, &id) : 0;
        if (!m) { i++; continue; }
        if (gap < i && (rc = encode_added(e, level + 1, s + gap, i - gap, err))) return rc;
        if (reserve(e, 1)) return di_err_set(err, DI_ERR_NOMEM, "encode: out of memory");
        e->ids[e->n++] = id;
        i = gap = i + m;
    }
    return gap < n ? encode_added(e, level + 1, s + gap, n - gap, err) : DI_OK;
}

static di_status tokenizer_encode(const di_tokenizer *t, const uint8_t *text, size_t len,
                                  unsigned flags, int32_t **ids, size_t *n_ids, di_err *err) {
    encoder e = {.t = t, .text_len = len, .shared = di_bpe_cache_get(t->serial)};
    di_status rc = (flags & DI_TOKENIZE_PARSE_SPECIAL) ? encode_added(&e, 0, text, len, err)
                                                       : encode_plain(&e, text, len, err);
    free(e.cache);
    di_pretok_scratch_free(&e.pre);
    di_bpe_scratch_free(&e.bpe);
    if (!rc && !e.ids) {
        e.ids = malloc(sizeof *e.ids);
        if (!e.ids) rc = di_err_set(err, DI_ERR_NOMEM, "encode: out of memory");
    }
    if (rc) {
        free(e.ids);
        return rc;
    }
    *ids = e.ids;
    *n_ids = e.n;
    return DI_OK;
}

/* ---------------------------------------------------------- public API */

di_status di_tokenizer_load(const char *path, di_tokenizer **out) {
    di_err err = {0};
    if (!path || !out) return di_err_publish_msg(DI_ERR_INVALID_ARG, "tokenizer: NULL argument");
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    di_status rc = di_file_read(path, 0, &buf, &len, &err);
    if (!rc) {
        rc = di_tokenizer_parse(buf, len, path, out, &err);
        free(buf);
    }
    return rc ? di_err_publish(&err) : DI_OK;
}

di_status di_tokenizer_load_memory(const char *json, size_t len, di_tokenizer **out) {
    di_err err = {0};
    if (!json || !out) return di_err_publish_msg(DI_ERR_INVALID_ARG, "tokenizer: NULL argument");
    di_status rc = di_tokenizer_parse(json, len, "tokenizer.json", out, &err);
    return rc ? di_err_publish(&err) : DI_OK;
}

void di_tokenizer_free(di_tokenizer *t) {
    if (!t) return;
    free(t->flags);
    free(t->str_off);
    free(t->strs);
    free(t->bytes_off);
    free(t->bytes);
    free(t->str_index);
    di_bpe_free(&t->bpe);
    trie_free(&t->added[0]);
    trie_free(&t->added[1]);
    free(t);
}

size_t di_tokenizer_vocab_size(const di_tokenizer *t) { return t ? t->n_ids : 0; }

di_status di_tokenizer_encode(const di_tokenizer *t, const char *text, size_t len, unsigned flags,
                              int32_t **ids, size_t *n_ids) {
    di_err err = {0};
    if (!t || (!text && len) || !ids || !n_ids)
        return di_err_publish_msg(DI_ERR_INVALID_ARG, "tokenizer encode: NULL argument");
    if (flags & ~(unsigned)DI_TOKENIZE_PARSE_SPECIAL)
        return di_err_publish_msg(DI_ERR_INVALID_ARG, "tokenizer encode: unknown flags");
    di_status rc = tokenizer_encode(t, (const uint8_t *)(text ? text : ""), len, flags, ids,
                                    n_ids, &err);
    return rc ? di_err_publish(&err) : DI_OK;
}

static di_status check_id(const di_tokenizer *t, int32_t id, size_t pos, di_err *err) {
    if (id < 0 || (size_t)id >= t->n_ids)
        return di_err_set(err, DI_ERR_INVALID_ARG,
                          "token id %d at position %zu is outside the vocabulary [0, %zu)", id,
                          pos, t->n_ids);
    if (!(t->flags[id] & DI_TOK_PRESENT))
        return di_err_set(err, DI_ERR_INVALID_ARG, "token id %d at position %zu names no token",
                          id, pos);
    return DI_OK;
}

di_status di_tokenizer_decode(const di_tokenizer *t, const int32_t *ids, size_t n, char **text,
                              size_t *len) {
    di_err err = {0};
    if (!t || (!ids && n) || !text || !len)
        return di_err_publish_msg(DI_ERR_INVALID_ARG, "tokenizer decode: NULL argument");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (check_id(t, ids[i], i, &err)) return di_err_publish(&err);
        total += t->bytes_off[ids[i] + 1] - t->bytes_off[ids[i]] - 1;
    }
    char *out = malloc(total + 1);
    if (!out) return di_err_publish_msg(DI_ERR_NOMEM, "tokenizer decode: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t m = t->bytes_off[ids[i] + 1] - t->bytes_off[ids[i]] - 1;
        memcpy(out + k, t->bytes + t->bytes_off[ids[i]], m);
        k += m;
    }
    out[k] = '\0';
    *text = out;
    *len = k;
    return DI_OK;
}

di_status di_tokenizer_token_bytes(const di_tokenizer *t, int32_t id, const char **bytes,
                                   size_t *len) {
    di_err err = {0};
    if (!t || !bytes || !len)
        return di_err_publish_msg(DI_ERR_INVALID_ARG, "token bytes: NULL argument");
    if (check_id(t, id, 0, &err)) return di_err_publish(&err);
    *bytes = (const char *)t->bytes + t->bytes_off[id];
    *len = t->bytes_off[id + 1] - t->bytes_off[id] - 1;
    return DI_OK;
}

di_status di_tokenizer_token_id(const di_tokenizer *t, const char *spelling, int32_t *id) {
    di_err err = {0};
    if (!t || !spelling || !id)
        return di_err_publish_msg(DI_ERR_INVALID_ARG, "token id: NULL argument");
    *id = di_tokenizer_lookup(t, spelling, strlen(spelling));
    if (*id < 0) {
        di_err_set(&err, DI_ERR_NOT_FOUND, "token \"%.200s\" is not in the vocabulary", spelling);
        return di_err_publish(&err);
    }
    return DI_OK;
}

int di_tokenizer_is_special(const di_tokenizer *t, int32_t id) {
    return t && id >= 0 && (size_t)id < t->n_ids && (t->flags[id] & DI_TOK_SPECIAL);
}
