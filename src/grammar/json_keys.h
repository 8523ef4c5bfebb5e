/* Object keys seen so far in JSON output, so that the matcher can refuse a
 * key an open object already has (a JSON Schema or any-object grammar
 * cannot say "no repeated key" itself, and a model sampling under the mask
 * could otherwise repeat keys until the token limit).
 * Spec: ecosystem.md §1.4 (JSON output constraints).
 *
 * The tracker reads the output byte by byte (it relies on the grammar for
 * validity and only follows the structure: containers, strings, escapes).
 * Keys are compared decoded, as a JSON parser sees them: escapes resolved,
 * surrogate pairs joined, a lone surrogate kept as itself. Its state after
 * each byte is a small value (di_jk_state); the keys, frames and key bytes
 * live in append-only arenas that the state records the sizes of, so going
 * back to an earlier state (rollback, mask walks) just truncates. */
#ifndef DI_GRAMMAR_JSON_KEYS_H
#define DI_GRAMMAR_JSON_KEYS_H

#include <stdint.h>

typedef struct di_jk_state {
    uint32_t frame;            /* innermost open container (0: top level) */
    uint32_t key_off, key_len; /* key being read: start in the byte arena, decoded bytes so far */
    uint32_t hex, pend;        /* \u digits so far; pending high surrogate (0: none) */
    uint32_t n_frames, n_nodes, n_bytes; /* arena sizes at this point */
    uint8_t mode;              /* outside strings / in a key / in a value string */
    uint8_t esc;               /* 0, 1 after '\\', 2..5: \u and 0..3 hex digits */
} di_jk_state;

typedef struct di_jk_frame {
    uint32_t parent;
    uint32_t keys;      /* last completed key (node id + 1), 0: none */
    uint8_t is_object, expect_key;
} di_jk_frame;

typedef struct di_jk_node {
    uint32_t next;      /* previous key of the object (node id + 1), 0: none */
    uint32_t off, len;  /* decoded bytes in the byte arena */
} di_jk_node;

typedef struct di_json_keys {
    di_jk_frame *frames;
    uint32_t n_frames, cap_frames;
    di_jk_node *nodes;
    uint32_t n_nodes, cap_nodes;
    uint8_t *bytes;
    uint32_t n_bytes, cap_bytes;
} di_json_keys;

enum { DI_JK_OK = 0, DI_JK_DUPLICATE = 1, DI_JK_NOMEM = -1 };

/* Fills *start with the state before any output. Returns DI_JK_NOMEM on
 * allocation failure. */
int di_json_keys_init(di_json_keys *k, di_jk_state *start);
void di_json_keys_free(di_json_keys *k);
/* The state after byte b from state s (which must be the latest state kept
 * alive: arenas past it are dropped). DI_JK_DUPLICATE when b completes a
 * key its object already has. */
int di_json_keys_step(di_json_keys *k, const di_jk_state *s, uint8_t b, di_jk_state *out);
/* 1 inside an object key; inside a string value. */
int di_json_keys_in_key(const di_jk_state *s);
int di_json_keys_in_value(const di_jk_state *s);
/* 1 when an open object has a key already (only then can a key repeat). */
int di_json_keys_any(const di_json_keys *k, const di_jk_state *s);
/* 1 when s may be a dead end the grammar cannot see: a key is due or
 * begun in an object that has keys, and the ones the grammar still allows
 * might all be taken (the object's keys so far include one the key read so
 * far begins). */
int di_json_keys_may_dead_end(const di_json_keys *k, const di_jk_state *s);
/* Fewest '"' bytes a continuation from s must hold to complete a repeated
 * key (a token with fewer cannot be refused for that reason). */
uint32_t di_json_keys_min_quotes(const di_json_keys *k, const di_jk_state *s);

#endif
