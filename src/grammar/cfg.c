/* Grammar IR builder and finalization. Spec: ecosystem.md §1.4. */
#include "grammar/cfg.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/regex.h"

double di_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void di_cfg_init(di_cfg *g, const di_cfg_limits *limits) {
    memset(g, 0, sizeof *g);
    g->limits = *limits;
    g->t0_ms = di_now_ms();
}

void di_cfg_free(di_cfg *g) {
    for (uint32_t i = 0; i < g->n_terms; i++) {
        di_dfa_free(&g->terms[i].dfa);
        free(g->terms[i].key);
        free(g->terms[i].proxy_state);
        free(g->terms[i].proxy_room);
    }
    free(g->terms);
    free(g->rules);
    free(g->rhs);
    free(g->nt_rule_off);
    free(g->nt_rules);
    free(g->nullable);
    memset(g, 0, sizeof *g);
}

di_status di_cfg_check_time(di_cfg *g, di_err *err) {
    if (g->limits.max_compile_ms > 0 && di_now_ms() - g->t0_ms > g->limits.max_compile_ms)
        return di_err_set(err, DI_ERR_LIMIT, "compile time exceeds the limit of %.0f ms", g->limits.max_compile_ms);
    return DI_OK;
}

int32_t di_cfg_nt(di_cfg *g, di_err *err) {
    if (g->n_nts >= g->limits.max_rules) {
        di_err_set(err, DI_ERR_LIMIT, "grammar exceeds %u nonterminals", g->limits.max_rules);
        return -1;
    }
    return (int32_t)g->n_nts++;
}

di_status di_cfg_rule_add(di_cfg *g, uint32_t lhs, const di_sym *syms, uint32_t n, di_err *err) {
    if (g->n_rules >= g->limits.max_rules)
        return di_err_set(err, DI_ERR_LIMIT, "grammar exceeds %u rules", g->limits.max_rules);
    if ((uint64_t)g->n_rhs + n > g->limits.max_symbols)
        return di_err_set(err, DI_ERR_LIMIT, "grammar exceeds %u symbols", g->limits.max_symbols);
    if (g->n_rules == g->cap_rules) {
        uint32_t cap = g->cap_rules ? g->cap_rules * 2 : 64;
        di_cfg_rule *r = realloc(g->rules, cap * sizeof *r);
        if (!r) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
        g->rules = r;
        g->cap_rules = cap;
    }
    if (g->n_rhs + n > g->cap_rhs) {
        uint32_t cap = g->cap_rhs ? g->cap_rhs * 2 : 256;
        while (cap < g->n_rhs + n) cap *= 2;
        di_sym *s = realloc(g->rhs, cap * sizeof *s);
        if (!s) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
        g->rhs = s;
        g->cap_rhs = cap;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (syms[i] >= 0 && (uint32_t)syms[i] >= g->n_nts)
            return di_err_set(err, DI_ERR_INTERNAL, "rule refers to unknown nonterminal %d", syms[i]);
        if (syms[i] < 0 && DI_SYM_TERM_ID(syms[i]) >= g->n_terms)
            return di_err_set(err, DI_ERR_INTERNAL, "rule refers to unknown terminal");
    }
    g->rules[g->n_rules].lhs = lhs;
    g->rules[g->n_rules].off = g->n_rhs;
    g->rules[g->n_rules].len = n;
    if (n) memcpy(g->rhs + g->n_rhs, syms, n * sizeof *syms);
    g->n_rhs += n;
    g->n_rules++;
    return DI_OK;
}

static di_status term_add(di_cfg *g, di_dfa *dfa, const char *key, uint32_t *out, di_err *err) {
    if (g->lexer_states + dfa->n_states > g->limits.max_lexer_states) {
        di_dfa_free(dfa);
        return di_err_set(err, DI_ERR_LIMIT, "lexer states exceed the limit of %u", g->limits.max_lexer_states);
    }
    if (g->n_terms == g->cap_terms) {
        uint32_t cap = g->cap_terms ? g->cap_terms * 2 : 32;
        di_cfg_term *t = realloc(g->terms, cap * sizeof *t);
        if (!t) { di_dfa_free(dfa); return di_err_set(err, DI_ERR_NOMEM, "out of memory"); }
        g->terms = t;
        g->cap_terms = cap;
    }
    di_cfg_term *t = &g->terms[g->n_terms];
    t->dfa = *dfa;
    memset(dfa, 0, sizeof *dfa);
    t->key = key ? strdup(key) : NULL;
    t->proxy = -1;
    t->proxy_state = NULL;
    t->proxy_room = NULL;
    g->lexer_states += t->dfa.n_states;
    *out = g->n_terms++;
    return DI_OK;
}

di_status di_cfg_dfa_sym(di_cfg *g, di_dfa *dfa, const char *key, di_sym *out, di_err *err) {
    if (di_dfa_is_empty(dfa)) {
        di_dfa_free(dfa);
        int32_t nt = di_cfg_nt(g, err);
        if (nt < 0) return err ? err->code : DI_ERR_LIMIT;
        *out = nt; /* no rules: unproductive */
        return DI_OK;
    }
    int nullable = dfa->accept[dfa->start];
    di_status st = di_dfa_drop_empty(dfa, err);
    if (st) { di_dfa_free(dfa); return st; }
    if (!nullable) {
        uint32_t t;
        st = term_add(g, dfa, key, &t, err);
        if (st) return st;
        *out = DI_SYM_TERM(t);
        return DI_OK;
    }
    int32_t nt = di_cfg_nt(g, err);
    if (nt < 0) { di_dfa_free(dfa); return err ? err->code : DI_ERR_LIMIT; }
    st = di_cfg_rule_add(g, (uint32_t)nt, NULL, 0, err);
    if (st) { di_dfa_free(dfa); return st; }
    if (!di_dfa_is_empty(dfa)) {
        uint32_t t;
        st = term_add(g, dfa, key, &t, err);
        if (st) return st;
        di_sym s = DI_SYM_TERM(t);
        st = di_cfg_rule_add(g, (uint32_t)nt, &s, 1, err);
        if (st) return st;
    } else di_dfa_free(dfa);
    *out = nt;
    return DI_OK;
}

di_status di_cfg_regex_sym(di_cfg *g, const char *pattern, unsigned flags, di_sym *out, di_err *err) {
    size_t pl = strlen(pattern);
    char *key = malloc(pl + 4);
    if (!key) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    key[0] = (char)('0' + (flags & 7));
    key[1] = ':';
    memcpy(key + 2, pattern, pl + 1);
    /* Interned: the same lexeme (e.g. whitespace + comma) is one terminal. */
    for (uint32_t i = 0; i < g->n_terms; i++)
        if (g->terms[i].key && !strcmp(g->terms[i].key, key)) {
            free(key);
            *out = DI_SYM_TERM(i);
            return DI_OK;
        }
    di_dfa d;
    uint32_t room = g->limits.max_lexer_states > g->lexer_states ? (uint32_t)(g->limits.max_lexer_states - g->lexer_states) : 1;
    di_status st = di_regex_compile(pattern, pl, flags, room, &d, err);
    if (st) { free(key); return st; }
    st = di_cfg_dfa_sym(g, &d, key, out, err);
    free(key);
    return st;
}

int32_t di_cfg_find_term(const di_cfg *g, const char *key) {
    for (uint32_t i = 0; i < g->n_terms; i++)
        if (g->terms[i].key && !strcmp(g->terms[i].key, key)) return (int32_t)i;
    return -1;
}

di_status di_cfg_literal_sym(di_cfg *g, const char *s, size_t n, di_sym *out, di_err *err) {
    size_t need = di_regex_escape(s, n, NULL, 0) + 1;
    char *buf = malloc(need);
    if (!buf) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    di_regex_escape(s, n, buf, need);
    di_status st = di_cfg_regex_sym(g, buf, 0, out, err);
    free(buf);
    return st;
}

di_status di_cfg_set_proxy(di_cfg *g, uint32_t t, uint32_t proxy, int count_byte, di_err *err) {
    const di_dfa *a = &g->terms[t].dfa, *p = &g->terms[proxy].dfa;
    uint32_t *map = malloc(((size_t)a->n_states + 1) * sizeof *map);
    uint32_t *queue = malloc(((size_t)a->n_states + 1) * sizeof *queue);
    if (!map || !queue) { free(map); free(queue); return di_err_set(err, DI_ERR_NOMEM, "out of memory"); }
    for (uint32_t i = 0; i < a->n_states; i++) map[i] = UINT32_MAX;
    map[0] = 0;
    /* one representative byte per pair of byte classes */
    uint8_t rep[256];
    uint32_t n_rep = 0;
    {
        uint8_t seen[256][256 / 8];
        memset(seen, 0, sizeof seen);
        for (int b = 0; b < 256; b++) {
            uint8_t ca = a->byte_class[b], cp = p->byte_class[b];
            if (seen[ca][cp >> 3] & (1u << (cp & 7))) continue;
            seen[ca][cp >> 3] |= (uint8_t)(1u << (cp & 7));
            rep[n_rep++] = (uint8_t)b;
        }
    }
    uint32_t qh = 0, qt = 0;
    if (a->start) { map[a->start] = p->start; queue[qt++] = a->start; }
    int ok = 1;
    while (qh < qt && ok) {
        uint32_t s = queue[qh++];
        for (uint32_t k = 0; k < n_rep; k++) {
            uint8_t b = rep[k];
            uint32_t s2 = di_dfa_step(a, s, b);
            if (!s2) continue;
            uint32_t p2 = di_dfa_step(p, map[s], b);
            if (!p2) { ok = 0; break; } /* not a sub-automaton: no proxy */
            if (map[s2] == UINT32_MAX) { map[s2] = p2; queue[qt++] = s2; }
            else if (map[s2] != p2) { ok = 0; break; }
        }
    }
    free(queue);
    if (!ok) { free(map); return DI_OK; }
    for (uint32_t i = 0; i < a->n_states; i++) if (map[i] == UINT32_MAX) map[i] = 0;
    if (count_byte >= 0) {
        /* room[s]: how many count_byte steps s can still take (capped);
         * states are numbered in BFS order from the start, so resolve by
         * following the chain with memoisation */
        uint32_t need = g->limits.max_token_bytes + 1;
        uint32_t *room = malloc(((size_t)a->n_states + 1) * sizeof *room);
        if (!room) { free(map); return di_err_set(err, DI_ERR_NOMEM, "out of memory"); }
        for (uint32_t i = 0; i < a->n_states; i++) room[i] = UINT32_MAX;
        room[0] = 0;
        for (uint32_t i = 1; i < a->n_states; i++) {
            if (room[i] != UINT32_MAX) continue;
            /* walk the chain until a known state, then fill back */
            uint32_t len = 0, s = i;
            while (s && room[s] == UINT32_MAX && len <= a->n_states) { len++; s = di_dfa_step(a, s, (uint8_t)count_byte); }
            int dead_end = s == 0;
            /* stopped on an unvisited live state (a cycle): only len - k
             * steps are known from x_k (a lower bound, which is safe) */
            uint32_t base = dead_end ? 0 : (room[s] == UINT32_MAX ? 0 : room[s]);
            s = i;
            for (uint32_t k = 0; k < len; k++) {
                /* chain x_0..x_len: steps from x_k */
                uint32_t r = dead_end ? len - 1 - k : base + (len - k);
                room[s] = r > need ? need : r;
                s = di_dfa_step(a, s, (uint8_t)count_byte);
            }
        }
        free(g->terms[t].proxy_room);
        g->terms[t].proxy_room = room;
    } else {
        free(g->terms[t].proxy_room);
        g->terms[t].proxy_room = NULL;
    }
    free(g->terms[t].proxy_state);
    g->terms[t].proxy_state = map;
    g->terms[t].proxy = (int32_t)proxy;
    return DI_OK;
}

di_status di_cfg_finalize(di_cfg *g, uint32_t root, di_err *err) {
    /* augmented start S' → root */
    int32_t sp = di_cfg_nt(g, err);
    if (sp < 0) return err ? err->code : DI_ERR_LIMIT;
    di_sym r = (di_sym)root;
    di_status st = di_cfg_rule_add(g, (uint32_t)sp, &r, 1, err);
    if (st) return st;
    g->root = root;
    uint32_t n = g->n_nts;
    uint8_t *prod = calloc(n, 1);
    uint8_t *keep = calloc(g->n_rules, 1);
    g->nullable = calloc(n, 1);
    if (!prod || !keep || !g->nullable) { free(prod); free(keep); return di_err_set(err, DI_ERR_NOMEM, "out of memory"); }
    /* Productive nonterminals and nullable ones: fixed points. */
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t i = 0; i < g->n_rules; i++) {
            const di_cfg_rule *ru = &g->rules[i];
            int ok = 1, nul = 1;
            for (uint32_t k = 0; k < ru->len; k++) {
                di_sym s = g->rhs[ru->off + k];
                if (DI_SYM_IS_TERM(s)) nul = 0;
                else {
                    if (!prod[s]) ok = 0;
                    if (!g->nullable[s]) nul = 0;
                }
            }
            if (ok && !prod[ru->lhs]) { prod[ru->lhs] = 1; changed = 1; }
            if (nul && !g->nullable[ru->lhs]) { g->nullable[ru->lhs] = 1; changed = 1; }
        }
    }
    if (!prod[root]) {
        free(prod); free(keep);
        return di_err_set(err, DI_ERR_INVALID_ARG, "the constraint admits no output at all");
    }
    for (uint32_t i = 0; i < g->n_rules; i++) {
        const di_cfg_rule *ru = &g->rules[i];
        int ok = prod[ru->lhs];
        for (uint32_t k = 0; k < ru->len && ok; k++) {
            di_sym s = g->rhs[ru->off + k];
            if (!DI_SYM_IS_TERM(s) && !prod[s]) ok = 0;
        }
        keep[i] = (uint8_t)ok;
    }
    g->nt_rule_off = calloc((size_t)n + 1, sizeof *g->nt_rule_off);
    g->nt_rules = malloc(((size_t)g->n_rules + 1) * sizeof *g->nt_rules);
    if (!g->nt_rule_off || !g->nt_rules) { free(prod); free(keep); return di_err_set(err, DI_ERR_NOMEM, "out of memory"); }
    for (uint32_t i = 0; i < g->n_rules; i++)
        if (keep[i]) g->nt_rule_off[g->rules[i].lhs + 1]++;
    for (uint32_t i = 0; i < n; i++) g->nt_rule_off[i + 1] += g->nt_rule_off[i];
    uint32_t *fill = calloc(n, sizeof *fill);
    if (!fill) { free(prod); free(keep); return di_err_set(err, DI_ERR_NOMEM, "out of memory"); }
    for (uint32_t i = 0; i < g->n_rules; i++)
        if (keep[i]) {
            uint32_t l = g->rules[i].lhs;
            g->nt_rules[g->nt_rule_off[l] + fill[l]++] = i;
        }
    g->start_rule = g->n_rules - 1;
    free(fill);
    free(prod);
    free(keep);
    return DI_OK;
}
