/* Dummy weights: random tensors of any config in the official checkpoint
 * formats (architecture.md §8.2, §8.3), built in memory without files.
 *
 * Every byte is a pure function of (seed, tensor name, byte position): a
 * counter-based hash, so generation is parallel, independent of order, and
 * any slice of any tensor can be produced on demand (di_dummy_fill) — which
 * is how a 510 GB config is used on a small machine: materialise a range of
 * blocks, or none, and fill the rest when needed.
 *
 * Values are chosen so a random network stays calm: FP8/FP4 weights whose
 * power-of-two scales (one per 32x32 tile / 32 inputs) vary by 2^{-1,0,+1}
 * around a per-tensor base such that the effective weight std is about
 * 1/sqrt(fan_in) (within the factor sqrt(2) of a power-of-two base); BF16 Linears N(0, 1/fan_in); norms and Engram q/k weights
 * 1 + N(0, 0.02²); mHC projections small (std 0.1/sqrt(fan_in)), bases
 * N(0, 0.1²), scales ~1; router bias N(0, 0.01²); attention sinks N(0, 1);
 * embeddings and Engram rows N(0, 1). */
#ifndef DI_MODEL_DUMMY_H
#define DI_MODEL_DUMMY_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "model/config.h"
#include "model/manifest.h"
#include "model/weights.h"

typedef struct di_dummy_options {
    uint64_t seed;
    int block_begin;    /* materialise blocks [block_begin, block_end) ... */
    int block_end;      /* ... block_end <= 0 means all blocks */
    int globals;        /* materialise embed/head/norm and the DSpark extras (1 default) */
    int engram_tables;  /* materialise Engram embed tables (1 default; 2 x 98 GB in the real config) */
    uint64_t max_bytes; /* fail instead of allocating more than this (0 = no cap) */
    int threads;        /* 0 = one per online CPU */
} di_dummy_options;

void di_dummy_options_default(di_dummy_options *o);

typedef struct di_dummy {
    uint64_t seed;
    di_weights weights;  /* every view has dtype+shape; data NULL where not materialised */
    di_manifest manifest; /* slots point into `weights` */
    void *arena;         /* materialised bytes, owned */
    size_t arena_bytes;
    uint64_t lazy_bytes; /* bytes of tensors left unmaterialised */
} di_dummy;

/* Builds the dummy weights of cfg. */
di_status di_dummy_build(di_dummy *d, const di_config *cfg, const di_dummy_options *opt, di_err *err);
void di_dummy_free(di_dummy *d);

/* Writes bytes [offset, offset+n) of the tensor described by e, exactly as
 * di_dummy_build lays them out for `seed`. */
void di_dummy_fill(uint64_t seed, const di_manifest_entry *e, uint64_t offset, void *dst, size_t n);

/* The dummy's tensors as a tensor source (for di_weights_bind and writers):
 * every manifest tensor, materialised or not. */
void di_dummy_source(di_tensor_source *src, di_dummy *d);

#endif
