/* libFuzzer target: arbitrary bytes as config.json (architecture.md §1).
 * A rejected document must come with a message; an accepted one must have
 * self-consistent derived roles, and (when small enough to enumerate) a
 * manifest without duplicate names and a plan that renders. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/manifest.h"
#include "model/planner.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_roles(const di_config *c) {
    for (int b = 0; b < c->n_blocks; b++) {
        const di_layer_role *r = &c->roles[b];
        if (r->ratio < 0 || r->ratio > 2) abort();
        if (r->ratio == 0 && (r->kv_src != -1 || r->isrc != -1 || r->owns_compressor || r->indexer)) abort();
        if (r->ratio > 0) {
            if (r->kv_src < 0 || r->kv_src > b || !c->roles[r->kv_src].owns_compressor) abort();
            if (r->isrc < r->kv_src || r->isrc > b || !c->roles[r->isrc].is_index_source) abort();
            if (c->roles[r->kv_src].ratio != r->ratio) abort();
        }
        if (r->is_dspark_stage != (b >= c->n_layers)) abort();
        if (r->n_active < 1 || r->n_active > r->n_experts) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    di_config c;
    di_err err = {0};
    if (di_config_parse((const char *)data, size, &c, &err) != DI_OK) {
        if (err.code == DI_OK || !err.msg[0]) abort();
        return 0;
    }
    check_roles(&c);
    char buf[256];
    for (int b = 0; b < c.n_blocks; b++) di_config_role_str(&c, b, buf, sizeof buf);
    /* Enumerating tensors is linear in experts x blocks: keep the fuzzer fast. */
    long experts = 0;
    for (int b = 0; b < c.n_blocks; b++) experts += c.roles[b].n_experts;
    if (experts > 4096) return 0;
    di_manifest m;
    if (di_manifest_build(&m, &c, NULL, &err) != DI_OK) abort();
    for (size_t i = 0; i < m.n; i++)
        if (di_manifest_find(&m, m.v[i].name) != &m.v[i]) abort();
    di_manifest_free(&m);
    di_plan p;
    if (di_plan_compute(&c, NULL, &p, &err) != DI_OK) abort();
    for (int j = 0; j < 2; j++) free(di_plan_render(&c, &p, j));
    return 0;
}
