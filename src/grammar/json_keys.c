/* Repeated-key tracking over JSON output. Spec: ecosystem.md §1.4. */
#include "grammar/json_keys.h"
#include "grammar/grow.h"

#include <stdlib.h>
#include <string.h>

enum { OUT = 0, IN_KEY = 1, IN_VALUE = 2 };

int di_json_keys_init(di_json_keys *k, di_jk_state *start) {
    memset(k, 0, sizeof *k);
    memset(start, 0, sizeof *start);
    /* every arena allocated up front: never a NULL base, even for empty keys */
    if (di_grow((void **)&k->frames, &k->cap_frames, 1, sizeof *k->frames) ||
        di_grow((void **)&k->nodes, &k->cap_nodes, 1, sizeof *k->nodes) || di_grow((void **)&k->bytes, &k->cap_bytes, 1, 1)) {
        di_json_keys_free(k);
        return DI_JK_NOMEM;
    }
    k->frames[0] = (di_jk_frame){0, 0, 0, 0};
    k->n_frames = 1;
    start->n_frames = 1;
    return DI_JK_OK;
}

void di_json_keys_free(di_json_keys *k) {
    free(k->frames);
    free(k->nodes);
    free(k->bytes);
    memset(k, 0, sizeof *k);
}

static int push_frame(di_json_keys *k, di_jk_frame f, uint32_t *id) {
    if (di_grow((void **)&k->frames, &k->cap_frames, k->n_frames + 1, sizeof *k->frames)) return DI_JK_NOMEM;
    k->frames[k->n_frames] = f;
    *id = k->n_frames++;
    return DI_JK_OK;
}

static int put_bytes(di_json_keys *k, di_jk_state *o, const uint8_t *b, uint32_t n) {
    if (di_grow((void **)&k->bytes, &k->cap_bytes, k->n_bytes + n, 1)) return DI_JK_NOMEM;
    memcpy(k->bytes + k->n_bytes, b, n);
    k->n_bytes += n;
    o->key_len += n;
    return DI_JK_OK;
}

/* A decoded code point of the key, as UTF-8 (lone surrogates in the same
 * three-byte form, so that they stay distinct from every character). */
static int put_cp(di_json_keys *k, di_jk_state *o, uint32_t cp) {
    uint8_t u[4];
    uint32_t n;
    if (cp < 0x80) { u[0] = (uint8_t)cp; n = 1; }
    else if (cp < 0x800) { u[0] = (uint8_t)(0xC0 | cp >> 6); u[1] = (uint8_t)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        u[0] = (uint8_t)(0xE0 | cp >> 12);
        u[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        u[2] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (uint8_t)(0xF0 | cp >> 18);
        u[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
        u[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        u[3] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return put_bytes(k, o, u, n);
}

/* Emits a pending high surrogate that no low surrogate followed. */
static int flush_pending(di_json_keys *k, di_jk_state *o) {
    if (!o->pend) return DI_JK_OK;
    uint32_t p = o->pend;
    o->pend = 0;
    return put_cp(k, o, p);
}

/* The key of o is complete: refuse it if its object has it already, else
 * record it in a new version of the frame. */
static int key_done(di_json_keys *k, di_jk_state *o) {
    if (flush_pending(k, o)) return DI_JK_NOMEM;
    const uint8_t *key = k->bytes + o->key_off;
    for (uint32_t x = k->frames[o->frame].keys; x; x = k->nodes[x - 1].next) {
        const di_jk_node *nd = &k->nodes[x - 1];
        if (nd->len == o->key_len && !memcmp(k->bytes + nd->off, key, o->key_len)) return DI_JK_DUPLICATE;
    }
    if (di_grow((void **)&k->nodes, &k->cap_nodes, k->n_nodes + 1, sizeof *k->nodes)) return DI_JK_NOMEM;
    k->nodes[k->n_nodes] = (di_jk_node){k->frames[o->frame].keys, o->key_off, o->key_len};
    k->n_nodes++;
    di_jk_frame f = k->frames[o->frame];
    f.keys = k->n_nodes;
    f.expect_key = 0; /* ':' and the value come next */
    return push_frame(k, f, &o->frame);
}

static int hexval(uint8_t b) {
    if (b >= '0' && b <= '9') return b - '0';
    if (b >= 'a' && b <= 'f') return b - 'a' + 10;
    if (b >= 'A' && b <= 'F') return b - 'A' + 10;
    return 0; /* not reached on valid JSON */
}

static int key_byte(di_json_keys *k, di_jk_state *o, uint8_t b) {
    if (o->esc == 1) {
        o->esc = 0;
        uint8_t c = b;
        switch (b) {
        case 'u': o->esc = 2; o->hex = 0; return DI_JK_OK;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        default: break; /* '"', '\\', '/' stand for themselves */
        }
        if (flush_pending(k, o)) return DI_JK_NOMEM;
        return put_bytes(k, o, &c, 1);
    }
    if (o->esc >= 2) {
        o->hex = o->hex << 4 | (uint32_t)hexval(b);
        if (++o->esc < 6) return DI_JK_OK;
        o->esc = 0;
        uint32_t cp = o->hex;
        if (o->pend && cp >= 0xDC00 && cp <= 0xDFFF) {
            cp = 0x10000 + ((o->pend - 0xD800) << 10) + (cp - 0xDC00);
            o->pend = 0;
            return put_cp(k, o, cp);
        }
        if (flush_pending(k, o)) return DI_JK_NOMEM;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            o->pend = cp;
            return DI_JK_OK;
        }
        return put_cp(k, o, cp);
    }
    if (b == '\\') { o->esc = 1; return DI_JK_OK; }
    if (b == '"') {
        o->mode = OUT;
        return key_done(k, o);
    }
    if (flush_pending(k, o)) return DI_JK_NOMEM;
    return put_bytes(k, o, &b, 1);
}

int di_json_keys_step(di_json_keys *k, const di_jk_state *s, uint8_t b, di_jk_state *out) {
    /* drop what states after s appended */
    k->n_frames = s->n_frames;
    k->n_nodes = s->n_nodes;
    k->n_bytes = s->n_bytes;
    di_jk_state o = *s;
    int rc = DI_JK_OK;
    const di_jk_frame *f = &k->frames[o.frame];
    switch (o.mode) {
    case IN_VALUE:
        if (o.esc) o.esc = 0;
        else if (b == '\\') o.esc = 1;
        else if (b == '"') o.mode = OUT;
        break;
    case IN_KEY:
        rc = key_byte(k, &o, b);
        break;
    default:
        if (b == '{' || b == '[') {
            rc = push_frame(k, (di_jk_frame){o.frame, 0, b == '{', b == '{'}, &o.frame);
        } else if (b == '}' || b == ']') {
            o.frame = f->parent;
        } else if (b == '"') {
            if (f->is_object && f->expect_key) {
                o.mode = IN_KEY;
                o.key_off = k->n_bytes;
                o.key_len = 0;
                o.pend = 0;
                o.esc = 0;
            } else {
                o.mode = IN_VALUE;
                o.esc = 0;
            }
        } else if ((b == ':' || b == ',') && f->is_object) {
            di_jk_frame g = *f;
            g.expect_key = b == ',';
            rc = push_frame(k, g, &o.frame);
        }
        break;
    }
    o.n_frames = k->n_frames;
    o.n_nodes = k->n_nodes;
    o.n_bytes = k->n_bytes;
    *out = o;
    return rc;
}

int di_json_keys_in_key(const di_jk_state *s) { return s->mode == IN_KEY; }
int di_json_keys_in_value(const di_jk_state *s) { return s->mode == IN_VALUE; }

int di_json_keys_any(const di_json_keys *k, const di_jk_state *s) {
    for (uint32_t f = s->frame; f; f = k->frames[f].parent)
        if (k->frames[f].keys) return 1;
    return 0;
}

/* 1 when the key read so far begins a key its object has. */
static int begins_a_key(const di_json_keys *k, const di_jk_state *s) {
    for (uint32_t x = k->frames[s->frame].keys; x; x = k->nodes[x - 1].next) {
        const di_jk_node *nd = &k->nodes[x - 1];
        if (nd->len >= s->key_len && !memcmp(k->bytes + nd->off, k->bytes + s->key_off, s->key_len)) return 1;
    }
    return 0;
}

int di_json_keys_may_dead_end(const di_json_keys *k, const di_jk_state *s) {
    const di_jk_frame *f = &k->frames[s->frame];
    if (s->mode == IN_KEY) return begins_a_key(k, s);
    return s->mode == OUT && f->is_object && f->expect_key && f->keys;
}

uint32_t di_json_keys_min_quotes(const di_json_keys *k, const di_jk_state *s) {
    if (s->mode == IN_KEY) return begins_a_key(k, s) ? 1 : 3; /* else: close it, then a second key */
    int any = di_json_keys_any(k, s);
    if (s->mode == IN_VALUE) return any ? 3 : 5;
    return any ? 2 : 4;
}
