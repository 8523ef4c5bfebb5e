/* config.json parsing, validation and per-layer role derivation
 * (architecture.md §1.1–§1.3). */
#include "model/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file_read.h"

/* Largest config.json we accept: the real one is 4 KB. */
#define CFG_MAX_FILE_BYTES (16u << 20)
/* Routed experts per layer. The real model has 384; the cap keeps the tensor
 * list of any accepted config (6 tensors per expert per block) in memory. */
#define CFG_MAX_EXPERTS 2048

/* Keys are looked up in `text_config` first, then at the top level, so both
 * the HF layout and a flat text-only file work. Messages name the key with
 * the object it came from. */
typedef struct cfg_reader {
    const cJSON *text;
    const cJSON *top;
    di_err *err;
} cfg_reader;

static const cJSON *cfg_get(const cfg_reader *r, const char *key, char *path, size_t n) {
    const cJSON *v = r->text ? cJSON_GetObjectItemCaseSensitive(r->text, key) : NULL;
    if (v) {
        snprintf(path, n, "text_config.%s", key);
        return v;
    }
    v = cJSON_GetObjectItemCaseSensitive(r->top, key);
    snprintf(path, n, "%s", key);
    return v;
}

static di_status missing(const cfg_reader *r, const char *key) {
    return di_err_set(r->err, DI_ERR_FORMAT, "missing required key \"%s\" (in text_config or at top level)",
                      key);
}

/* An integral JSON number in [lo, hi]. */
static di_status json_int(const cJSON *v, const char *path, int64_t lo, int64_t hi, int64_t *out,
                          di_err *err) {
    if (!cJSON_IsNumber(v))
        return di_err_set(err, DI_ERR_FORMAT, "%s: expected an integer in [%lld, %lld]", path,
                          (long long)lo, (long long)hi);
    double d = v->valuedouble;
    if (!(d == floor(d)) || d < (double)lo || d > (double)hi)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "%s: %g is not an integer in the supported range [%lld, %lld]",
                          path, d, (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return DI_OK;
}

static di_status get_int(const cfg_reader *r, const char *key, int required, int64_t def, int64_t lo,
                         int64_t hi, int64_t *out) {
    char path[96];
    const cJSON *v = cfg_get(r, key, path, sizeof path);
    if (!v || cJSON_IsNull(v)) {
        if (required) return missing(r, key);
        *out = def;
        return DI_OK;
    }
    return json_int(v, path, lo, hi, out, r->err);
}

/* get_int into an int field. */
static di_status get_i(const cfg_reader *r, const char *key, int required, int64_t def, int64_t lo,
                       int64_t hi, int *out) {
    int64_t v;
    di_status st = get_int(r, key, required, def, lo, hi, &v);
    if (st == DI_OK) *out = (int)v;
    return st;
}

/* A dimension that quantized GEMMs tile by 32. */
static di_status get_dim32(const cfg_reader *r, const char *key, int64_t hi, int64_t *out) {
    di_status st = get_int(r, key, 1, 0, 32, hi, out);
    if (st) return st;
    if (*out % 32)
        return di_err_set(r->err, DI_ERR_UNSUPPORTED,
                          "%s: %lld is not a multiple of 32 (supported: multiples of 32 in [32, %lld]; FP8/FP4 "
                          "weights use 32-wide blocks)",
                          key, (long long)*out, (long long)hi);
    return DI_OK;
}

static di_status get_num(const cfg_reader *r, const char *key, int required, double def, double lo, double hi,
                         double *out) {
    char path[96];
    const cJSON *v = cfg_get(r, key, path, sizeof path);
    if (!v || cJSON_IsNull(v)) {
        if (required) return missing(r, key);
        *out = def;
        return DI_OK;
    }
    if (!cJSON_IsNumber(v))
        return di_err_set(r->err, DI_ERR_FORMAT, "%s: expected a number in [%g, %g]", path, lo, hi);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return di_err_set(r->err, DI_ERR_UNSUPPORTED, "%s: %g is outside the supported range [%g, %g]", path,
                          v->valuedouble, lo, hi);
    *out = v->valuedouble;
    return DI_OK;
}

static di_status get_bool(const cfg_reader *r, const char *key, int def, int *out) {
    char path[96];
    const cJSON *v = cfg_get(r, key, path, sizeof path);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return DI_OK;
    }
    if (!cJSON_IsBool(v)) return di_err_set(r->err, DI_ERR_FORMAT, "%s: expected true or false", path);
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return DI_OK;
}

/* An optional string that, when present, must equal `want`. */
static di_status want_str(const cJSON *obj, const char *objname, const char *key, const char *want, di_err *err) {
    const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (!v || cJSON_IsNull(v)) return DI_OK;
    if (!cJSON_IsString(v))
        return di_err_set(err, DI_ERR_FORMAT, "%s%s: expected a string (supported: \"%s\")", objname, key, want);
    if (strcmp(v->valuestring, want))
        return di_err_set(err, DI_ERR_UNSUPPORTED, "%s%s: \"%.64s\" is not supported (supported: \"%s\")", objname,
                          key, v->valuestring, want);
    return DI_OK;
}

static di_status want_text_str(const cfg_reader *r, const char *key, const char *want) {
    char path[96];
    const cJSON *v = cfg_get(r, key, path, sizeof path);
    if (!v) return DI_OK;
    const cJSON *obj = (r->text && cJSON_GetObjectItemCaseSensitive(r->text, key)) ? r->text : r->top;
    return want_str(obj, obj == r->text ? "text_config." : "", key, want, r->err);
}

/* A list of integers in [lo, hi], at most max entries. */
static di_status get_list(const cfg_reader *r, const char *key, int required, int max, int64_t lo, int64_t hi,
                          int64_t *out, int *n) {
    char path[96];
    const cJSON *v = cfg_get(r, key, path, sizeof path);
    *n = 0;
    if (!v || cJSON_IsNull(v)) return required ? missing(r, key) : DI_OK;
    if (!cJSON_IsArray(v))
        return di_err_set(r->err, DI_ERR_FORMAT, "%s: expected a list of integers in [%lld, %lld]", path,
                          (long long)lo, (long long)hi);
    int count = cJSON_GetArraySize(v);
    if (count > max)
        return di_err_set(r->err, DI_ERR_LIMIT, "%s: %d entries, at most %d supported", path, count, max);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        char ipath[128];
        snprintf(ipath, sizeof ipath, "%s[%d]", path, i);
        di_status st = json_int(it, ipath, lo, hi, &out[i], r->err);
        if (st) return st;
        i++;
    }
    *n = i;
    return DI_OK;
}

/* Strictly increasing layer ids, each a backbone layer. */
static di_status check_layer_list(const char *key, const int *ids, int n, int n_layers, di_err *err) {
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n_layers)
            return di_err_set(err, DI_ERR_UNSUPPORTED, "%s[%d]: layer %d is out of range [0, %d)", key, i, ids[i],
                              n_layers);
        if (i && ids[i] <= ids[i - 1])
            return di_err_set(err, DI_ERR_UNSUPPORTED, "%s: layer ids must be strictly increasing (%d after %d)",
                              key, ids[i], ids[i - 1]);
    }
    return DI_OK;
}

static int list_index(const int *ids, int n, int id) {
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return i;
    return -1;
}

#define TRY(x)                                 \
    do {                                       \
        di_status st_ = (x);                   \
        if (st_ != DI_OK) return st_;          \
    } while (0)

static di_status parse_quant(const cJSON *root, di_config *c, di_err *err) {
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (!q || cJSON_IsNull(q))
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "quantization_config: missing (supported: quant_method \"fp8\" with weight_block_size "
                          "[32, 32] and expert_dtype \"fp4\")");
    if (!cJSON_IsObject(q)) return di_err_set(err, DI_ERR_FORMAT, "quantization_config: expected an object");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    if (!cJSON_IsString(m))
        return di_err_set(err, DI_ERR_FORMAT, "quantization_config.quant_method: expected a string (supported: \"fp8\")");
    TRY(want_str(q, "quantization_config.", "quant_method", "fp8", err));
    c->quant_fp8 = 1;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
    if (!cJSON_IsArray(b) || cJSON_GetArraySize(b) != 2)
        return di_err_set(err, DI_ERR_FORMAT, "quantization_config.weight_block_size: expected [32, 32]");
    for (int i = 0; i < 2; i++) {
        int64_t v;
        char path[64];
        snprintf(path, sizeof path, "quantization_config.weight_block_size[%d]", i);
        TRY(json_int(cJSON_GetArrayItem(b, i), path, 1, 1 << 16, &v, err));
        if (v != 32)
            return di_err_set(err, DI_ERR_UNSUPPORTED, "%s: %lld is not supported (supported: [32, 32])", path,
                              (long long)v);
        c->quant_block[i] = (int)v;
    }
    TRY(want_str(q, "quantization_config.", "scale_fmt", "ue8m0", err));
    TRY(want_str(q, "quantization_config.", "activation_scheme", "dynamic", err));
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(q, "expert_dtype");
    if (!cJSON_IsString(e))
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "quantization_config.expert_dtype: missing or not a string (supported: \"fp4\")");
    TRY(want_str(q, "quantization_config.", "expert_dtype", "fp4", err));
    c->expert_fp4 = 1;
    return DI_OK;
}

static di_status parse_rope_scaling(const cfg_reader *r, di_config *c) {
    char path[96];
    const cJSON *s = cfg_get(r, "rope_scaling", path, sizeof path);
    c->yarn_enabled = 0;
    c->yarn_factor = 1;
    c->yarn_beta_fast = 32;
    c->yarn_beta_slow = 1;
    c->yarn_original_max_pos = 0;
    if (!s || cJSON_IsNull(s)) return DI_OK;
    if (!cJSON_IsObject(s)) return di_err_set(r->err, DI_ERR_FORMAT, "%s: expected an object", path);
    char obj[112];
    snprintf(obj, sizeof obj, "%s.", path);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (!cJSON_IsString(t))
        return di_err_set(r->err, DI_ERR_FORMAT, "%srope_type: expected a string (supported: \"yarn\")", obj);
    if (strcmp(t->valuestring, "yarn"))
        return di_err_set(r->err, DI_ERR_UNSUPPORTED, "%srope_type: \"%.64s\" is not supported (supported: \"yarn\")",
                          obj, t->valuestring);
    cfg_reader sub = {s, s, r->err};
    int64_t orig;
    TRY(get_num(&sub, "factor", 1, 0, 1, 1e6, &c->yarn_factor));
    TRY(get_num(&sub, "beta_fast", 0, 32, 1e-6, 1e6, &c->yarn_beta_fast));
    TRY(get_num(&sub, "beta_slow", 0, 1, 1e-6, 1e6, &c->yarn_beta_slow));
    TRY(get_int(&sub, "original_max_position_embeddings", 1, 0, 1, (int64_t)1 << 40, &orig));
    c->yarn_original_max_pos = orig;
    c->yarn_enabled = 1;
    return DI_OK;
}

static di_status parse_doc(const cJSON *root, di_config *c, di_err *err) {
    if (!cJSON_IsObject(root)) return di_err_set(err, DI_ERR_FORMAT, "expected a JSON object at the top level");
    cfg_reader r = {NULL, root, err};
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (tc && !cJSON_IsNull(tc)) {
        if (!cJSON_IsObject(tc)) return di_err_set(err, DI_ERR_FORMAT, "text_config: expected an object");
        r.text = tc;
    }
    memset(c, 0, sizeof *c);

    TRY(want_text_str(&r, "hidden_act", "silu"));
    TRY(want_text_str(&r, "scoring_func", "sqrtsoftplus"));
    TRY(want_text_str(&r, "topk_method", "noaux_tc"));
    int tie = 0;
    TRY(get_bool(&r, "tie_word_embeddings", 0, &tie));
    if (tie) return di_err_set(err, DI_ERR_UNSUPPORTED, "tie_word_embeddings: true is not supported (supported: false)");
    int attn_bias = 0;
    TRY(get_bool(&r, "attention_bias", 0, &attn_bias));
    if (attn_bias) return di_err_set(err, DI_ERR_UNSUPPORTED, "attention_bias: true is not supported (supported: false)");

    TRY(get_int(&r, "vocab_size", 1, 0, 16, (int64_t)1 << 24, &c->vocab_size));
    TRY(get_dim32(&r, "hidden_size", 1 << 16, &c->dim));
    TRY(get_dim32(&r, "moe_intermediate_size", 1 << 16, &c->moe_inter));
    TRY(get_i(&r, "num_hidden_layers", 1, 0, 1, DI_CFG_MAX_BLOCKS - 8, &c->n_layers));
    TRY(get_i(&r, "num_attention_heads", 1, 0, 1, 1024, &c->n_heads));
    TRY(get_i(&r, "num_key_value_heads", 0, 1, 1, 1, &c->n_kv_heads));
    TRY(get_dim32(&r, "head_dim", 4096, &c->head_dim));
    TRY(get_int(&r, "qk_rope_head_dim", 1, 0, 2, 4096, &c->rope_dim));
    if (c->rope_dim % 2 || c->rope_dim > c->head_dim)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "qk_rope_head_dim: %lld must be even and at most head_dim (%lld)",
                          (long long)c->rope_dim, (long long)c->head_dim);
    TRY(get_dim32(&r, "q_lora_rank", 1 << 16, &c->q_lora_rank));
    TRY(get_dim32(&r, "o_lora_rank", 1 << 16, &c->o_lora_rank));
    TRY(get_i(&r, "o_groups", 1, 0, 1, 1024, &c->o_groups));
    if (c->n_heads % c->o_groups)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "o_groups: %d does not divide num_attention_heads (%d)", c->o_groups,
                          c->n_heads);
    if (((int64_t)c->n_heads * c->head_dim / c->o_groups) % 32)
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "o_groups: num_attention_heads*head_dim/o_groups = %lld is not a multiple of 32",
                          (long long)((int64_t)c->n_heads * c->head_dim / c->o_groups));
    TRY(get_num(&r, "swiglu_limit", 0, 0, 0, 1e9, &c->swiglu_limit));
    TRY(get_num(&r, "rms_norm_eps", 0, 1e-6, 0, 1, &c->eps));
    TRY(get_int(&r, "max_position_embeddings", 0, 1 << 20, 1, (int64_t)1 << 40, &c->max_position));
    TRY(get_num(&r, "rope_theta", 0, 10000, 1, 1e12, &c->rope_theta));
    TRY(parse_rope_scaling(&r, c));
    TRY(get_i(&r, "n_routed_experts", 1, 0, 1, CFG_MAX_EXPERTS, &c->n_routed_experts));
    TRY(get_i(&r, "n_shared_experts", 0, 1, 1, 1, &c->n_shared_experts));
    TRY(get_i(&r, "num_experts_per_tok", 1, 0, 1, c->n_routed_experts, &c->n_active_experts));
    TRY(get_bool(&r, "norm_topk_prob", 1, &c->norm_topk_prob));
    TRY(get_num(&r, "routed_scaling_factor", 0, 1.0, 0, 1e6, &c->route_scale));
    c->gate_temp = 1.0;
    TRY(get_i(&r, "sliding_window", 1, 0, 1, 1 << 20, &c->window));
    TRY(get_num(&r, "compress_rope_theta", 0, c->rope_theta, 1, 1e12, &c->compress_rope_theta));
    TRY(get_i(&r, "num_nextn_predict_layers", 0, 0, 0, 8, &c->n_mtp));
    c->n_blocks = c->n_layers + c->n_mtp;

    int64_t buf[DI_CFG_MAX_BLOCKS];
    int n;
    TRY(get_list(&r, "compress_ratios", 1, DI_CFG_MAX_BLOCKS, 0, 2, buf, &n));
    if (n != c->n_blocks)
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "compress_ratios: %d entries, expected num_hidden_layers + num_nextn_predict_layers = %d", n,
                          c->n_blocks);
    for (int i = 0; i < n; i++) c->compress_ratios[i] = (int)buf[i];
    TRY(get_list(&r, "kv_source_layer_ids", 1, DI_CFG_MAX_BLOCKS, 0, DI_CFG_MAX_BLOCKS, buf, &n));
    c->n_kv_sources = n;
    for (int i = 0; i < n; i++) c->kv_sources[i] = (int)buf[i];
    TRY(get_list(&r, "index_source_layer_ids", 1, DI_CFG_MAX_BLOCKS, 0, DI_CFG_MAX_BLOCKS, buf, &n));
    c->n_index_sources = n;
    for (int i = 0; i < n; i++) c->index_sources[i] = (int)buf[i];
    TRY(get_i(&r, "index_n_heads", 1, 0, 1, 1024, &c->index_n_heads));
    TRY(get_dim32(&r, "index_head_dim", 4096, &c->index_head_dim));
    if (c->index_head_dim < c->rope_dim)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "index_head_dim: %lld is smaller than qk_rope_head_dim (%lld)",
                          (long long)c->index_head_dim, (long long)c->rope_dim);
    TRY(get_i(&r, "index_topk", 1, 0, 1, 1 << 20, &c->index_topk));
    TRY(get_i(&r, "candidate_source_layer_id", 0, -1, -1, DI_CFG_MAX_BLOCKS, &c->candidate_source));
    TRY(get_i(&r, "candidate_topk_blocks", c->candidate_source >= 0, 0, 1, 1 << 24, &c->candidate_topk_blocks));
    TRY(get_i(&r, "candidate_block_size", c->candidate_source >= 0, 0, 1, 1 << 16, &c->candidate_block_size));
    TRY(get_i(&r, "hc_mult", 1, 0, 1, 16, &c->hc_mult));
    TRY(get_i(&r, "hc_sinkhorn_iters", 0, 20, 1, 1000, &c->hc_sinkhorn_iters));
    TRY(get_num(&r, "hc_eps", 0, 1e-6, 0, 1, &c->hc_eps));

    TRY(get_list(&r, "engram_layer_ids", 0, DI_CFG_MAX_ENGRAM, 0, DI_CFG_MAX_BLOCKS, buf, &n));
    c->n_engram = n;
    for (int i = 0; i < n; i++) c->engram_layers[i] = (int)buf[i];
    if (c->n_engram) {
        TRY(get_list(&r, "engram_num_embeddings", 1, DI_CFG_MAX_ENGRAM, 1, (int64_t)1 << 40, c->engram_rows, &n));
        if (n != c->n_engram)
            return di_err_set(err, DI_ERR_UNSUPPORTED, "engram_num_embeddings: %d entries, expected one per "
                              "engram_layer_ids entry (%d)", n, c->n_engram);
        TRY(get_i(&r, "engram_max_ngram_size", 1, 0, 2, DI_CFG_MAX_NGRAM, &c->engram_max_ngram));
        TRY(get_int(&r, "engram_vocab_size", 0, 0, 0, (int64_t)1 << 40, &c->engram_vocab_size));
        TRY(get_i(&r, "engram_n_heads", 1, 0, 1, 256, &c->engram_n_heads));
        TRY(get_dim32(&r, "engram_head_dim", 1 << 14, &c->engram_head_dim));
        TRY(get_i(&r, "engram_pad_token_id", 0, 2, 0, c->vocab_size - 1, &c->engram_pad_id));
        TRY(get_int(&r, "engram_compressed_vocab_size", 1, 0, 1, c->vocab_size, &c->engram_compressed_vocab));
    }

    if (c->n_mtp) {
        TRY(get_i(&r, "dspark_block_size", 1, 0, 1, 64, &c->dspark_block_size));
        TRY(get_i(&r, "dspark_noise_token_id", 1, 0, 0, c->vocab_size - 1, &c->dspark_noise_id));
        TRY(get_list(&r, "dspark_target_layer_ids", 1, DI_CFG_MAX_TAPS, 0, DI_CFG_MAX_BLOCKS, buf, &n));
        if (n == 0)
            return di_err_set(err, DI_ERR_UNSUPPORTED,
                              "dspark_target_layer_ids: empty, but num_nextn_predict_layers is %d (need >= 1 layer)",
                              c->n_mtp);
        c->n_dspark_taps = n;
        for (int i = 0; i < n; i++) c->dspark_taps[i] = (int)buf[i];
        TRY(get_int(&r, "dspark_markov_rank", 0, 256, 1, 1 << 16, &c->dspark_markov_rank));
        /* 0 / absent means "same as the backbone", as in the reference. */
        TRY(get_i(&r, "dspark_n_routed_experts", 0, 0, 0, CFG_MAX_EXPERTS, &c->dspark_n_experts));
        if (!c->dspark_n_experts) c->dspark_n_experts = c->n_routed_experts;
        TRY(get_i(&r, "dspark_num_experts_per_tok", 0, 0, 0, c->dspark_n_experts, &c->dspark_n_active));
        if (!c->dspark_n_active) c->dspark_n_active = c->n_active_experts;
        /* The default (the backbone's top-k) may not fit a smaller DSpark expert set. */
        if (c->dspark_n_active > c->dspark_n_experts)
            return di_err_set(err, DI_ERR_UNSUPPORTED,
                              "dspark_num_experts_per_tok: %d (defaulted to num_experts_per_tok) exceeds "
                              "dspark_n_routed_experts %d; supported range 1..%d",
                              c->dspark_n_active, c->dspark_n_experts, c->dspark_n_experts);
    }

    TRY(get_i(&r, "bos_token_id", 0, 0, 0, c->vocab_size - 1, &c->bos_id));
    TRY(get_i(&r, "eos_token_id", 0, 1, 0, c->vocab_size - 1, &c->eos_id));
    TRY(get_i(&r, "pad_token_id", 0, -1, -1, c->vocab_size - 1, &c->pad_id));
    TRY(get_i(&r, "image_token_id", 0, -1, -1, c->vocab_size - 1, &c->image_token_id));
    const cJSON *vc = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
    if (cJSON_IsObject(vc)) {
        const cJSON *nl = cJSON_GetObjectItemCaseSensitive(vc, "num_hidden_layers");
        if (nl) {
            int64_t v;
            TRY(json_int(nl, "vision_config.num_hidden_layers", 0, 1024, &v, err));
            c->vision_layers = (int)v;
        }
    }
    TRY(parse_quant(root, c, err));
    return di_config_derive(c, err);
}

di_status di_config_derive(di_config *c, di_err *err) {
    const int L = c->n_layers, B = c->n_blocks;
    if (L < 1 || B > DI_CFG_MAX_BLOCKS || B < L)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "num_hidden_layers: %d blocks out of range [1, %d]", B,
                          DI_CFG_MAX_BLOCKS);
    TRY(check_layer_list("kv_source_layer_ids", c->kv_sources, c->n_kv_sources, L, err));
    TRY(check_layer_list("index_source_layer_ids", c->index_sources, c->n_index_sources, L, err));
    TRY(check_layer_list("engram_layer_ids", c->engram_layers, c->n_engram, L, err));
    for (int i = 0; i < c->n_dspark_taps; i++)
        if (c->dspark_taps[i] < 0 || c->dspark_taps[i] >= L)
            return di_err_set(err, DI_ERR_UNSUPPORTED, "dspark_target_layer_ids[%d]: layer %d is out of range [0, %d)",
                              i, c->dspark_taps[i], L);
    if (c->candidate_source >= L)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "candidate_source_layer_id: layer %d is out of range [-1, %d)",
                          c->candidate_source, L);
    if (c->candidate_source >= 0 && list_index(c->index_sources, c->n_index_sources, c->candidate_source) < 0)
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "candidate_source_layer_id: layer %d is not in index_source_layer_ids", c->candidate_source);
    for (int i = 0; i < c->n_kv_sources; i++) {
        int id = c->kv_sources[i];
        if (c->compress_ratios[id] == 0)
            return di_err_set(err, DI_ERR_UNSUPPORTED,
                              "kv_source_layer_ids: layer %d has compress ratio 0 (a kv source needs ratio 1 or 2)", id);
        /* Index keys are produced by the indexer of the layer that compresses. */
        if (list_index(c->index_sources, c->n_index_sources, id) < 0)
            return di_err_set(err, DI_ERR_UNSUPPORTED,
                              "kv_source_layer_ids: layer %d is not in index_source_layer_ids (a kv source also "
                              "produces the index keys)", id);
    }
    for (int i = L; i < B; i++)
        if (c->compress_ratios[i])
            return di_err_set(err, DI_ERR_UNSUPPORTED,
                              "compress_ratios[%d]: %d for a DSpark stage (supported: 0, window only)", i,
                              c->compress_ratios[i]);

    int kv = -1, isrc = -1;
    for (int b = 0; b < B; b++) {
        di_layer_role *r = &c->roles[b];
        memset(r, 0, sizeof *r);
        r->ratio = c->compress_ratios[b];
        r->kv_src = r->isrc = -1;
        r->is_dspark_stage = b >= L;
        r->engram = b < L ? list_index(c->engram_layers, c->n_engram, b) : -1;
        r->dspark_tap = b < L ? list_index(c->dspark_taps, c->n_dspark_taps, b) : -1;
        r->n_experts = r->is_dspark_stage ? c->dspark_n_experts : c->n_routed_experts;
        r->n_active = r->is_dspark_stage ? c->dspark_n_active : c->n_active_experts;
        r->yarn = r->ratio > 0 && c->yarn_enabled;
        r->rope_base = r->ratio > 0 ? c->compress_rope_theta : c->rope_theta;
        if (b >= L) continue;
        r->owns_compressor = list_index(c->kv_sources, c->n_kv_sources, b) >= 0;
        r->is_index_source = list_index(c->index_sources, c->n_index_sources, b) >= 0;
        r->is_candidate_source = b == c->candidate_source;
        if (r->owns_compressor) kv = b;
        if (r->is_index_source) isrc = b;
        if (r->ratio == 0) {
            if (r->is_index_source)
                return di_err_set(err, DI_ERR_UNSUPPORTED,
                                  "index_source_layer_ids: layer %d has compress ratio 0 (nothing to index)", b);
            continue;
        }
        if (kv < 0)
            return di_err_set(err, DI_ERR_UNSUPPORTED,
                              "compress_ratios[%d]: layer %d compresses (ratio %d) but no earlier layer is in "
                              "kv_source_layer_ids", b, b, r->ratio);
        if (isrc < 0)
            return di_err_set(err, DI_ERR_UNSUPPORTED,
                              "compress_ratios[%d]: layer %d compresses but no earlier layer is in "
                              "index_source_layer_ids", b, b);
        if (c->compress_ratios[kv] != r->ratio)
            return di_err_set(err, DI_ERR_UNSUPPORTED,
                              "compress_ratios[%d]: ratio %d differs from its kv source layer %d (ratio %d)", b, r->ratio,
                              kv, c->compress_ratios[kv]);
        r->kv_src = kv;
        r->isrc = isrc;
        if (r->is_index_source) {
            int pool = c->candidate_source >= 0 && c->candidate_source < b;
            r->indexer = pool ? DI_INDEXER_POOL : DI_INDEXER_FULL;
            if (pool && c->roles[c->candidate_source].kv_src != kv)
                return di_err_set(err, DI_ERR_UNSUPPORTED,
                                  "index_source_layer_ids: layer %d searches layer %d's candidate pool but reads the "
                                  "compressed KV of layer %d (must be the same as the candidate source's, layer %d)",
                                  b, c->candidate_source, kv, c->roles[c->candidate_source].kv_src);
        }
    }
    return DI_OK;
}

di_status di_config_parse(const char *json, size_t n, di_config *out, di_err *err) {
    if (!json || !out) return di_err_set(err, DI_ERR_INVALID_ARG, "config: NULL argument");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, n, &end, 0);
    if (!root) {
        size_t off = end && end >= json ? (size_t)(end - json) : 0;
        size_t line = 1, col = 1;
        for (size_t i = 0; i < off && i < n; i++) {
            if (json[i] == '\n') line++, col = 1;
            else col++;
        }
        return di_err_set(err, DI_ERR_FORMAT, "invalid JSON near line %zu, column %zu", line, col);
    }
    di_status st = parse_doc(root, out, err);
    cJSON_Delete(root);
    return st;
}

di_status di_config_load(const char *path, di_config *out, di_err *err) {
    char *buf = NULL;
    size_t n = 0;
    di_status st = di_file_read(path, CFG_MAX_FILE_BYTES, &buf, &n, err);
    if (st) return st;
    st = di_config_parse(buf, n, out, err);
    if (st) di_err_prefix(err, "%s: ", path);
    free(buf);
    return st;
}

void di_config_block_prefix(const di_config *cfg, int block, char *buf, size_t n) {
    if (block < cfg->n_layers) snprintf(buf, n, "layers.%d.", block);
    else snprintf(buf, n, "mtp.%d.", block - cfg->n_layers);
}

void di_config_role_str(const di_config *cfg, int block, char *buf, size_t n) {
    const di_layer_role *r = &cfg->roles[block];
    size_t k = 0;
#define PUT(...) (k += (size_t)snprintf(buf + (k < n ? k : n), k < n ? n - k : 0, __VA_ARGS__))
    if (r->is_dspark_stage) PUT("DSpark stage, window only");
    else if (r->ratio == 0) PUT("window only");
    else {
        PUT("ratio %d, ", r->ratio);
        if (r->owns_compressor) PUT("compressor, ");
        else PUT("kv of %d, ", r->kv_src);
        if (r->indexer == DI_INDEXER_FULL) PUT("indexer full scan");
        else if (r->indexer == DI_INDEXER_POOL) PUT("indexer in pool of %d", cfg->candidate_source);
        else PUT("selection of %d", r->isrc);
        if (r->is_candidate_source) PUT(" + candidate pool");
    }
    if (r->engram >= 0) PUT(", engram");
    if (r->dspark_tap >= 0) PUT(", DSpark tap");
    PUT(", %d/%d experts, rope %g%s", r->n_active, r->n_experts, r->rope_base, r->yarn ? " yarn" : "");
#undef PUT
}
