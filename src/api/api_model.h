/* The opened model behind the public di_model handle: its config, its bound
 * weights and what holds their bytes (a checkpoint's mappings or a dummy
 * arena). Library code that runs a model reaches config and weights here. */
#ifndef DI_API_API_MODEL_H
#define DI_API_API_MODEL_H

#include "deepinfer.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/dummy.h"
#include "model/weights.h"

struct di_model {
    char *dir;            /* model folder (or the config file's folder for dummy) */
    di_config cfg;
    di_weights weights;   /* views into ck or dummy */
    di_checkpoint *ck;    /* DI_LOAD_AUTO */
    di_dummy *dummy;      /* DI_LOAD_DUMMY */
    uint64_t n_tensors;
    uint64_t weight_bytes;
    uint64_t engram_table_bytes; /* of weight_bytes: the Engram tables (kept in host memory by a device backend) */
    void *weights_mem;           /* the checkpoint's weights copied into memory (weights_in_memory), or NULL */
    size_t weights_mem_bytes;
};

#endif
