/* The matcher: an Earley recogniser over bytes whose terminals are DFA
 * lexemes, with one Earley set per consumed byte so that a token, or a trie
 * edge during mask computation, is a push and rollback is a truncation.
 * Spec: ecosystem.md §1.1 (how masks are built) and §1.4.
 *
 * Items inside a lexeme only carry their DFA state from set to set; the
 * parser (prediction / completion) runs only when a lexeme can end, so
 * walking a long string or number costs one table lookup per byte. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/grow.h"
#include "grammar/json_keys.h"

typedef struct item {
    uint32_t rule, dot, origin, state; /* state: lexeme DFA state (scan items) */
} item;

#define NO_STATE UINT32_MAX

typedef struct hslot {
    uint32_t rule, dot, origin, state, stamp;
} hslot;

struct di_matcher {
    const di_grammar *g;
    const di_cfg *cfg;
    item *scan;            /* [n_scan] items waiting in a lexeme, all sets */
    uint32_t n_scan, cap_scan;
    item *wait;            /* [n_wait] items waiting on a nonterminal */
    uint32_t n_wait, cap_wait;
    uint32_t *scan_off;    /* [n_sets + 1] */
    uint32_t *wait_off;    /* [n_sets + 1] */
    uint8_t *accept;       /* [n_sets] */
    uint32_t n_sets, cap_sets;
    uint32_t *steps;       /* [n_steps + 1] n_sets after each step */
    uint32_t n_steps, cap_steps;
    int finished;
    /* scratch for building a set */
    item *agenda;
    uint32_t n_agenda, cap_agenda;
    hslot *hash;
    uint32_t hash_cap, hash_n;
    uint32_t stamp;
    uint32_t *predicted;   /* [n_nts] stamp */
    /* JSON output: object keys so far, to refuse a repeated one */
    int track;
    di_json_keys jk;
    di_jk_state *jst;      /* [n_sets] tracker state after each set's byte */
    struct dead_memo *dead; /* dead-end verdicts (see token_dead_end); dropped on rollback */
    struct ext_table *ext;  /* the key being read: verdicts per extension (drop_dead_ends) */
    uint32_t ext_key[4];    /* ... for this object (frame parent, keys), key start, frame */
    struct ext_table *sext; /* a key about to open: verdicts per extension (token_dead_end) */
    uint32_t sext_key[2];   /* ... for this object (frame parent, keys) */
    uint16_t **class_size;  /* [n_terms] bytes per byte class of each term's automaton, made on first use */
};

/* Verdicts of the dead-end search per situation: the object (its frame's
 * parent and keys, arena ids that stay valid while the output only grows)
 * and the key read so far. */
typedef struct dead_entry {
    uint32_t parent, keys, in_key, len;
    uint64_t hash;
    int dead;              /* -1: empty slot */
} dead_entry;
#define DEAD_MEMO 256      /* direct-mapped */
typedef struct dead_memo {
    dead_entry e[DEAD_MEMO];
} dead_memo;

static void dead_memo_clear(dead_memo *d) {
    for (int i = 0; i < DEAD_MEMO; i++) d->e[i].dead = -1;
}

static inline uint32_t hkey(uint32_t r, uint32_t d, uint32_t o, uint32_t s) {
    uint64_t h = (uint64_t)r * 0x9E3779B97F4A7C15ull ^ ((uint64_t)d << 20) ^ ((uint64_t)o * 0xC2B2AE3D27D4EB4Full) ^ s;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return (uint32_t)(h ^ (h >> 29));
}

/* Inserts (r,d,o,s) into the current build's set; returns 1 if new, 0 if
 * present, -1 on allocation failure. */
static int hash_insert(di_matcher *m, uint32_t r, uint32_t d, uint32_t o, uint32_t s) {
    if ((m->hash_n + 1) * 2 > m->hash_cap) {
        uint32_t nc = m->hash_cap ? m->hash_cap * 2 : 1024;
        hslot *nh = calloc(nc, sizeof *nh);
        if (!nh) return -1;
        for (uint32_t i = 0; i < m->hash_cap; i++) {
            hslot *e = &m->hash[i];
            if (e->stamp != m->stamp) continue;
            uint32_t h = hkey(e->rule, e->dot, e->origin, e->state) & (nc - 1);
            while (nh[h].stamp == m->stamp) h = (h + 1) & (nc - 1);
            nh[h] = *e;
        }
        free(m->hash);
        m->hash = nh;
        m->hash_cap = nc;
    }
    uint32_t h = hkey(r, d, o, s) & (m->hash_cap - 1);
    for (;;) {
        hslot *e = &m->hash[h];
        if (e->stamp != m->stamp) {
            e->rule = r; e->dot = d; e->origin = o; e->state = s; e->stamp = m->stamp;
            m->hash_n++;
            return 1;
        }
        if (e->rule == r && e->dot == d && e->origin == o && e->state == s) return 0;
        h = (h + 1) & (m->hash_cap - 1);
    }
}

static void new_stamp(di_matcher *m) {
    m->stamp++;
    m->hash_n = 0;
    if (m->stamp == 0) { /* wrapped: clear */
        if (m->hash) memset(m->hash, 0, (size_t)m->hash_cap * sizeof *m->hash);
        memset(m->predicted, 0, (size_t)m->cfg->n_nts * sizeof *m->predicted);
        m->stamp = 1;
    }
}

static int agenda_push(di_matcher *m, uint32_t r, uint32_t d, uint32_t o) {
    int k = hash_insert(m, r, d, o, NO_STATE);
    if (k <= 0) return k;
    if (di_grow((void **)&m->agenda, &m->cap_agenda, m->n_agenda + 1, sizeof *m->agenda)) return -1;
    m->agenda[m->n_agenda++] = (item){r, d, o, NO_STATE};
    return 0;
}

/* Runs prediction / completion for set j (being built) over the agenda. */
static int closure(di_matcher *m, uint32_t j, uint8_t *acc) {
    const di_cfg *g = m->cfg;
    while (m->n_agenda) {
        item it = m->agenda[--m->n_agenda];
        const di_cfg_rule *ru = &g->rules[it.rule];
        if (it.dot == ru->len) {
            if (it.rule == g->start_rule) { *acc = 1; continue; }
            if (it.origin == j) continue; /* empty completion: done at prediction */
            uint32_t x = ru->lhs;
            for (uint32_t k = m->wait_off[it.origin]; k < m->wait_off[it.origin + 1]; k++) {
                const item *w = &m->wait[k];
                if (g->rhs[g->rules[w->rule].off + w->dot] == (di_sym)x &&
                    agenda_push(m, w->rule, w->dot + 1, w->origin) < 0)
                    return -1;
            }
            continue;
        }
        di_sym s = g->rhs[ru->off + it.dot];
        if (DI_SYM_IS_TERM(s)) {
            uint32_t st = g->terms[DI_SYM_TERM_ID(s)].dfa.start;
            int k = hash_insert(m, it.rule, it.dot, it.origin, st);
            if (k < 0) return -1;
            if (k) {
                if (di_grow((void **)&m->scan, &m->cap_scan, m->n_scan + 1, sizeof *m->scan)) return -1;
                m->scan[m->n_scan++] = (item){it.rule, it.dot, it.origin, st};
            }
            continue;
        }
        if (di_grow((void **)&m->wait, &m->cap_wait, m->n_wait + 1, sizeof *m->wait)) return -1;
        m->wait[m->n_wait++] = it;
        if (m->predicted[s] != m->stamp) {
            m->predicted[s] = m->stamp;
            for (uint32_t k = g->nt_rule_off[s]; k < g->nt_rule_off[s + 1]; k++)
                if (agenda_push(m, g->nt_rules[k], 0, j) < 0) return -1;
        }
        if (g->nullable[s] && agenda_push(m, it.rule, it.dot + 1, it.origin) < 0) return -1;
    }
    return 0;
}

static int ensure_set(di_matcher *m) {
    uint32_t need = m->n_sets + 2;
    if (di_grow((void **)&m->scan_off, &m->cap_sets, need, sizeof *m->scan_off)) return -1;
    uint32_t c2 = 0, c3 = 0;
    /* wait_off and accept follow cap_sets */
    void *w = realloc(m->wait_off, (size_t)m->cap_sets * sizeof *m->wait_off);
    if (!w) return -1;
    m->wait_off = w;
    void *a = realloc(m->accept, m->cap_sets);
    if (!a) return -1;
    m->accept = a;
    void *js = realloc(m->jst, (size_t)m->cap_sets * sizeof *m->jst);
    if (!js) return -1;
    m->jst = js;
    (void)c2; (void)c3;
    return 0;
}

static void finish_set(di_matcher *m, uint8_t acc) {
    m->accept[m->n_sets] = acc;
    m->n_sets++;
    m->scan_off[m->n_sets] = m->n_scan;
    m->wait_off[m->n_sets] = m->n_wait;
}

static void pop_set(di_matcher *m) {
    m->n_sets--;
    m->n_scan = m->scan_off[m->n_sets];
    m->n_wait = m->wait_off[m->n_sets];
}

/* Builds the next set by scanning byte b. Returns 1 if the input so far is
 * still a viable prefix (the set is kept), 0 if not (nothing kept), -1 on
 * allocation failure. */
static int push_byte(di_matcher *m, uint8_t b) {
    const di_cfg *g = m->cfg;
    if (m->cap_sets < m->n_sets + 2 && ensure_set(m)) return -1;
    uint32_t j = m->n_sets;
    di_jk_state js;
    if (m->track) { /* a byte that completes a repeated key is not viable */
        int r = di_json_keys_step(&m->jk, &m->jst[j - 1], b, &js);
        if (r) return r == DI_JK_DUPLICATE ? 0 : -1;
    }
    uint32_t p0 = m->scan_off[j - 1], p1 = m->scan_off[j];
    uint32_t base = m->n_scan;
    if (di_grow((void **)&m->scan, &m->cap_scan, m->n_scan + (p1 - p0) + 1, sizeof *m->scan)) return -1;
    uint32_t n_acc = 0;
    m->n_agenda = 0;
    for (uint32_t k = p0; k < p1; k++) {
        item it = m->scan[k];
        const di_dfa *d = &g->terms[DI_SYM_TERM_ID(g->rhs[g->rules[it.rule].off + it.dot])].dfa;
        uint32_t s2 = di_dfa_step(d, it.state, b);
        if (!s2) continue;
        it.state = s2;
        m->scan[m->n_scan++] = it;
        if (d->accept[s2]) {
            if (di_grow((void **)&m->agenda, &m->cap_agenda, m->n_agenda + 1, sizeof *m->agenda)) return -1;
            m->agenda[m->n_agenda++] = (item){it.rule, it.dot + 1, it.origin, NO_STATE};
            n_acc++;
        }
    }
    uint8_t acc = 0;
    if (n_acc || m->n_scan - base > 1) {
        new_stamp(m);
        /* dedupe carried items */
        uint32_t w = base;
        for (uint32_t k = base; k < m->n_scan; k++) {
            item it = m->scan[k];
            int r = hash_insert(m, it.rule, it.dot, it.origin, it.state);
            if (r < 0) return -1;
            if (r) m->scan[w++] = it;
        }
        m->n_scan = w;
        /* dedupe the completions, then close */
        uint32_t na = m->n_agenda;
        m->n_agenda = 0;
        for (uint32_t k = 0; k < na; k++) {
            item it = m->agenda[k];
            int r = hash_insert(m, it.rule, it.dot, it.origin, NO_STATE);
            if (r < 0) return -1;
            if (r) m->agenda[m->n_agenda++] = it;
        }
        if (closure(m, j, &acc)) return -1;
    }
    if (m->n_scan == base && !acc) {
        m->n_scan = base;
        m->n_wait = m->wait_off[j];
        return 0;
    }
    if (m->track) m->jst[j] = js;
    finish_set(m, acc);
    return 1;
}

void di_matcher_free(di_matcher *m) {
    if (!m) return;
    free(m->scan);
    free(m->wait);
    free(m->scan_off);
    free(m->wait_off);
    free(m->accept);
    free(m->steps);
    free(m->agenda);
    free(m->hash);
    free(m->predicted);
    free(m->jst);
    free(m->dead);
    free(m->ext);
    free(m->sext);
    if (m->class_size)
        for (uint32_t t = 0; t < m->cfg->n_terms; t++) free(m->class_size[t]);
    free(m->class_size);
    di_json_keys_free(&m->jk);
    free(m);
}

di_status di_matcher_create(const di_grammar *g, di_matcher **out) {
    di_err err = {0};
    if (!g || !out) {
        di_err_set(&err, DI_ERR_INVALID_ARG, "di_matcher_create: NULL argument");
        return di_err_publish(&err);
    }
    *out = NULL;
    di_matcher *m = calloc(1, sizeof *m);
    if (!m) goto nomem;
    m->g = g;
    m->cfg = &g->cfg;
    m->predicted = calloc(g->cfg.n_nts ? g->cfg.n_nts : 1, sizeof *m->predicted);
    if (!m->predicted || ensure_set(m)) goto nomem;
    if (di_grow((void **)&m->steps, &m->cap_steps, 4, sizeof *m->steps)) goto nomem;
    m->scan_off[0] = 0;
    m->wait_off[0] = 0;
    m->track = g->json_keys;
    if (m->track && di_json_keys_init(&m->jk, &m->jst[0])) goto nomem;
    new_stamp(m);
    uint8_t acc = 0;
    m->n_agenda = 0;
    if (agenda_push(m, g->cfg.start_rule, 0, 0) < 0 || closure(m, 0, &acc)) goto nomem;
    finish_set(m, acc);
    m->steps[0] = 1;
    m->n_steps = 0;
    *out = m;
    return DI_OK;
nomem:
    di_matcher_free(m);
    di_err_set(&err, DI_ERR_NOMEM, "out of memory creating a matcher");
    return di_err_publish(&err);
}

static di_status step_record(di_matcher *m, di_err *err) {
    if (di_grow((void **)&m->steps, &m->cap_steps, m->n_steps + 2, sizeof *m->steps))
        return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    m->steps[++m->n_steps] = m->n_sets;
    return DI_OK;
}

static di_status advance_bytes(di_matcher *m, const uint8_t *b, size_t n, di_err *err) {
    uint32_t start = m->n_sets;
    for (size_t i = 0; i < n; i++) {
        int r = push_byte(m, b[i]);
        if (r <= 0) {
            while (m->n_sets > start) pop_set(m);
            if (r < 0) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
            return di_err_set(err, DI_ERR_INVALID_ARG, "byte %zu of the step is not allowed here", i);
        }
    }
    return step_record(m, err);
}

di_status di_matcher_advance(di_matcher *m, int32_t token) {
    di_err err = {0};
    if (!m) return di_err_publish(&(di_err){DI_ERR_INVALID_ARG, "NULL matcher"});
    const di_vocab *v = m->g->vocab;
    if (m->finished) {
        di_err_set(&err, DI_ERR_STATE, "matcher already consumed EOS");
        return di_err_publish(&err);
    }
    if (token < 0 || (uint32_t)token >= v->n_vocab) {
        di_err_set(&err, DI_ERR_INVALID_ARG, "token %d outside the vocabulary of %u", token, v->n_vocab);
        return di_err_publish(&err);
    }
    if (token == v->eos_id) {
        if (!m->accept[m->n_sets - 1]) {
            di_err_set(&err, DI_ERR_INVALID_ARG, "EOS is not allowed: the output is incomplete");
            return di_err_publish(&err);
        }
        if (step_record(m, &err)) return di_err_publish(&err);
        m->finished = 1;
        return DI_OK;
    }
    uint32_t len = v->off[token + 1] - v->off[token];
    if (!len) {
        di_err_set(&err, DI_ERR_INVALID_ARG, "token %d has no text and is never allowed", token);
        return di_err_publish(&err);
    }
    if (advance_bytes(m, v->bytes + v->off[token], len, &err)) {
        di_err_prefix(&err, "token %d: ", token);
        return di_err_publish(&err);
    }
    return DI_OK;
}

di_status di_matcher_advance_bytes(di_matcher *m, const uint8_t *bytes, size_t len) {
    di_err err = {0};
    if (!m || (!bytes && len)) return di_err_publish(&(di_err){DI_ERR_INVALID_ARG, "NULL argument"});
    if (m->finished) {
        di_err_set(&err, DI_ERR_STATE, "matcher already consumed EOS");
        return di_err_publish(&err);
    }
    if (advance_bytes(m, bytes, len, &err)) return di_err_publish(&err);
    return DI_OK;
}

di_status di_matcher_rollback(di_matcher *m, size_t n) {
    di_err err = {0};
    if (!m) return di_err_publish(&(di_err){DI_ERR_INVALID_ARG, "NULL matcher"});
    if (n > m->n_steps) {
        di_err_set(&err, DI_ERR_INVALID_ARG, "cannot roll back %zu steps: only %u taken", n, m->n_steps);
        return di_err_publish(&err);
    }
    if (n == 0) return DI_OK;
    m->n_steps -= (uint32_t)n;
    m->finished = 0;
    if (m->dead) dead_memo_clear(m->dead); /* arena ids may be reused now */
    free(m->ext);
    m->ext = NULL;
    free(m->sext);
    m->sext = NULL;
    while (m->n_sets > m->steps[m->n_steps]) pop_set(m);
    return DI_OK;
}

int di_matcher_is_accepting(const di_matcher *m) {
    return m && !m->finished && m->accept[m->n_sets - 1];
}

int di_matcher_is_finished(const di_matcher *m) { return m && m->finished; }

/* Pushes the set that follows the completion of lexer item it (as if its
 * lexeme ended here), without the lexeme's own continuation. */
static int push_completion(di_matcher *m, const item *it) {
    if (m->cap_sets < m->n_sets + 2 && ensure_set(m)) return -1;
    uint32_t j = m->n_sets;
    new_stamp(m);
    m->n_agenda = 0;
    uint8_t acc = 0;
    if (agenda_push(m, it->rule, it->dot + 1, it->origin) < 0 || closure(m, j, &acc)) {
        m->n_scan = m->scan_off[j];
        m->n_wait = m->wait_off[j];
        return -1;
    }
    finish_set(m, acc);
    return 0;
}

/* Walks the trie nodes [i0, i_end) (a subtree whose root has depth d0)
 * with the full parser, setting allowed tokens in mask. The current top set
 * stands for the path to the subtree root's parent. */
static int general_walk(di_matcher *m, uint32_t i0, uint32_t i_end, uint32_t d0, uint32_t *mask,
                        const uint8_t *first) {
    const di_vocab *v = m->g->vocab;
    uint32_t base = m->n_sets;
    uint32_t i = i0;
    while (i < i_end) {
        uint32_t depth = v->trie.depth[i] - d0 + 1;
        while (m->n_sets - base >= depth) pop_set(m);
        if (first && depth == 1 && !first[v->trie.byte[i]]) { i = v->trie.end[i]; continue; }
        int r = push_byte(m, v->trie.byte[i]);
        if (r < 0) {
            while (m->n_sets > base) pop_set(m);
            return -1;
        }
        if (r == 0) { i = v->trie.end[i]; continue; }
        for (int32_t t = v->trie.tok[i]; t >= 0; t = v->tok_next[t]) mask[t >> 5] |= 1u << (t & 31);
        i++;
    }
    while (m->n_sets > base) pop_set(m);
    return 0;
}


/* 1 when the object of js has a key that is the key read so far followed
 * by tail[0..n) (exactly, or only beginning so with `begins`). */
static int key_taken(const di_json_keys *k, const di_jk_state *js, const uint8_t *tail, uint32_t n, int begins) {
    uint32_t plen = di_json_keys_in_key(js) ? js->key_len : 0;
    for (uint32_t x = k->frames[js->frame].keys; x; x = k->nodes[x - 1].next) {
        const di_jk_node *nd = &k->nodes[x - 1];
        if ((begins ? nd->len < plen + n : nd->len != plen + n) ||
            memcmp(k->bytes + nd->off, k->bytes + js->key_off, plen) || memcmp(k->bytes + nd->off + plen, tail, n))
            continue;
        return 1;
    }
    return 0;
}

/* Clears the tokens of mask that would complete a key its object already
 * has: every allowed token with enough quotes to complete a repeated key is
 * re-read by the tracker from the current position (exactly what advance
 * does), so the walks that built the mask need not track keys. Returns -1
 * when out of memory. */
static int drop_repeated_keys(di_matcher *m, uint32_t *mask) {
    const di_vocab *v = m->g->vocab;
    const di_jk_state *top = &m->jst[m->n_sets - 1];
    uint32_t need = di_json_keys_min_quotes(&m->jk, top);
    if (need > 7) need = 7;
    /* inside a key, a token with fewer than 3 quotes and no escape before
     * its first can only repeat the key being read, at that '"' */
    int in_key = di_json_keys_in_key(top) && !top->esc && !top->pend;
    for (uint32_t q = 0; q < v->quote_start[need]; q++) {
        uint32_t t = v->quote_toks[q];
        if (!(mask[t >> 5] >> (t & 31) & 1)) continue;
        if (in_key && q >= v->quote_start[3] && !(v->tok_flags[t] & DI_TOK_ESC_HEAD)) {
            if (key_taken(&m->jk, top, v->bytes + v->off[t], v->quote_at[t], 0)) mask[t >> 5] &= ~(1u << (t & 31));
            continue;
        }
        di_jk_state s = *top;
        for (uint32_t k = v->off[t]; k < v->off[t + 1]; k++) {
            di_jk_state o;
            int r = di_json_keys_step(&m->jk, &s, v->bytes[k], &o);
            if (r < 0) return -1;
            if (r) {
                mask[t >> 5] &= ~(1u << (t & 31));
                break;
            }
            s = o;
        }
    }
    return 0;
}

/* Search nodes the dead-end checks of one mask may visit; past it a token
 * is kept (a rare dead end rather than a wrongly refused token). */
#define DEAD_END_BUDGET 4096

/* One level of a key search at prefix length len over the keys cand
 * (which all begin with the prefix): the bytes followed one by one ('"',
 * '\\' and the keys' next bytes, at most 66), the keys going on with each
 * (subs[sub_off[z] .. sub_off[z + 1]), in cand order) and whether one of
 * them ends here. It depends on the keys only, so the top level is made
 * once per search and shared by every lexer item. */
typedef struct key_level {
    uint32_t len, n_spec;
    int taken;
    uint8_t spec[66];
    uint8_t sub_off[67];
    uint32_t subs[64];
} key_level;

static void key_level_make(const di_json_keys *k, uint32_t len, const uint32_t *cand, uint32_t n, key_level *kl) {
    uint8_t idx[256];
    uint64_t seen[4] = {0};
    uint8_t count[66] = {0};
    kl->len = len;
    kl->taken = 0;
    kl->n_spec = 2;
    kl->spec[0] = '"';
    kl->spec[1] = '\\';
    seen['"' >> 6] |= 1ull << ('"' & 63);
    seen['\\' >> 6] |= 1ull << ('\\' & 63);
    for (uint32_t q = 0; q < n && q < 64; q++) {
        const di_jk_node *nd = &k->nodes[cand[q] - 1];
        if (nd->len <= len) {
            kl->taken |= nd->len == len;
            continue;
        }
        uint8_t b = k->bytes[nd->off + len];
        if (!(seen[b >> 6] >> (b & 63) & 1)) {
            seen[b >> 6] |= 1ull << (b & 63);
            idx[b] = (uint8_t)kl->n_spec;
            kl->spec[kl->n_spec++] = b;
        }
        if (b != '"' && b != '\\') count[idx[b]]++;
    }
    kl->sub_off[0] = kl->sub_off[1] = kl->sub_off[2] = 0;
    for (uint32_t z = 2; z < kl->n_spec; z++) kl->sub_off[z + 1] = (uint8_t)(kl->sub_off[z] + count[z]);
    uint8_t fill[66];
    memcpy(fill, kl->sub_off, sizeof fill);
    for (uint32_t q = 0; q < n && q < 64; q++) {
        const di_jk_node *nd = &k->nodes[cand[q] - 1];
        if (nd->len <= len) continue;
        uint8_t b = k->bytes[nd->off + len];
        if (b != '"' && b != '\\') kl->subs[fill[idx[b]]++] = cand[q];
    }
}

typedef struct key_search {
    const di_json_keys *jk;
    uint32_t budget;
    const uint16_t *class_size; /* bytes per class of the automaton searched */
    uint16_t in_class[256];   /* scratch of live_off_keys, kept zero between uses */
} key_search;

/* 1 when d in state s takes a byte that no key of kl goes on with. */
static int live_off_keys(key_search *ks, const di_dfa *d, uint32_t s, const key_level *kl) {
    uint16_t *in_class = ks->in_class;
    for (uint32_t z = 0; z < kl->n_spec; z++) in_class[d->byte_class[kl->spec[z]]]++;
    const uint32_t *row = d->trans + (size_t)s * d->n_classes;
    int off = 0;
    for (uint32_t c = 0; c < d->n_classes && !off; c++) off = row[c] && ks->class_size[c] > in_class[c];
    for (uint32_t z = 0; z < kl->n_spec; z++) in_class[d->byte_class[kl->spec[z]]] = 0;
    return off;
}

/* The bytes per byte class of term t's automaton, counted once per
 * matcher (a key search visits many lexer items, most for a few nodes, so
 * counting them per search was half its time); NULL when out of memory. */
static const uint16_t *class_sizes(di_matcher *m, uint32_t t) {
    if (!m->class_size && !(m->class_size = calloc(m->cfg->n_terms ? m->cfg->n_terms : 1, sizeof *m->class_size)))
        return NULL;
    if (!m->class_size[t]) {
        const di_dfa *d = &m->cfg->terms[t].dfa;
        uint16_t *cs = calloc(256, sizeof *cs);
        if (!cs) return NULL;
        for (int b = 0; b < 256; b++) cs[d->byte_class[b]]++;
        m->class_size[t] = cs;
    }
    return m->class_size[t];
}

/* 1 when automaton d from state s (inside a key, prefix of length len
 * read, which the keys of kl begin with) can complete a key that is
 * none of them. A byte off every key leads to a fresh key at once (a live
 * state can always be completed), so only the keys' next bytes, '"' and
 * '\\' are followed one by one, and any other live byte (found by class)
 * ends the search. An escape is counted as fresh too (keys are compared
 * unescaped only when canonical: a rare dead end left in the mask, never a
 * token wrongly refused). */
static int fresh_from(key_search *ks, const di_dfa *d, uint32_t s, const key_level *kl) {
    if (d->accept[s]) return 1; /* a lexeme that ends before a closing '"': not a key lexeme, not searched */
    if (!ks->budget) return 1;
    ks->budget--;
    if (live_off_keys(ks, d, s, kl)) return 1;
    key_level sub;
    for (uint32_t z = 0; z < kl->n_spec; z++) {
        uint8_t b = kl->spec[z];
        uint32_t s2 = di_dfa_step(d, s, b);
        if (!s2) continue;
        if (b == '"') { /* closes the key: fresh unless one of them ends here */
            if (d->accept[s2] && !kl->taken) return 1;
            continue;
        }
        if (b == '\\') return 1;
        key_level_make(ks->jk, kl->len + 1, kl->subs + kl->sub_off[z], kl->sub_off[z + 1] - kl->sub_off[z], &sub);
        if (fresh_from(ks, d, s2, &sub)) return 1;
    }
    return 0;
}

/* The keys of js's object that begin with the key read so far (plen
 * bytes), as node ids + 1, at most 64 (64: maybe more). */
static uint32_t keys_begun(const di_json_keys *k, const di_jk_state *js, uint32_t plen, uint32_t all[64]) {
    uint32_t n = 0;
    for (uint32_t x = k->frames[js->frame].keys; x && n < 64; x = k->nodes[x - 1].next) {
        const di_jk_node *nd = &k->nodes[x - 1];
        if (nd->len >= plen && !memcmp(k->bytes + nd->off, k->bytes + js->key_off, plen)) all[n++] = x;
    }
    return n;
}

/* Verdicts for the ways a key being read can go on along the object's
 * keys: one per extension, named by its length and the first of the keys
 * (in keys_begun order) it begins. Open addressing. */
typedef struct ext_entry {
    uint32_t len, key; /* key 0: empty slot */
    uint8_t alive, fresh;
} ext_entry;
#define EXT_SLOTS 1024
typedef struct ext_table {
    ext_entry e[EXT_SLOTS];
    uint32_t n;
    int full;
    int root_fresh; /* a fresh key can be completed from the prefix searched from */
} ext_table;

static ext_entry *ext_find(ext_table *x, uint32_t len, uint32_t key, int add) {
    uint32_t h = (len * 0x9E3779B1u ^ key * 0x85EBCA77u) & (EXT_SLOTS - 1);
    for (; x->e[h].key; h = (h + 1) & (EXT_SLOTS - 1))
        if (x->e[h].len == len && x->e[h].key == key) return &x->e[h];
    if (!add) return NULL;
    if (x->n * 2 >= EXT_SLOTS) { x->full = 1; return NULL; }
    x->n++;
    x->e[h] = (ext_entry){len, key, 0, 0};
    return &x->e[h];
}

/* fresh_from over every extension along the keys of kl (their prefix
 * read, automaton d in state s), recording in x whether each
 * is alive for d and whether a fresh key can be completed from it. */
static int ext_walk(ext_table *x, key_search *ks, const di_dfa *d, uint32_t s, const key_level *kl) {
    if (d->accept[s]) return 1;
    if (!ks->budget) { x->full = 1; return 1; }
    ks->budget--;
    int fresh = live_off_keys(ks, d, s, kl);
    key_level sub;
    for (uint32_t z = 0; z < kl->n_spec; z++) {
        uint8_t b = kl->spec[z];
        uint32_t s2 = di_dfa_step(d, s, b);
        if (!s2) continue;
        if (b == '"') {
            fresh |= d->accept[s2] && !kl->taken;
            continue;
        }
        if (b == '\\') { fresh = 1; continue; }
        const uint32_t *cand = kl->subs + kl->sub_off[z];
        uint32_t m = kl->sub_off[z + 1] - kl->sub_off[z];
        if (!m) { fresh = 1; continue; }
        ext_entry *e = ext_find(x, kl->len + 1, cand[0], 1);
        key_level_make(ks->jk, kl->len + 1, cand, m, &sub);
        int f = ext_walk(x, ks, d, s2, &sub);
        if (e) {
            e->alive = 1;
            e->fresh |= (uint8_t)f;
        }
        fresh |= f;
    }
    return fresh;
}

/* 1 when, from the top set, a key its object does not have yet can be
 * completed; 0 when none can; -1 out of memory. The key is one lexeme: its automaton (from
 * each lexer item of the top set) is searched along the object's keys. */
static int fresh_key_reachable(di_matcher *m, uint32_t *budget) {
    const di_cfg *g = m->cfg;
    const di_jk_state *js = &m->jst[m->n_sets - 1];
    const di_json_keys *k = &m->jk;
    if (js->esc || js->pend) return 1;
    int in_key = di_json_keys_in_key(js), found = 0, searched = 0;
    uint32_t plen = in_key ? js->key_len : 0; /* the key read so far */
    uint32_t all[64], n = keys_begun(k, js, plen, all);
    if (n == 64) return 1; /* many keys: not searched */
    key_search ks = {.jk = k, .budget = *budget};
    key_level root;
    key_level_make(k, plen, all, n, &root);
    uint32_t top = m->n_sets - 1;
    for (uint32_t x = m->scan_off[top]; x < m->scan_off[top + 1] && !found; x++) {
        const item *it = &m->scan[x];
        uint32_t t = DI_SYM_TERM_ID(g->rhs[g->rules[it->rule].off + it->dot]);
        const di_dfa *d = &g->terms[t].dfa;
        uint32_t s = it->state;
        if (!in_key) { /* the key opens with '"', maybe after whitespace */
            for (int w = 0; w < 64 && s && !di_dfa_step(d, s, '"'); w++) {
                uint32_t s2 = di_dfa_step(d, s, ' ');
                if (!s2) s2 = di_dfa_step(d, s, '\n');
                s = s2;
            }
            s = s ? di_dfa_step(d, s, '"') : 0;
            if (!s) continue;
        }
        if (!(ks.class_size = class_sizes(m, t))) return -1;
        found = fresh_from(&ks, d, s, &root);
        searched = 1;
    }
    *budget = ks.budget;
    return found || !searched || !ks.budget;
}


/* Fills x from the top set, inside a key whose first plen bytes are read:
 * every lexer item's automaton searched along the object's keys. -1 out
 * of memory. */
static int ext_fill(di_matcher *m, ext_table *x, const uint32_t *all, uint32_t n, uint32_t plen, uint32_t budget) {
    memset(x, 0, sizeof *x);
    key_search ks = {.jk = &m->jk, .budget = budget};
    key_level root;
    key_level_make(&m->jk, plen, all, n, &root);
    const di_cfg *g = m->cfg;
    uint32_t ts = m->n_sets - 1;
    for (uint32_t q = m->scan_off[ts]; q < m->scan_off[ts + 1] && !x->full; q++) {
        const item *it = &m->scan[q];
        uint32_t t = DI_SYM_TERM_ID(g->rhs[g->rules[it->rule].off + it->dot]);
        if (!(ks.class_size = class_sizes(m, t))) return -1;
        x->root_fresh |= ext_walk(x, &ks, &g->terms[t].dfa, it->state, &root);
    }
    return 0;
}

/* The name of the extension of length len that key x begins: the first
 * of all[0..n) that begins the same way. */
static uint32_t ext_rep(const di_json_keys *k, const uint32_t *all, uint32_t n, uint32_t x, uint32_t len) {
    const di_jk_node *a = &k->nodes[x - 1];
    for (uint32_t r = 0; r < n; r++) {
        const di_jk_node *b = &k->nodes[all[r] - 1];
        if (b->len >= len && !memcmp(k->bytes + b->off, k->bytes + a->off, len)) return all[r];
    }
    return x;
}

/* Dead-end verdict of token t, which opens a key at its byte open_at and
 * reads on to js (or, open_at UINT32_MAX, leaves a key due), from the
 * object's key-start table (made once per object and keys, by pushing the
 * token up to the opening '"', or the token and a '"'): 1 dead, 0 not, -1
 * out of memory, -2 no verdict. */
static int key_start_verdict(di_matcher *m, uint32_t t, uint32_t open_at, const di_jk_state *js, uint32_t *budget) {
    const di_vocab *v = m->g->vocab;
    const di_json_keys *k = &m->jk;
    const di_jk_frame *f = &k->frames[js->frame];
    uint32_t parent = f->parent, keys = f->keys;
    if (!m->sext || m->sext_key[0] != parent || m->sext_key[1] != keys) {
        if (!m->sext && !(m->sext = malloc(sizeof *m->sext))) return -1;
        m->sext_key[0] = m->sext_key[1] = UINT32_MAX;
        uint32_t base = m->n_sets, len = v->off[t + 1] - v->off[t];
        int rc = 0;
        /* open_at UINT32_MAX: the token leaves a key due; it is opened here */
        for (uint32_t q = 0; q <= (open_at == UINT32_MAX ? len : open_at) && !rc; q++) {
            int r = push_byte(m, q < len ? v->bytes[v->off[t] + q] : (uint8_t)'"');
            if (r <= 0) rc = r < 0 ? -1 : -2;
        }
        const di_jk_state *top = &m->jst[m->n_sets - 1];
        uint32_t all[64], n = 0;
        if (!rc && (!di_json_keys_in_key(top) || top->key_len || (n = keys_begun(k, top, 0, all)) == 64)) rc = -2;
        if (!rc && ext_fill(m, m->sext, all, n, 0, *budget)) rc = -1;
        if (!rc) {
            m->sext_key[0] = parent;
            m->sext_key[1] = keys;
        }
        while (m->n_sets > base) pop_set(m);
        if (rc) return rc;
    }
    const ext_table *x = m->sext;
    if (x->full) return -2;
    if (!di_json_keys_in_key(js) || !js->key_len) return !x->root_fresh;
    /* the keys of the object that the key read so far begins */
    uint32_t all[64], n = keys_begun(k, js, 0, all), first = 0;
    for (uint32_t q = 0; q < n && !first; q++) {
        const di_jk_node *nd = &k->nodes[all[q] - 1];
        if (nd->len >= js->key_len && !memcmp(k->bytes + nd->off, k->bytes + js->key_off, js->key_len)) first = all[q];
    }
    if (!first) return 0; /* off every key: any completion is fresh */
    const ext_entry *e = ext_find((ext_table *)x, js->key_len, ext_rep(k, all, n, first, js->key_len), 0);
    return e && e->alive && !e->fresh;
}

/* 1 when token t leads to a dead end: a key is due (or begun) in an object
 * whose keys the grammar still allows are all taken. The tracker reads the
 * token first (cheap); only a token that ends where a key is due or begun
 * is pushed through the parser and searched from. */
static int token_dead_end(di_matcher *m, uint32_t t, dead_memo *memo, uint32_t *budget) {
    const di_vocab *v = m->g->vocab;
    uint32_t base = m->n_sets;
    di_jk_state js = m->jst[base - 1];
    uint32_t stable_frames = js.n_frames, stable_nodes = js.n_nodes, open_at = UINT32_MAX;
    for (uint32_t k = v->off[t]; k < v->off[t + 1]; k++) {
        di_jk_state o;
        int r = di_json_keys_step(&m->jk, &js, v->bytes[k], &o);
        if (r) return r < 0 ? -1 : 0; /* a repeated key: dropped already */
        if (!di_json_keys_in_key(&js) && di_json_keys_in_key(&o)) open_at = k - v->off[t];
        js = o;
    }
    if (!di_json_keys_may_dead_end(&m->jk, &js)) return 0;
    const di_jk_frame *f = &m->jk.frames[js.frame];
    uint64_t h = 1469598103934665603ull;
    for (uint32_t k = 0; k < js.key_len; k++) h = (h ^ m->jk.bytes[js.key_off + k]) * 1099511628211ull;
    dead_entry key = {f->parent, f->keys, (uint32_t)di_json_keys_in_key(&js), js.key_len, h, 0};
    /* ids past the top's arenas were made by this token: not comparable */
    int keyed = f->parent < stable_frames && f->keys <= stable_nodes && !js.esc && !js.pend;
    uint64_t mix = (key.hash ^ ((uint64_t)key.parent << 32 | key.keys) ^ ((uint64_t)key.len << 1 | key.in_key)) *
                   0x9E3779B97F4A7C15ull;
    dead_entry *slot = &memo->e[mix >> 56];
    if (keyed && slot->dead >= 0 && slot->parent == key.parent && slot->keys == key.keys && slot->in_key == key.in_key &&
        slot->len == key.len && slot->hash == key.hash)
        return slot->dead;
    if (keyed && (key.in_key ? open_at != UINT32_MAX : 1)) { /* a key due or opened: judged by the start table */
        int r = key_start_verdict(m, t, open_at, &js, budget);
        if (r >= 0) {
            key.dead = r;
            *slot = key;
            return r;
        }
        if (r == -1) return -1;
    }
    int rc = 0;
    for (uint32_t k = v->off[t]; k < v->off[t + 1] && !rc; k++) {
        int r = push_byte(m, v->bytes[k]);
        if (r <= 0) rc = r < 0 ? -1 : 1; /* not allowed: nothing to check */
    }
    int dead = 0;
    if (!rc) {
        int r = fresh_key_reachable(m, budget);
        dead = r == 0;
        key.dead = dead;
        if (r < 0) rc = -1;
        else if (keyed) *slot = key;
    }
    while (m->n_sets > base) pop_set(m);
    return rc < 0 ? -1 : dead;
}

/* Clears the tokens of mask that lead to a dead end the grammar cannot see
 * (see token_dead_end). Only tokens that can end where a key is due or
 * inside one are looked at: those holding '"', separators (whitespace, or
 * a ',' then whitespace), tokens with escapes, and, inside a key, those
 * that spell on along a key the object has. */
static int drop_dead_ends(di_matcher *m, uint32_t *mask) {
    const di_vocab *v = m->g->vocab;
    if (!di_json_keys_any(&m->jk, &m->jst[m->n_sets - 1])) return 0;
    if (!m->dead) {
        if (!(m->dead = malloc(sizeof *m->dead))) return -1;
        dead_memo_clear(m->dead);
    }
    dead_memo *memo = m->dead;
    uint32_t budget = DEAD_END_BUDGET;
    /* Which tokens can end where a key is due or begun. Outside strings:
     * those holding '"' (they may open a key) and a ',' then whitespace;
     * whitespace alone keeps the place (its verdict is this place's, good
     * since the previous mask). Inside a string value or a key: a '"' then
     * a ','; and inside a key that begins one of the object's, escapes and
     * the tokens spelling on along such a key. */
    const di_jk_state *top0 = &m->jst[m->n_sets - 1];
    int in_key = di_json_keys_in_key(top0), deep = in_key && di_json_keys_may_dead_end(&m->jk, top0);
    int in_value = di_json_keys_in_value(top0);
    int in_string = in_key || in_value;
    int due = !in_string && di_json_keys_may_dead_end(&m->jk, top0); /* a key is due here */
    /* (escapes inside a key are counted as fresh, as in fresh_from: a rare
     * dead end left in the mask rather than a search per escaped token) */
    const uint32_t *lists[2] = {in_string ? v->qc_toks : v->quote_toks, v->sep_toks};
    uint32_t counts[2] = {in_string ? v->n_qc : v->quote_start[1], in_string ? 0 : v->n_sep};
    /* The one-comma shapes end in the same place from outside strings (a
     * ',' after the value) or from inside a string value (its closing
     * '"' then a ','): one verdict serves them all. */
    uint8_t shared = in_value ? DI_TOK_QUOTE_COMMA : in_key ? 0 : DI_TOK_COMMA;
    int shared_dead = -1;
    for (int l = 0; l < 2; l++)
        for (uint32_t q = 0; q < counts[l]; q++) {
            uint32_t t = lists[l][q];
            if (!(mask[t >> 5] >> (t & 31) & 1)) continue;
            int r;
            /* outside strings, a key is reached through a ',' or, where one
             * is due, by opening it */
            if (!in_string && !(v->tok_flags[t] & (due ? DI_TOK_QUOTE_FIRST : DI_TOK_HAS_COMMA))) continue;
            if (!in_string && (v->tok_flags[t] & DI_TOK_OPEN_KEY)) {
                /* opens a key and reads on: a dead end only when what it
                 * reads begins one of the object's keys */
                const di_jk_frame *fr = &m->jk.frames[top0->frame];
                uint32_t qa = v->quote_at[t] + 1, n = v->off[t + 1] - v->off[t];
                if (!fr->is_object || !key_taken(&m->jk, top0, v->bytes + v->off[t] + qa, n - qa, 1)) continue;
            }
            if (v->tok_flags[t] & shared) {
                if (shared_dead < 0 && (shared_dead = token_dead_end(m, t, memo, &budget)) < 0) return -1;
                r = shared_dead;
            } else if ((r = token_dead_end(m, t, memo, &budget)) < 0) {
                return -1;
            }
            if (r) mask[t >> 5] &= ~(1u << (t & 31));
        }
    /* inside a key: tokens spelling on along a key of the object, judged
     * by one search over the lexer items of the top set */
    const di_jk_state *top = &m->jst[m->n_sets - 1];
    if (!deep || top->esc || top->pend) return 0;
    const di_json_keys *k = &m->jk;
    uint32_t plen = top->key_len, all[64], n = keys_begun(k, top, plen, all);
    if (n == 64) return 0;
    /* The table holds for the whole key: its verdicts at longer prefixes
     * are what a search from there would give (the lexer items only step
     * on), so it is searched once per key and kept until a rollback. */
    ext_table *x = m->ext;
    const di_jk_frame *fr = &k->frames[top->frame];
    if (!x || m->ext_key[0] != fr->parent || m->ext_key[1] != fr->keys || m->ext_key[2] != top->key_off ||
        m->ext_key[3] != top->frame) {
        if (!x && !(x = m->ext = malloc(sizeof *x))) return -1;
        m->ext_key[0] = fr->parent;
        m->ext_key[1] = fr->keys;
        m->ext_key[2] = top->key_off;
        m->ext_key[3] = top->frame;
        if (ext_fill(m, x, all, n, plen, budget)) {
            m->ext_key[3] = UINT32_MAX; /* not filled */
            return -1;
        }
    }
    for (uint32_t q = 0; q < n && !x->full; q++) {
        const di_jk_node nd = k->nodes[all[q] - 1];
        /* descend the vocabulary trie along the rest of the key; the
         * extension's name (the first key that begins the same way) only
         * moves on as the extension grows */
        uint32_t lo = 0, hi = v->trie.n_nodes, r = 0;
        for (uint32_t d = 0; plen + d < nd.len; d++) {
            uint8_t b = k->bytes[nd.off + plen + d];
            uint32_t c = d ? lo : v->root_child[b];
            if (d)
                while (c < hi && v->trie.byte[c] != b) c = v->trie.end[c];
            if (c >= hi) break;
            uint32_t len = plen + d + 1;
            while (r < q && (k->nodes[all[r] - 1].len < len ||
                             memcmp(k->bytes + k->nodes[all[r] - 1].off, k->bytes + nd.off, len)))
                r++;
            const ext_entry *e = ext_find(x, len, all[r], 0);
            if (e && e->alive && !e->fresh)
                for (int32_t t = v->trie.tok[c]; t >= 0; t = v->tok_next[t]) mask[t >> 5] &= ~(1u << (t & 31));
            lo = c + 1;
            hi = v->trie.end[c];
        }
    }
    return 0;
}

/* mask |= bits over n words, 64 bits at a time. */
static void or_bits(uint32_t *mask, const uint32_t *bits, size_t n) {
    size_t w = 0;
    for (; w + 2 <= n; w += 2) {
        uint64_t a, b;
        memcpy(&a, mask + w, 8);
        memcpy(&b, bits + w, 8);
        a |= b;
        memcpy(mask + w, &a, 8);
    }
    for (; w < n; w++) mask[w] |= bits[w];
}

/* How the lexer-only part of an item's mask is found: the memo entry of
 * (t, st, exact), where t may be the item's proxy; with room != UINT32_MAX
 * the item's own automaton (term ot, state ost) may reach its repetition
 * bound within a token, so the entry's tokens longer than room bytes are
 * re-checked with it. */
typedef struct lex_key {
    uint32_t t, st, exact, room, ot, ost;
} lex_key;

/* Tokens longer than this many bytes at most are re-checked one by one
 * rather than walking the trie with the item's own automaton. */
#define LONG_TOKENS_MAX 4096

static lex_key item_lexer(const di_matcher *m, const item *it) {
    const di_cfg *g = m->cfg;
    const di_vocab *v = m->g->vocab;
    uint32_t t = DI_SYM_TERM_ID(g->rhs[g->rules[it->rule].off + it->dot]);
    const di_cfg_term *T = &g->terms[t];
    lex_key k = {t, it->state, 1, UINT32_MAX, 0, 0};
    if (T->proxy < 0 || T->proxy_state[it->state] == UINT32_MAX) return k;
    uint32_t room = T->proxy_room ? T->proxy_room[it->state] : UINT32_MAX;
    if (room < v->max_len && v->len_start[room] > LONG_TOKENS_MAX) return k;
    k.t = (uint32_t)T->proxy;
    k.st = T->proxy_state[it->state];
    k.exact = 0;
    if (room < v->max_len) {
        k.room = room;
        k.ot = t;
        k.ost = it->state;
    }
    return k;
}

/* ORs the proxy entry e into mask, except its tokens longer than k->room
 * bytes, which are kept only when the item's own automaton survives them
 * (inside the proxy's walk they cross no lexeme end, so surviving is the
 * whole condition). */
static int proxy_merge_bounded(const di_matcher *m, const di_mask_entry *e, const lex_key *k, uint32_t *mask) {
    const di_vocab *v = m->g->vocab;
    const di_dfa *d = &m->cfg->terms[k->ot].dfa;
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    if (!e->bits) {
        for (uint32_t q = 0; q < e->n_toks; q++) {
            uint32_t tk = e->toks[q];
            if (v->off[tk + 1] - v->off[tk] > k->room && !di_vocab_token_alive(v, d, k->ost, tk)) continue;
            mask[tk >> 5] |= 1u << (tk & 31);
        }
        return 0;
    }
    uint32_t n_long = v->len_start[k->room];
    uint8_t *drop = malloc(n_long ? n_long : 1);
    if (!drop) return -1;
    for (uint32_t q = 0; q < n_long; q++) {
        uint32_t tk = v->len_order[q];
        /* dropped: in the entry, not already in the mask, and dead for the item */
        drop[q] = (e->bits[tk >> 5] >> (tk & 31) & 1) && !(mask[tk >> 5] >> (tk & 31) & 1) &&
                  !di_vocab_token_alive(v, d, k->ost, tk);
    }
    or_bits(mask, e->bits, words);
    for (uint32_t q = 0; q < n_long; q++)
        if (drop[q]) mask[v->len_order[q] >> 5] &= ~(1u << (v->len_order[q] & 31));
    free(drop);
    return 0;
}

/* The memo entry of one lexer item (terminal t in DFA state st), from the
 * vocabulary's memo when the lexeme has a text key (shared by every
 * grammar), else from the grammar's. *owned is set when the entry was not
 * kept and must be freed by the caller. */
static const di_mask_entry *item_entry(di_matcher *m, uint32_t t, uint32_t st, int exact, di_mask_entry **owned) {
    const di_vocab *v = m->g->vocab;
    const di_cfg *g = m->cfg;
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    *owned = NULL;
    uint32_t pair[3] = {t, st, (uint32_t)exact};
    uint32_t small[64];
    uint32_t *ckey = pair, ckey_n = 3;
    uint32_t *gkey = NULL;
    di_mask_cache *cache = (di_mask_cache *)&m->g->cache; /* internally locked */
    const char *tk = g->terms[t].key;
    if (tk) {
        size_t l = strlen(tk), n = 3 + (l + 3) / 4;
        gkey = n <= 64 ? small : calloc(n, sizeof *gkey);
        if (gkey) {
            memset(gkey, 0, n * sizeof *gkey);
            gkey[0] = st;
            gkey[1] = (uint32_t)exact;
            gkey[2] = (uint32_t)l;
            memcpy(gkey + 3, tk, l);
            ckey = gkey;
            ckey_n = (uint32_t)n;
            cache = (di_mask_cache *)&v->cache;
        }
    }
    uint64_t h = 1469598103934665603ull;
    for (uint32_t q = 0; q < ckey_n; q++) h = (h ^ ckey[q]) * 1099511628211ull;
    const di_mask_entry *e = di_mask_cache_find(cache, ckey, ckey_n, h);
    if (!e) {
        di_mask_entry *fresh = di_vocab_lexer_walk(v, &g->terms[t].dfa, st, exact);
        if (fresh) {
            fresh->hash = h;
            fresh->key_n = ckey_n;
            fresh->key = malloc(ckey_n * sizeof *ckey);
            if (!fresh->key) {
                di_mask_entry_free(fresh);
                if (gkey && gkey != small) free(gkey);
                return NULL;
            }
            memcpy(fresh->key, ckey, ckey_n * sizeof *ckey);
            e = di_mask_cache_put(cache, fresh, words);
            if (!e) { e = fresh; *owned = fresh; } /* not kept: use, then free */
        }
    }
    if (gkey && gkey != small) free(gkey);
    return e;
}

di_status di_matcher_fill_mask(di_matcher *m, uint32_t *mask, size_t n_words) {
    di_err err = {0};
    if (!m || !mask) return di_err_publish(&(di_err){DI_ERR_INVALID_ARG, "NULL argument"});
    const di_vocab *v = m->g->vocab;
    const di_cfg *g = m->cfg;
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    if (n_words < words) {
        di_err_set(&err, DI_ERR_INVALID_ARG, "mask of %zu words is too small for %u tokens", n_words, v->n_vocab);
        return di_err_publish(&err);
    }
    memset(mask, 0, n_words * sizeof *mask);
    if (m->finished) return DI_OK;
    uint32_t top = m->n_sets - 1;
    uint32_t s0 = m->scan_off[top], s1 = m->scan_off[top + 1];
    /* The mask is the union over the lexer items of this position: each
     * item's tokens decided by its lexeme alone (memoised), plus, where its
     * lexeme can end inside a token, the parser's verdict on the rest of the
     * token from the set that follows the item's completion. */
    /* The walks below leave repeated keys to drop_repeated_keys (the memo
     * entries cannot see keys anyway): the key tracker is off meanwhile. */
    int track = m->track;
    m->track = 0;
    const di_mask_entry **ent = malloc(((size_t)(s1 - s0) + 1) * sizeof *ent);
    di_mask_entry **owned = calloc((size_t)(s1 - s0) + 1, sizeof *owned);
    lex_key *keys = malloc(((size_t)(s1 - s0) + 1) * sizeof *keys);
    int rc = ent && owned && keys ? 0 : -1;
    for (uint32_t x = s0; x < s1 && !rc; x++) {
        lex_key k = item_lexer(m, &m->scan[x]);
        keys[x - s0] = k;
        /* items with the same lexer state share the entry */
        const di_mask_entry *e = NULL;
        for (uint32_t y = s0; y < x && !e; y++)
            if (!memcmp(&keys[y - s0], &k, sizeof k)) e = ent[y - s0];
        if (e) { ent[x - s0] = e; continue; }
        e = item_entry(m, k.t, k.st, k.exact, &owned[x - s0]);
        ent[x - s0] = e;
        if (!e) { rc = -1; break; }
        if (k.room == UINT32_MAX) {
            if (e->bits)
                or_bits(mask, e->bits, words);
            else
                for (uint32_t q = 0; q < e->n_toks; q++) mask[e->toks[q] >> 5] |= 1u << (e->toks[q] & 31);
        } else if (proxy_merge_bounded(m, e, &k, mask)) {
            rc = -1;
        }
    }
    /* parser walks below the split nodes, per item */
    for (uint32_t x = s0; x < s1 && !rc; x++) {
        const di_mask_entry *e = ent[x - s0];
        if (!e->n_fallback) continue;
        item it = m->scan[x];
        uint32_t base = m->n_sets;
        if (!keys[x - s0].exact) {
            /* proxy entry: walk each recorded subtree with the full parser,
             * keeping the pushed path between consecutive nodes */
            uint32_t pushed = 0;
            uint8_t cur[1024];
            for (uint32_t f = 0; f < e->n_fallback && !rc; f++) {
                uint32_t node = e->fallback[f];
                uint32_t d = v->trie.depth[node];
                uint32_t j = node;
                while (v->trie.tok[j] < 0) j++;
                const uint8_t *path = v->bytes + v->off[v->trie.tok[j]];
                uint32_t want = d - 1, l = 0;
                while (l < pushed && l < want && cur[l] == path[l]) l++;
                while (pushed > l) { pop_set(m); pushed--; }
                int ok = 1;
                while (pushed < want && ok) {
                    int r = push_byte(m, path[pushed]);
                    if (r < 0) rc = -1;
                    ok = r > 0;
                    if (ok) { cur[pushed] = path[pushed]; pushed++; }
                }
                if (ok && !rc) rc = general_walk(m, node, v->trie.end[node], d, mask, NULL);
            }
            while (m->n_sets > base) pop_set(m);
            continue;
        }
        if (push_completion(m, &it)) { rc = -1; break; }
        /* first bytes the completed set can take */
        uint8_t first[256] = {0};
        uint32_t c0 = m->scan_off[m->n_sets - 1], c1 = m->scan_off[m->n_sets];
        int any = 0;
        for (uint32_t k = c0; k < c1; k++) {
            const item *ci = &m->scan[k];
            const di_dfa *d = &g->terms[DI_SYM_TERM_ID(g->rhs[g->rules[ci->rule].off + ci->dot])].dfa;
            const uint32_t *row = d->trans + (size_t)ci->state * d->n_classes;
            for (int b = 0; b < 256; b++)
                if (row[d->byte_class[b]]) first[b] = 1, any = 1;
        }
        if (any)
            for (uint32_t f = 0; f < e->n_fallback && !rc; f++) {
                uint32_t node = e->fallback[f];
                rc = general_walk(m, node + 1, v->trie.end[node], v->trie.depth[node] + 1, mask, first);
            }
        while (m->n_sets > base) pop_set(m);
    }
    for (uint32_t x = s0; owned && x < s1; x++) di_mask_entry_free(owned[x - s0]);
    free(owned);
    free(ent);
    free(keys);
    m->track = track;
    if (rc) {
        di_err_set(&err, DI_ERR_NOMEM, "out of memory computing a mask");
        return di_err_publish(&err);
    }
    if (m->track && (drop_repeated_keys(m, mask) || drop_dead_ends(m, mask))) {
        di_err_set(&err, DI_ERR_NOMEM, "out of memory computing a mask");
        return di_err_publish(&err);
    }
    if (v->eos_id >= 0 && m->accept[m->n_sets - 1]) mask[v->eos_id >> 5] |= 1u << (v->eos_id & 31);
    return DI_OK;
}
