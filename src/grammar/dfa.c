/* Byte automata: Thompson NFA → DFA by subset construction, products and
 * trimming. Spec: ecosystem.md §1.4. */
#include "grammar/dfa.h"

#include <stdlib.h>
#include <string.h>

#include "grammar/grow.h"

void di_nfa_init(di_nfa *nfa, uint32_t max_states) {
    memset(nfa, 0, sizeof *nfa);
    nfa->max_states = max_states;
    nfa->start = DI_NFA_NONE;
}

void di_nfa_free(di_nfa *nfa) {
    free(nfa->states);
    memset(nfa, 0, sizeof *nfa);
}

uint32_t di_nfa_add(di_nfa *nfa, uint8_t kind, uint8_t lo, uint8_t hi, uint32_t out, uint32_t out2) {
    if (nfa->n >= nfa->max_states) return DI_NFA_NONE;
    if (nfa->n == nfa->cap) {
        uint32_t cap = nfa->cap ? nfa->cap * 2 : 64;
        di_nfa_state *s = realloc(nfa->states, (size_t)cap * sizeof *s);
        if (!s) return DI_NFA_NONE;
        nfa->states = s;
        nfa->cap = cap;
    }
    di_nfa_state *s = &nfa->states[nfa->n];
    s->kind = kind;
    s->lo = lo;
    s->hi = hi;
    s->out = out;
    s->out2 = out2;
    s->universal = 0;
    return nfa->n++;
}

void di_dfa_free(di_dfa *d) {
    free(d->trans);
    free(d->accept);
    memset(d, 0, sizeof *d);
}

/* ------------------------------------------------------ key interning */

static uint64_t key_hash(const uint32_t *k, size_t n) {
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++) h = (h ^ k[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

void di_key_table_free(di_key_table *t) {
    free(t->pool);
    free(t->off);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

static int kt_grow_slots(di_key_table *t) {
    uint32_t ns = t->n_slots ? t->n_slots * 2 : 1024;
    uint32_t *slots = calloc(ns, sizeof *slots);
    if (!slots) return -1;
    for (uint32_t id = 0; id < t->n; id++) {
        const uint32_t *k = t->pool + t->off[id];
        size_t kn = t->off[id + 1] - t->off[id];
        uint32_t h = (uint32_t)key_hash(k, kn) & (ns - 1);
        while (slots[h]) h = (h + 1) & (ns - 1);
        slots[h] = id + 1;
    }
    free(t->slots);
    t->slots = slots;
    t->n_slots = ns;
    return 0;
}

uint32_t di_key_table_intern(di_key_table *t, const uint32_t *k, size_t kn, int *fresh) {
    *fresh = 0;
    if ((t->n + 1) * 2 > t->n_slots && kt_grow_slots(t)) return UINT32_MAX;
    uint32_t h = (uint32_t)key_hash(k, kn) & (t->n_slots - 1);
    while (t->slots[h]) {
        uint32_t id = t->slots[h] - 1;
        size_t n2 = t->off[id + 1] - t->off[id];
        if (n2 == kn && (kn == 0 || !memcmp(t->pool + t->off[id], k, kn * sizeof *k))) return id;
        h = (h + 1) & (t->n_slots - 1);
    }
    if (t->pool_n + kn > t->pool_cap) {
        size_t cap = t->pool_cap ? t->pool_cap * 2 : 4096;
        while (cap < t->pool_n + kn) cap *= 2;
        uint32_t *p = realloc(t->pool, cap * sizeof *p);
        if (!p) return UINT32_MAX;
        t->pool = p;
        t->pool_cap = cap;
    }
    if (t->n + 2 > t->cap_ids) {
        uint32_t cap = t->cap_ids ? t->cap_ids * 2 : 256;
        size_t *o = realloc(t->off, (size_t)cap * sizeof *o);
        if (!o) return UINT32_MAX;
        t->off = o;
        t->cap_ids = cap;
    }
    if (t->n == 0) t->off[0] = 0;
    if (kn) memcpy(t->pool + t->pool_n, k, kn * sizeof *k);
    t->pool_n += kn;
    t->off[t->n + 1] = t->pool_n;
    t->slots[h] = t->n + 1;
    *fresh = 1;
    return t->n++;
}

/* ------------------------------------------------------ growable DFA */

typedef struct dfa_build {
    uint32_t *trans;
    uint8_t *accept;
    uint32_t n, cap, nc;
} dfa_build;

static int db_add(dfa_build *b) {
    if (b->n == b->cap) {
        uint32_t cap = b->cap ? b->cap * 2 : 64;
        uint32_t *t = realloc(b->trans, (size_t)cap * b->nc * sizeof *t);
        if (!t) return -1;
        b->trans = t;
        uint8_t *a = realloc(b->accept, cap);
        if (!a) return -1;
        b->accept = a;
        b->cap = cap;
    }
    memset(b->trans + (size_t)b->n * b->nc, 0, b->nc * sizeof *b->trans);
    b->accept[b->n] = 0;
    b->n++;
    return 0;
}

/* Removes states that cannot reach acceptance (and the unreachable ones)
 * and renumbers, keeping 0 as the dead state. Takes ownership of b. */
static di_status dfa_trim(dfa_build *b, uint32_t start, const uint8_t *byte_class, di_dfa *out,
                          di_err *err) {
    uint32_t n = b->n, nc = b->nc;
    uint8_t *live = calloc(n, 1);
    uint32_t *indeg = calloc((size_t)n + 1, sizeof *indeg);
    uint32_t *radj = malloc(((size_t)n * nc + 1) * sizeof *radj);
    uint32_t *queue = malloc(((size_t)n + 1) * sizeof *queue);
    uint32_t *newid = malloc(((size_t)n + 1) * sizeof *newid);
    if (!live || !indeg || !radj || !queue || !newid) {
        free(live); free(indeg); free(radj); free(queue); free(newid);
        free(b->trans); free(b->accept);
        return di_err_set(err, DI_ERR_NOMEM, "out of memory trimming an automaton");
    }
    /* Reverse edges in CSR form. */
    for (size_t i = 0; i < (size_t)n * nc; i++) indeg[b->trans[i]]++;
    uint32_t acc = 0;
    for (uint32_t s = 0; s < n; s++) {
        uint32_t c = indeg[s];
        indeg[s] = acc;
        acc += c;
    }
    indeg[n] = acc;
    uint32_t *fill = newid; /* reuse as cursor */
    for (uint32_t s = 0; s < n; s++) fill[s] = indeg[s];
    for (uint32_t s = 0; s < n; s++)
        for (uint32_t c = 0; c < nc; c++) radj[fill[b->trans[(size_t)s * nc + c]]++] = s;
    uint32_t qh = 0, qt = 0;
    for (uint32_t s = 1; s < n; s++)
        if (b->accept[s]) { live[s] = 1; queue[qt++] = s; }
    while (qh < qt) {
        uint32_t t = queue[qh++];
        for (uint32_t i = indeg[t]; i < indeg[t + 1]; i++) {
            uint32_t s = radj[i];
            if (s && !live[s]) { live[s] = 1; queue[qt++] = s; }
        }
    }
    /* Forward reachability from start over live states, renumbering. */
    for (uint32_t s = 0; s < n; s++) newid[s] = 0;
    uint32_t m = 1;
    qh = qt = 0;
    if (start && live[start]) { newid[start] = m++; queue[qt++] = start; }
    while (qh < qt) {
        uint32_t s = queue[qh++];
        for (uint32_t c = 0; c < nc; c++) {
            uint32_t t = b->trans[(size_t)s * nc + c];
            if (t && live[t] && !newid[t]) { newid[t] = m++; queue[qt++] = t; }
        }
    }
    memset(out, 0, sizeof *out);
    out->n_states = m;
    out->n_classes = nc;
    memcpy(out->byte_class, byte_class, 256);
    out->trans = calloc((size_t)m * nc, sizeof *out->trans);
    out->accept = calloc(m, 1);
    di_status st = DI_OK;
    if (!out->trans || !out->accept) {
        st = di_err_set(err, DI_ERR_NOMEM, "out of memory building an automaton");
        di_dfa_free(out);
    } else {
        for (uint32_t i = 0; i < qt; i++) {
            uint32_t s = queue[i], ns = newid[s];
            out->accept[ns] = b->accept[s];
            for (uint32_t c = 0; c < nc; c++) {
                uint32_t t = b->trans[(size_t)s * nc + c];
                out->trans[(size_t)ns * nc + c] = (t && live[t]) ? newid[t] : 0;
            }
        }
        out->start = (start && live[start]) ? 1 : 0;
    }
    free(live); free(indeg); free(radj); free(queue); free(newid);
    free(b->trans); free(b->accept);
    return st;
}

/* ------------------------------------------------- subset construction */

typedef struct closure_ctx {
    const di_nfa *nfa;
    uint32_t *mark;    /* [nfa->n] stamp */
    uint32_t stamp;
    uint32_t *stack;   /* [nfa->n] */
    uint32_t *set;     /* [nfa->n] result (kept states: RANGE and MATCH) */
    uint32_t set_n;
    uint64_t visited;  /* states visited, epsilon ones included, and sorting (work count) */
} closure_ctx;

static void closure_add(closure_ctx *c, uint32_t s) {
    uint32_t sp = 0;
    if (s == DI_NFA_NONE || c->mark[s] == c->stamp) return;
    c->mark[s] = c->stamp;
    c->stack[sp++] = s;
    while (sp) {
        uint32_t x = c->stack[--sp];
        c->visited++;
        const di_nfa_state *st = &c->nfa->states[x];
        if (st->kind != DI_NFA_EPS) {
            c->set[c->set_n++] = x;
            continue;
        }
        uint32_t outs[2] = {st->out, st->out2};
        for (int i = 1; i >= 0; i--) {
            uint32_t y = outs[i];
            if (y != DI_NFA_NONE && c->mark[y] != c->stamp) {
                c->mark[y] = c->stamp;
                c->stack[sp++] = y;
            }
        }
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts c->set and, when it holds the whole closure of a universal state
 * (ucl, sorted, n_ucl entries), reduces it to that closure: the set's
 * language is then exactly the universal state's. */
static void closure_finish(closure_ctx *c, const uint32_t *ucl, uint32_t n_ucl) {
    qsort(c->set, c->set_n, sizeof *c->set, cmp_u32);
    /* the sort counts as n log n steps */
    uint32_t lg = 0;
    while (lg < 32 && (c->set_n >> lg) > 1) lg++;
    c->visited += (uint64_t)c->set_n * lg;
    if (!n_ucl || c->set_n <= n_ucl) return;
    uint32_t i = 0, k = 0;
    while (i < c->set_n && k < n_ucl) {
        if (c->set[i] == ucl[k]) { i++; k++; }
        else if (c->set[i] < ucl[k]) i++;
        else return;
    }
    if (k < n_ucl) return;
    memcpy(c->set, ucl, n_ucl * sizeof *ucl);
    c->set_n = n_ucl;
}

/* Steps taken so far (see DI_DFA_MAX_WORK): states visited by closures,
 * subsets interned, table cells allocated and moves bucketed. */
static uint64_t subset_work(const closure_ctx *c, const di_key_table *tab, uint32_t nc, uint64_t moves) {
    return c->visited + tab->pool_n + (uint64_t)tab->n * nc + moves;
}

static di_status too_complex(di_err *err, uint64_t max_work, uint32_t states) {
    return di_err_set(err, DI_ERR_LIMIT, "pattern too complex: building its automaton takes more than %llu steps (%u states so far)",
                      (unsigned long long)max_work, states);
}

di_status di_dfa_from_nfa(const di_nfa *nfa, uint32_t max_states, uint64_t max_work, di_dfa *out, di_err *err) {
    memset(out, 0, sizeof *out);
    uint8_t boundary[257] = {0};
    for (uint32_t i = 0; i < nfa->n; i++)
        if (nfa->states[i].kind == DI_NFA_RANGE) {
            boundary[nfa->states[i].lo] = 1;
            boundary[nfa->states[i].hi + 1] = 1;
        }
    uint8_t byte_class[256];
    uint32_t nc = 0;
    for (int b = 1; b < 256; b++) {
        if (boundary[b]) nc++;
        byte_class[b] = (uint8_t)nc;
    }
    byte_class[0] = 0;
    nc++;
    closure_ctx c = {nfa, calloc(nfa->n + 1, sizeof(uint32_t)), 0,
                     malloc((nfa->n + 1) * sizeof(uint32_t)), malloc((nfa->n + 1) * sizeof(uint32_t)), 0, 0};
    di_key_table tab = {0};
    dfa_build b = {0};
    b.nc = nc;
    di_status st = DI_OK;
    uint32_t *universal_of = NULL;
    uint32_t *cnt = malloc((nc + 1) * sizeof *cnt), *cur = malloc((nc + 1) * sizeof *cur), *mv = NULL, cap_mv = 0;
    di_key_table memo = {0};  /* move lists closed so far → memo_tid */
    uint32_t *memo_tid = NULL, cap_memo = 0;
    uint64_t moves = 0; /* NFA moves bucketed, over all states */
    if (max_work > DI_DFA_MAX_WORK) max_work = DI_DFA_MAX_WORK;
    if (!c.mark || !c.stack || !c.set || !cnt || !cur) { st = di_err_set(err, DI_ERR_NOMEM, "out of memory"); goto done; }
    /* Closure of the (first) universal state, if any. */
    uint32_t n_ucl = 0;
    for (uint32_t i = 0; i < nfa->n && !n_ucl; i++)
        if (nfa->states[i].universal) {
            c.stamp++;
            c.set_n = 0;
            closure_add(&c, i);
            qsort(c.set, c.set_n, sizeof *c.set, cmp_u32);
            universal_of = malloc((c.set_n + 1) * sizeof *universal_of);
            if (!universal_of) { st = di_err_set(err, DI_ERR_NOMEM, "out of memory"); goto done; }
            memcpy(universal_of, c.set, c.set_n * sizeof *c.set);
            n_ucl = c.set_n;
        }
    int fresh;
    /* id 0: the empty set (dead). */
    if (di_key_table_intern(&tab, NULL, 0, &fresh) != 0 || db_add(&b)) { st = di_err_set(err, DI_ERR_NOMEM, "out of memory"); goto done; }
    c.stamp++;
    c.set_n = 0;
    closure_add(&c, nfa->start);
    closure_finish(&c, universal_of, n_ucl);
    uint32_t start = di_key_table_intern(&tab, c.set, c.set_n, &fresh);
    if (start == UINT32_MAX || (fresh && db_add(&b))) { st = di_err_set(err, DI_ERR_NOMEM, "out of memory"); goto done; }
    for (uint32_t id = 1; id < tab.n; id++) {
        /* The state's moves bucketed by byte class in one pass over its
         * NFA states (CSR: targets of class k at mv[cnt[k]..cnt[k + 1])),
         * instead of one pass per class. */
        size_t o0 = tab.off[id], o1 = tab.off[id + 1];
        /* bucket sizes from a difference array, so that the work is known
         * before the moves are written */
        memset(cur, 0, (nc + 1) * sizeof *cur);
        for (size_t k = o0; k < o1; k++) {
            const di_nfa_state *ns = &nfa->states[tab.pool[k]];
            if (ns->kind == DI_NFA_RANGE) {
                cur[byte_class[ns->lo]]++;
                cur[byte_class[ns->hi] + 1]--;
            } else if (ns->kind == DI_NFA_MATCH) b.accept[id] = 1;
        }
        uint32_t run = 0;
        cnt[0] = 0;
        for (uint32_t k2 = 0; k2 < nc; k2++) {
            run += cur[k2];
            cnt[k2 + 1] = cnt[k2] + run;
        }
        moves += cnt[nc];
        if (subset_work(&c, &tab, nc, moves) > max_work) { st = too_complex(err, max_work, tab.n); goto done; }
        if (di_grow((void **)&mv, &cap_mv, cnt[nc], sizeof *mv)) { st = di_err_set(err, DI_ERR_NOMEM, "out of memory"); goto done; }
        memcpy(cur, cnt, nc * sizeof *cur);
        for (size_t k = o0; k < o1; k++) {
            const di_nfa_state *ns = &nfa->states[tab.pool[k]];
            if (ns->kind == DI_NFA_RANGE)
                for (uint32_t k2 = byte_class[ns->lo]; k2 <= byte_class[ns->hi]; k2++) mv[cur[k2]++] = ns->out;
        }
        uint32_t tid = 0;
        for (uint32_t cls = 0; cls < nc; cls++) {
            uint32_t m0 = cnt[cls], m1 = cnt[cls + 1];
            /* neighbouring classes often move alike (e.g. inside 80-BF) */
            int same = cls > 0 && m1 - m0 == m0 - cnt[cls - 1] &&
                       (m1 == m0 || !memcmp(mv + m0, mv + cnt[cls - 1], (m1 - m0) * sizeof *mv));
            if (same) {
                b.trans[(size_t)id * nc + cls] = tid;
                continue;
            }
            /* Equal move lists have equal closures: each distinct list is
             * closed once (in a UTF-8 class most lists are one NFA state,
             * and a search's "anything" loop recurs in every state). */
            tid = 0;
            if (m1 > m0) {
                uint32_t key = di_key_table_intern(&memo, mv + m0, m1 - m0, &fresh);
                if (key == UINT32_MAX || (fresh && di_grow((void **)&memo_tid, &cap_memo, key + 1, sizeof *memo_tid))) {
                    st = di_err_set(err, DI_ERR_NOMEM, "out of memory");
                    goto done;
                }
                if (!fresh) tid = memo_tid[key];
                else {
                    c.stamp++;
                    c.set_n = 0;
                    for (uint32_t k = m0; k < m1; k++) closure_add(&c, mv[k]);
                    if (c.set_n) closure_finish(&c, universal_of, n_ucl);
                    if (subset_work(&c, &tab, nc, moves) > max_work) { st = too_complex(err, max_work, tab.n); goto done; }
                    if (c.set_n) {
                        tid = di_key_table_intern(&tab, c.set, c.set_n, &fresh);
                        if (tid == UINT32_MAX) { st = di_err_set(err, DI_ERR_NOMEM, "out of memory"); goto done; }
                        if (fresh) {
                            if (tab.n > max_states) {
                                st = di_err_set(err, DI_ERR_LIMIT, "lexer automaton exceeds %u states", max_states);
                                goto done;
                            }
                            if (db_add(&b)) { st = di_err_set(err, DI_ERR_NOMEM, "out of memory"); goto done; }
                        }
                    }
                    memo_tid[key] = tid;
                }
            }
            b.trans[(size_t)id * nc + cls] = tid;
        }
    }
    st = dfa_trim(&b, start, byte_class, out, err);
    b.trans = NULL;
    b.accept = NULL;
done:
    free(memo_tid);
    di_key_table_free(&memo);
    free(cnt);
    free(cur);
    free(mv);
    free(universal_of);
    free(b.trans);
    free(b.accept);
    free(c.mark);
    free(c.stack);
    free(c.set);
    di_key_table_free(&tab);
    return st;
}

di_status di_dfa_product(const di_dfa *a, const di_dfa *b, int diff, uint32_t max_states,
                         di_dfa *out, di_err *err) {
    memset(out, 0, sizeof *out);
    /* Joint byte classes. */
    uint32_t pair_class[256];
    uint8_t byte_class[256], rep[256];
    uint32_t nc = 0;
    for (int x = 0; x < 256; x++) {
        uint32_t key = (uint32_t)a->byte_class[x] * 256u + b->byte_class[x];
        int found = -1;
        for (uint32_t k = 0; k < nc; k++)
            if (pair_class[k] == key) { found = (int)k; break; }
        if (found < 0) { found = (int)nc; pair_class[nc] = key; rep[nc] = (uint8_t)x; nc++; }
        byte_class[x] = (uint8_t)found;
    }
    di_key_table tab = {0};
    dfa_build bd = {0};
    bd.nc = nc;
    di_status st = DI_OK;
    int fresh;
    uint32_t dead[2] = {0, 0};
    if (di_key_table_intern(&tab, dead, 2, &fresh) != 0 || db_add(&bd)) { st = di_err_set(err, DI_ERR_NOMEM, "out of memory"); goto done; }
    uint32_t sp[2] = {a->start, b->start};
    uint32_t start = 0;
    if (a->start && (diff || b->start)) {
        start = di_key_table_intern(&tab, sp, 2, &fresh);
        if (start == UINT32_MAX || db_add(&bd)) { st = di_err_set(err, DI_ERR_NOMEM, "out of memory"); goto done; }
    }
    for (uint32_t id = 1; id < tab.n; id++) {
        uint32_t sa = tab.pool[tab.off[id]], sb = tab.pool[tab.off[id] + 1];
        bd.accept[id] = a->accept[sa] && (diff ? !b->accept[sb] : b->accept[sb]);
        for (uint32_t cls = 0; cls < nc; cls++) {
            uint32_t ta = di_dfa_step(a, sa, rep[cls]);
            uint32_t tb = sb ? di_dfa_step(b, sb, rep[cls]) : 0;
            uint32_t tid = 0;
            if (ta && (diff || tb)) {
                uint32_t k[2] = {ta, tb};
                tid = di_key_table_intern(&tab, k, 2, &fresh);
                if (tid == UINT32_MAX) { st = di_err_set(err, DI_ERR_NOMEM, "out of memory"); goto done; }
                if (fresh) {
                    if (tab.n > max_states) {
                        st = di_err_set(err, DI_ERR_LIMIT, "lexer automaton exceeds %u states", max_states);
                        goto done;
                    }
                    if ((uint64_t)tab.n * nc > DI_DFA_MAX_WORK) { st = too_complex(err, DI_DFA_MAX_WORK, tab.n); goto done; }
                    if (db_add(&bd)) { st = di_err_set(err, DI_ERR_NOMEM, "out of memory"); goto done; }
                }
            }
            bd.trans[(size_t)id * nc + cls] = tid;
        }
    }
    st = dfa_trim(&bd, start, byte_class, out, err);
    bd.trans = NULL;
    bd.accept = NULL;
done:
    free(bd.trans);
    free(bd.accept);
    di_key_table_free(&tab);
    return st;
}

di_status di_dfa_count_units(const di_dfa *u, uint32_t boundary, uint32_t min, uint32_t max, uint32_t max_states,
                             di_dfa *out, di_err *err) {
    memset(out, 0, sizeof *out);
    uint32_t nu = u->n_states, nc = u->n_classes;
    uint64_t total = (uint64_t)(nu - 1) * (max + 1) + 1;
    if (total > max_states)
        return di_err_set(err, DI_ERR_LIMIT, "lexer automaton exceeds %u states", max_states);
    if (total * nc > DI_DFA_MAX_WORK) return too_complex(err, DI_DFA_MAX_WORK, (uint32_t)total);
    /* state (q, c) for q in 1..nu-1, c in 0..max -> 1 + (q - 1) * (max + 1) + c; 0 dead */
    dfa_build b = {0};
    b.nc = nc;
    b.n = (uint32_t)total;
    b.cap = b.n;
    b.trans = calloc((size_t)b.n * nc, sizeof *b.trans);
    b.accept = calloc(b.n, 1);
    if (!b.trans || !b.accept) {
        free(b.trans);
        free(b.accept);
        return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    }
    for (uint32_t q = 1; q < nu; q++)
        for (uint32_t c = 0; c <= max; c++) {
            uint32_t id = 1 + (q - 1) * (max + 1) + c;
            b.accept[id] = u->accept[q] && c >= min;
            for (uint32_t k = 0; k < nc; k++) {
                uint32_t q2 = u->trans[(size_t)q * nc + k];
                if (!q2) continue;
                /* entering the boundary from inside a unit completes one;
                 * entering it from the start (the opening byte) does not */
                uint32_t c2 = c + (q2 == boundary && q != u->start);
                if (c2 > max) continue;
                b.trans[(size_t)id * nc + k] = 1 + (q2 - 1) * (max + 1) + c2;
            }
        }
    uint32_t start = u->start ? 1 + (u->start - 1) * (max + 1) : 0;
    return dfa_trim(&b, start, u->byte_class, out, err);
}

di_status di_dfa_drop_empty(di_dfa *d, di_err *err) {
    if (!d->start || !d->accept[d->start]) return DI_OK;
    uint32_t n = d->n_states + 1, nc = d->n_classes;
    uint32_t *t = realloc(d->trans, (size_t)n * nc * sizeof *t);
    if (!t) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    d->trans = t;
    uint8_t *a = realloc(d->accept, n);
    if (!a) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    d->accept = a;
    memcpy(t + (size_t)(n - 1) * nc, t + (size_t)d->start * nc, nc * sizeof *t);
    a[n - 1] = 0;
    d->n_states = n;
    /* The copy may have no way forward (the language was just ""). */
    int any = 0;
    for (uint32_t c = 0; c < nc; c++) any |= t[(size_t)(n - 1) * nc + c] != 0;
    d->start = any ? n - 1 : 0;
    return DI_OK;
}

int di_dfa_matches(const di_dfa *d, const uint8_t *s, size_t n) {
    uint32_t st = d->start;
    for (size_t i = 0; i < n && st; i++) st = di_dfa_step(d, st, s[i]);
    return st && d->accept[st];
}

int di_dfa_is_empty(const di_dfa *d) { return d->start == 0; }

int di_dfa_intersects(const di_dfa *a, const di_dfa *b) {
    di_dfa p;
    if (di_dfa_product(a, b, 0, 1u << 20, &p, NULL) != DI_OK) return 1; /* assume overlap */
    int r = !di_dfa_is_empty(&p);
    di_dfa_free(&p);
    return r;
}
