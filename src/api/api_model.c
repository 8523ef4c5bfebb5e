/* Public API: opening models (checkpoint or dummy weights), inspecting them,
 * memory plans, and the embedded default model's folder. */
#include "api/api_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/mem_avail.h"
#include "model/default_model.h"
#include "model/manifest.h"
#include "model/planner.h"
#include "model/weights_memory.h"

void di_model_options_default(di_model_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->load_format = DI_LOAD_AUTO;
    o->seed = DI_DEFAULT_MODEL_SEED;
}

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Config path and model folder for `path` (a folder, or a config file). */
static di_status locate(const char *path, int allow_file, char *cfg_path, size_t n, char **dir, di_err *err) {
    if (is_dir(path)) {
        if (snprintf(cfg_path, n, "%s/config.json", path) >= (int)n)
            return di_err_set(err, DI_ERR_LIMIT, "%s: path too long", path);
        *dir = strdup(path);
    } else {
        if (!allow_file)
            return di_err_set(err, DI_ERR_NOT_FOUND, "%s: not a model folder (expected config.json + safetensors)",
                              path);
        if (snprintf(cfg_path, n, "%s", path) >= (int)n) return di_err_set(err, DI_ERR_LIMIT, "%s: path too long", path);
        const char *slash = strrchr(path, '/');
        *dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    }
    return *dir ? DI_OK : di_err_set(err, DI_ERR_NOMEM, "out of memory");
}

/* weights_in_memory (deepinfer.h): 1 copies the bound weights out of the
 * shard mappings (model/weights_memory.h) or fails, 0 leaves them mapped,
 * -1 copies them where they take at most half of the memory available
 * (core/mem_avail.h: the system's, or a container's limit where lower; the
 * rest is left to the sequences' state and the page cache), and otherwise,
 * or where the block cannot be had, leaves them mapped. */
static di_status weights_to_memory(di_model *m, int want, di_err *err) {
    if (want < -1 || want > 1)
        return di_err_set(err, DI_ERR_INVALID_ARG, "weights_in_memory %d (expected -1, 0 or 1)", want);
    const char *env = getenv("DI_WEIGHTS_IN_MEMORY");
    if (want < 0 && env && *env) {
        if (strcmp(env, "0") && strcmp(env, "1"))
            return di_err_set(err, DI_ERR_INVALID_ARG, "DI_WEIGHTS_IN_MEMORY=\"%.40s\": expected 0 or 1", env);
        want = env[0] == '1';
    }
    if (want == 0) return DI_OK;
    if (want < 0 && di_weights_memory_bytes(&m->weights, &m->cfg) > di_mem_available() / 2) return DI_OK;
    di_err ignored = {0};
    void *block = NULL;
    size_t bytes = 0;
    di_status st = di_weights_copy_to_memory(&m->weights, &m->cfg, 0, &block, &bytes, want > 0 ? err : &ignored);
    if (st) return want > 0 ? di_err_prefix(err, "%s: ", m->dir) : DI_OK;
    m->weights_mem = block;
    m->weights_mem_bytes = bytes;
    di_checkpoint_drop_pages(m->ck);
    return DI_OK;
}

static void count_bound(di_model *m) {
    di_manifest man;
    if (di_manifest_build(&man, &m->cfg, &m->weights, NULL)) return;
    for (size_t i = 0; i < man.n; i++)
        if (man.v[i].slot->dtype != DI_DTYPE_INVALID) {
            m->n_tensors++;
            m->weight_bytes += man.v[i].slot->nbytes;
            if (man.v[i].role == DI_TR_ENGRAM_TABLE || man.v[i].role == DI_TR_ENGRAM_SCALE)
                m->engram_table_bytes += man.v[i].slot->nbytes;
        }
    di_manifest_free(&man);
}

static di_status open_model(di_model *m, const char *path, const di_model_options *o, di_err *err) {
    char cfg_path[4200];
    int dummy = o->load_format == DI_LOAD_DUMMY;
    if (o->load_format != DI_LOAD_AUTO && !dummy)
        return di_err_set(err, DI_ERR_INVALID_ARG, "load_format %d (supported: 0 auto, 1 dummy)", (int)o->load_format);
    di_status st = locate(path, dummy, cfg_path, sizeof cfg_path, &m->dir, err);
    if (st) return st;
    st = di_config_load(cfg_path, &m->cfg, err);
    if (st) return st;
    st = di_weights_init(&m->weights, &m->cfg, err);
    if (st) return st;
    di_tensor_source src;
    if (dummy) {
        di_dummy_options d;
        di_dummy_options_default(&d);
        d.seed = o->seed;
        d.block_begin = o->dummy_block_begin;
        d.block_end = o->dummy_block_end;
        d.max_bytes = o->dummy_max_bytes;
        if (o->dummy_lazy) {
            d.block_begin = m->cfg.n_blocks;
            d.block_end = 0;
            d.globals = 0;
            d.engram_tables = 0;
        }
        m->dummy = calloc(1, sizeof *m->dummy);
        if (!m->dummy) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
        st = di_dummy_build(m->dummy, &m->cfg, &d, err);
        if (st) {
            free(m->dummy);
            m->dummy = NULL;
            return st;
        }
        di_dummy_source(&src, m->dummy);
    } else {
        st = di_checkpoint_open(m->dir, &m->ck, err);
        if (st) return st;
        di_weights_source_checkpoint(&src, m->ck);
    }
    st = di_weights_bind(&m->weights, &m->cfg, &src, err);
    if (st) return di_err_prefix(err, "%s: ", m->dir);
    if (m->ck && o->verify_data) {
        di_ckpt_read_stats rs;
        st = di_checkpoint_read_all(m->ck, &rs, err);
        if (st) return st;
    }
    if (m->ck) {
        st = weights_to_memory(m, o->weights_in_memory, err);
        if (st) return st;
    }
    count_bound(m);
    return DI_OK;
}

di_status di_model_open(const char *path, const di_model_options *opts, di_model **out) {
    di_err err = {0};
    if (!path || !out) return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_model_open: NULL argument");
    *out = NULL;
    di_model_options def;
    if (!opts) {
        di_model_options_default(&def);
        opts = &def;
    }
    di_model *m = calloc(1, sizeof *m);
    if (!m) return di_err_publish_msg(DI_ERR_NOMEM, "out of memory");
    di_status st = open_model(m, path, opts, &err);
    if (st) {
        di_model_close(m);
        return di_err_publish(&err);
    }
    *out = m;
    return DI_OK;
}

void di_model_close(di_model *m) {
    if (!m) return;
    di_weights_free(&m->weights);
    if (m->dummy) {
        di_dummy_free(m->dummy);
        free(m->dummy);
    }
    free(m->weights_mem);
    di_checkpoint_close(m->ck);
    free(m->dir);
    free(m);
}

di_status di_model_get_info(const di_model *m, di_model_info *out) {
    if (!m || !out) return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_model_get_info: NULL argument");
    memset(out, 0, sizeof *out);
    out->n_layers = m->cfg.n_layers;
    out->n_dspark_stages = m->cfg.n_mtp;
    out->hidden_size = m->cfg.dim;
    out->vocab_size = m->cfg.vocab_size;
    out->n_routed_experts = m->cfg.n_routed_experts;
    out->n_active_experts = m->cfg.n_active_experts;
    out->n_tensors = m->n_tensors;
    out->weight_bytes = m->weight_bytes;
    out->resident_bytes = m->dummy ? m->dummy->arena_bytes : m->weight_bytes;
    out->is_dummy = m->dummy != NULL;
    out->in_memory_bytes = m->weights_mem ? m->weights_mem_bytes : 0;
    return DI_OK;
}

di_status di_model_describe(const di_model *m, char **out) {
    if (!m || !out) return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_model_describe: NULL argument");
    const di_config *c = &m->cfg;
    size_t cap = 4096 + (size_t)c->n_blocks * 160, k = 0;
    char *s = malloc(cap);
    if (!s) return di_err_publish_msg(DI_ERR_NOMEM, "out of memory");
#define OUT(...) (k += (size_t)snprintf(s + (k < cap ? k : cap), k < cap ? cap - k : 0, __VA_ARGS__))
    OUT("model     %s (%s)\n", m->dir, m->dummy ? "dummy weights" : "checkpoint");
    OUT("shape     %d layers + %d DSpark stages, hidden %lld, vocab %lld, %d heads x %lld (rope %lld)\n",
        c->n_layers, c->n_mtp, (long long)c->dim, (long long)c->vocab_size, c->n_heads, (long long)c->head_dim,
        (long long)c->rope_dim);
    OUT("moe       %d routed experts (top %d) + %d shared, inter %lld; DSpark %d (top %d)\n", c->n_routed_experts,
        c->n_active_experts, c->n_shared_experts, (long long)c->moe_inter, c->dspark_n_experts, c->dspark_n_active);
    OUT("attention window %d, index top-%d of %d heads x %lld, candidate pool %d x %d (layer %d)\n", c->window,
        c->index_topk, c->index_n_heads, (long long)c->index_head_dim, c->candidate_topk_blocks,
        c->candidate_block_size, c->candidate_source);
    OUT("engram    %d layers, %d-grams x %d heads x %lld\n", c->n_engram, c->engram_max_ngram, c->engram_n_heads,
        (long long)c->engram_head_dim);
    OUT("weights   %llu tensors, %.3f MB", (unsigned long long)m->n_tensors, (double)m->weight_bytes / 1e6);
    if (m->weights_mem) OUT(" (copied into memory: %.3f MB)", (double)m->weights_mem_bytes / 1e6);
    if (m->dummy) OUT(" (%.3f MB in memory, seed %llu)", (double)m->dummy->arena_bytes / 1e6, (unsigned long long)m->dummy->seed);
    OUT("\nlayers\n");
    for (int b = 0; b < c->n_blocks; b++) {
        char role[160], prefix[24];
        di_config_role_str(c, b, role, sizeof role);
        di_config_block_prefix(c, b, prefix, sizeof prefix);
        prefix[strlen(prefix) - 1] = 0;
        OUT("  %-10s %s\n", prefix, role);
    }
#undef OUT
    if (k >= cap) s[cap - 1] = 0;
    *out = s;
    return DI_OK;
}

di_status di_model_plan(const di_model *m, int as_json, uint64_t context_tokens, uint32_t batch, double device_gib,
                        char **out) {
    di_err err = {0};
    if (!m || !out) return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_model_plan: NULL argument");
    di_plan_request r;
    di_plan_request_default(&r);
    if (context_tokens) r.context = context_tokens;
    if (batch) r.batch = batch;
    if (device_gib > 0) r.device_gib = device_gib;
    di_plan p;
    di_status st = di_plan_compute(&m->cfg, &r, &p, &err);
    if (st) return di_err_publish(&err);
    *out = di_plan_render(&m->cfg, &p, as_json);
    if (!*out) return di_err_publish_msg(DI_ERR_NOMEM, "out of memory");
    return DI_OK;
}

di_status di_default_model_path(char *buf, size_t buf_size) {
    di_err err = {0};
    if (!buf || !buf_size)
        return di_err_publish_msg(DI_ERR_INVALID_ARG, "di_default_model_path: no buffer");
    di_status st = di_default_model_ensure(buf, buf_size, NULL, &err);
    return st ? di_err_publish(&err) : DI_OK;
}
