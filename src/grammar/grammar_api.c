/* Public constraint API: options, compile dispatch to the front ends, the
 * choice list. Spec: ecosystem.md §1.4. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/regex.h"

void di_grammar_options_default(di_grammar_options *o) {
    memset(o, 0, sizeof *o);
    o->whitespace = DI_WS_FLEXIBLE;
    o->max_whitespace = 16;
    o->max_rules = 200000;
    o->max_depth = 64;
    o->max_lexer_states = 500000;
    o->max_repeat = 4096;
    o->max_compile_ms = 10000;
}

void di_text_position(const char *text, size_t len, size_t pos, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t i = 0; i < pos && i < len; i++) {
        if (text[i] == '\n') { l++; c = 1; }
        else if (((unsigned char)text[i] & 0xC0) != 0x80) c++;
    }
    *line = l;
    *col = c;
}

static di_status choices_build(di_cfg *g, const char *text, size_t len, uint32_t *root, di_err *err) {
    cJSON *arr = cJSON_ParseWithLength(text, len);
    if (!arr || !cJSON_IsArray(arr)) {
        cJSON_Delete(arr);
        return di_err_set(err, DI_ERR_FORMAT, "choices: expected a JSON array of strings");
    }
    int32_t nt = di_cfg_nt(g, err);
    di_status st = nt < 0 ? (err ? err->code : DI_ERR_LIMIT) : DI_OK;
    int i = 0;
    for (cJSON *c = arr->child; c && !st; c = c->next, i++) {
        if (!cJSON_IsString(c)) { st = di_err_set(err, DI_ERR_FORMAT, "choices: element %d is not a string", i); break; }
        size_t n = strlen(c->valuestring);
        di_sym s;
        st = di_cfg_literal_sym(g, c->valuestring, n, &s, err);
        if (!st) st = di_cfg_rule_add(g, (uint32_t)nt, &s, 1, err);
    }
    cJSON_Delete(arr);
    if (!st && i == 0) st = di_err_set(err, DI_ERR_INVALID_ARG, "choices: the list is empty");
    if (!st) *root = (uint32_t)nt;
    return st;
}

static di_status regex_build(di_cfg *g, const char *text, size_t len, uint32_t *root, di_err *err) {
    char *pat = malloc(len + 1);
    if (!pat) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    memcpy(pat, text, len);
    pat[len] = '\0';
    if (strlen(pat) != len) {
        free(pat);
        return di_err_set(err, DI_ERR_FORMAT, "regex: NUL byte in the pattern (write \\x00)");
    }
    di_sym s;
    di_status st = di_cfg_regex_sym(g, pat, 0, &s, err);
    free(pat);
    if (st) return st;
    int32_t nt = di_cfg_nt(g, err);
    if (nt < 0) return err->code;
    st = di_cfg_rule_add(g, (uint32_t)nt, &s, 1, err);
    *root = (uint32_t)nt;
    return st;
}

DI_API di_status di_grammar_compile(const di_vocab *vocab, di_constraint_kind kind, const char *text,
                                    size_t len, const di_grammar_options *opts, di_grammar **out) {
    di_err err = {0};
    if (!vocab || !out || (!text && kind != DI_CONSTRAINT_JSON_OBJECT)) {
        di_err_set(&err, DI_ERR_INVALID_ARG, "di_grammar_compile: NULL argument");
        return di_err_publish(&err);
    }
    *out = NULL;
    di_grammar_options o;
    if (opts) o = *opts;
    else di_grammar_options_default(&o);
    if (o.max_whitespace > 1024 || o.max_rules == 0 || o.max_depth == 0 || o.max_lexer_states == 0) {
        di_err_set(&err, DI_ERR_INVALID_ARG, "grammar options out of range (max_whitespace <= 1024, limits > 0)");
        return di_err_publish(&err);
    }
    di_grammar *g = calloc(1, sizeof *g);
    if (!g) {
        di_err_set(&err, DI_ERR_NOMEM, "out of memory");
        return di_err_publish(&err);
    }
    g->vocab = vocab;
    g->opts = o;
    g->json_keys = kind == DI_CONSTRAINT_JSON_SCHEMA || kind == DI_CONSTRAINT_JSON_OBJECT;
    di_mask_cache_init(&g->cache, (size_t)64 << 20);
    uint32_t max_tok = 1;
    for (uint32_t i = 0; i < vocab->n_vocab; i++)
        if (vocab->off[i + 1] - vocab->off[i] > max_tok) max_tok = vocab->off[i + 1] - vocab->off[i];
    di_cfg_limits lim = {o.max_rules, o.max_rules * 16u, o.max_lexer_states, o.max_depth, o.max_compile_ms, max_tok};
    di_cfg_init(&g->cfg, &lim);
    uint32_t root = 0;
    di_status st;
    switch (kind) {
    case DI_CONSTRAINT_JSON_SCHEMA: st = di_json_schema_build(&g->cfg, text, len, &o, &root, &err); break;
    case DI_CONSTRAINT_REGEX: st = regex_build(&g->cfg, text, len, &root, &err); break;
    case DI_CONSTRAINT_EBNF: st = di_ebnf_build(&g->cfg, text, len, &root, &err); break;
    case DI_CONSTRAINT_CHOICE: st = choices_build(&g->cfg, text, len, &root, &err); break;
    case DI_CONSTRAINT_JSON_OBJECT: st = di_json_any_object_build(&g->cfg, &o, &root, &err); break;
    default: st = di_err_set(&err, DI_ERR_INVALID_ARG, "unknown constraint kind %d", (int)kind);
    }
    if (!st) st = di_cfg_finalize(&g->cfg, root, &err);
    if (st) {
        di_grammar_free(g);
        return di_err_publish(&err);
    }
    *out = g;
    return DI_OK;
}

DI_API void di_grammar_free(di_grammar *g) {
    if (!g) return;
    di_mask_cache_free(&g->cache);
    di_cfg_free(&g->cfg);
    free(g);
}
