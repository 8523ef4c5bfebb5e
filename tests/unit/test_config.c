/* config.json parsing, validation and the derived layer roles (spec §1.3),
 * and the tensor manifest against the golden tiny checkpoint's names. */
#include <cjson/cJSON.h>
#include <stdint.h>

#include "model/config.h"
#include "model/manifest.h"
#include "model_fixtures.h"
#include "test.h"

static di_status parse_data(const char *name, di_config *c, di_err *e) {
    size_t n;
    char *s = fixture_read(name, &n);
    di_status st = di_config_parse(s, n, c, e);
    free(s);
    return st;
}

static void test_tiny_roles(void) {
    di_config c;
    di_err e = {0};
    CHECKF(parse_data("v41-tiny-config.json", &c, &e) == DI_OK, "%s", e.msg);
    CHECK_EQ_INT(c.n_layers, 12);
    CHECK_EQ_INT(c.n_blocks, 15);
    CHECK_EQ_INT(c.dim, 128);
    CHECK_EQ_INT(c.vocab_size, 1024);
    CHECK(c.eps == 1e-20);
    CHECK(c.yarn_enabled && c.yarn_factor == 16 && c.yarn_original_max_pos == 65536);
    /* golden/README.md layer-role table */
    static const struct { int ratio, owns, indexer, kv, isrc, cand, engram, tap; } want[15] = {
        {0, 0, DI_INDEXER_NONE, -1, -1, 0, -1, -1},  {0, 0, DI_INDEXER_NONE, -1, -1, 0, 0, -1},
        {2, 1, DI_INDEXER_FULL, 2, 2, 0, -1, -1},    {2, 0, DI_INDEXER_NONE, 2, 2, 0, -1, -1},
        {2, 1, DI_INDEXER_FULL, 4, 4, 0, 1, -1},     {2, 0, DI_INDEXER_NONE, 4, 4, 0, -1, -1},
        {1, 1, DI_INDEXER_FULL, 6, 6, 1, -1, -1},    {1, 0, DI_INDEXER_NONE, 6, 6, 0, -1, -1},
        {1, 0, DI_INDEXER_POOL, 6, 8, 0, -1, -1},    {1, 0, DI_INDEXER_NONE, 6, 8, 0, -1, 0},
        {1, 0, DI_INDEXER_POOL, 6, 10, 0, -1, 1},    {1, 0, DI_INDEXER_NONE, 6, 10, 0, -1, 2},
        {0, 0, DI_INDEXER_NONE, -1, -1, 0, -1, -1},  {0, 0, DI_INDEXER_NONE, -1, -1, 0, -1, -1},
        {0, 0, DI_INDEXER_NONE, -1, -1, 0, -1, -1},
    };
    for (int b = 0; b < 15; b++) {
        const di_layer_role *r = &c.roles[b];
        CHECKF(r->ratio == want[b].ratio && r->owns_compressor == want[b].owns && (int)r->indexer == want[b].indexer &&
                   r->kv_src == want[b].kv && r->isrc == want[b].isrc && r->is_candidate_source == want[b].cand &&
                   r->engram == want[b].engram && r->dspark_tap == want[b].tap,
               "block %d", b);
        CHECK_EQ_INT(r->n_experts, b < 12 ? 6 : 4);
        CHECK(r->rope_base == (r->ratio ? 160000.0 : 10000.0));
        CHECK_EQ_INT(r->yarn, r->ratio > 0);
    }
}

static void test_real_roles(void) {
    di_config c;
    di_err e = {0};
    CHECKF(parse_data("v41-flash-config.json", &c, &e) == DI_OK, "%s", e.msg);
    CHECK_EQ_INT(c.n_blocks, 43);
    CHECK_EQ_INT(c.engram_rows[1], 384016682);
    /* architecture.md §1.3 */
    for (int b = 0; b < 43; b++) {
        const di_layer_role *r = &c.roles[b];
        int want_ratio = b < 2 || b >= 40 ? 0 : b < 20 ? 2 : 1;
        int want_kv = b < 2 || b >= 40 ? -1 : b < 8 ? 2 : b < 14 ? 8 : b < 20 ? 14 : 20;
        int want_isrc = b < 24 || b >= 40 ? want_kv : 24 + (b - 24) / 4 * 4;
        int want_idx = b == 2 || b == 8 || b == 14 || b == 20 ? DI_INDEXER_FULL
                       : (b >= 24 && b <= 36 && b % 4 == 0) ? DI_INDEXER_POOL
                                                            : DI_INDEXER_NONE;
        CHECKF(r->ratio == want_ratio, "block %d ratio %d", b, r->ratio);
        CHECKF(r->kv_src == want_kv, "block %d kv %d", b, r->kv_src);
        CHECKF(r->isrc == want_isrc, "block %d isrc %d", b, r->isrc);
        CHECKF((int)r->indexer == want_idx, "block %d indexer %d", b, r->indexer);
        CHECK_EQ_INT(r->owns_compressor, b == 2 || b == 8 || b == 14 || b == 20);
        CHECK_EQ_INT(r->is_candidate_source, b == 20);
        CHECK_EQ_INT(r->engram >= 0, b == 1 || b == 14);
        CHECK_EQ_INT(r->dspark_tap >= 0, b >= 37 && b <= 39);
        CHECK_EQ_INT(r->n_experts, b < 40 ? 384 : 128);
        CHECK_EQ_INT(r->n_active, b < 40 ? 6 : 3);
    }
}

/* Flat layout: the text_config keys at the top level parse the same. */
static void test_flat_layout(void) {
    size_t n;
    char *s = fixture_read("v41-tiny-config.json", &n);
    cJSON *root = cJSON_Parse(s);
    cJSON *tc = cJSON_DetachItemFromObject(root, "text_config");
    cJSON *it = tc->child;
    while (it) {
        cJSON *next = it->next;
        cJSON_AddItemToObject(root, it->string, cJSON_Duplicate(it, 1));
        it = next;
    }
    cJSON_Delete(tc);
    char *flat = cJSON_PrintUnformatted(root);
    di_config a, b;
    di_err e = {0};
    CHECKF(di_config_parse(flat, strlen(flat), &a, &e) == DI_OK, "%s", e.msg);
    CHECK(di_config_parse(s, n, &b, &e) == DI_OK);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    free(flat);
    cJSON_Delete(root);
    free(s);
}

/* Replaces (or with value NULL removes) `key` in text_config (or at the top
 * level when top != 0), parses, and expects failure mentioning `needle`. */
static void expect_bad(int top, const char *key, const char *value_json, const char *needle) {
    size_t n;
    char *s = fixture_read("v41-tiny-config.json", &n);
    cJSON *root = cJSON_Parse(s);
    cJSON *obj = top ? root : cJSON_GetObjectItem(root, "text_config");
    const char *dot = strchr(key, '.');
    char head[64];
    if (dot) { /* one level of nesting: "quantization_config.weight_block_size" */
        snprintf(head, sizeof head, "%.*s", (int)(dot - key), key);
        obj = cJSON_GetObjectItem(obj, head);
        key = dot + 1;
    }
    cJSON_DeleteItemFromObject(obj, key);
    if (value_json) cJSON_AddItemToObject(obj, key, cJSON_Parse(value_json));
    char *doc = cJSON_PrintUnformatted(root);
    di_config c;
    di_err e = {0};
    di_status st = di_config_parse(doc, strlen(doc), &c, &e);
    CHECKF(st != DI_OK, "%s=%s accepted", key, value_json ? value_json : "(removed)");
    CHECK_STR_CONTAINS(e.msg, needle);
    free(doc);
    cJSON_Delete(root);
    free(s);
}

static void test_errors(void) {
    expect_bad(0, "hidden_act", "\"gelu\"", "hidden_act");
    expect_bad(0, "scoring_func", "\"softmax\"", "sqrtsoftplus");
    expect_bad(0, "hidden_size", "\"128\"", "hidden_size");
    expect_bad(0, "hidden_size", "100", "multiple of 32");
    expect_bad(0, "hidden_size", NULL, "missing required key \"hidden_size\"");
    expect_bad(0, "num_hidden_layers", "12.5", "num_hidden_layers");
    expect_bad(0, "compress_ratios", "[0,0,2,2,2,2,1,1,1,1,1,1,0,0]", "compress_ratios");
    expect_bad(0, "compress_ratios", "[0,0,4,2,2,2,1,1,1,1,1,1,0,0,0]", "[0, 2]");
    expect_bad(0, "compress_ratios", "[0,0,2,2,2,2,1,1,1,1,1,1,0,0,1]", "DSpark");
    expect_bad(0, "compress_ratios", "[0,0,2,2,2,2,2,1,1,1,1,1,0,0,0]", "differs from its kv source");
    expect_bad(0, "kv_source_layer_ids", "[2,4,12]", "out of range");
    expect_bad(0, "kv_source_layer_ids", "[4,2,6]", "strictly increasing");
    expect_bad(0, "kv_source_layer_ids", "[1,4,6]", "ratio 0");
    expect_bad(0, "kv_source_layer_ids", "[4,6]", "no earlier layer");
    expect_bad(0, "index_source_layer_ids", "[2,4,8,10]", "not in index_source_layer_ids");
    expect_bad(0, "engram_layer_ids", "[1,40]", "engram_layer_ids[1]");
    expect_bad(0, "engram_num_embeddings", "[864]", "engram_num_embeddings");
    expect_bad(0, "dspark_target_layer_ids", "[9,10,99]", "dspark_target_layer_ids[2]");
    expect_bad(0, "candidate_source_layer_id", "7", "not in index_source_layer_ids");
    expect_bad(0, "o_groups", "3", "o_groups");
    expect_bad(0, "n_routed_experts", "100000", "[1, 2048]");
    expect_bad(0, "num_key_value_heads", "2", "num_key_value_heads");
    expect_bad(0, "qk_rope_head_dim", "15", "qk_rope_head_dim");
    expect_bad(0, "rope_scaling", "{\"rope_type\":\"linear\",\"factor\":2}", "yarn");
    expect_bad(0, "norm_topk_prob", "1", "norm_topk_prob");
    expect_bad(0, "rms_norm_eps", "\"tiny\"", "rms_norm_eps");
    expect_bad(1, "quantization_config.weight_block_size", "[128,128]", "[32, 32]");
    expect_bad(1, "quantization_config.expert_dtype", "\"fp8\"", "fp4");
    expect_bad(1, "quantization_config.quant_method", "\"gptq\"", "quant_method");
    expect_bad(1, "quantization_config", NULL, "quantization_config");
    expect_bad(1, "text_config", "[]", "text_config");

    /* A DSpark top-k left to default to the backbone's (2) must still fit
     * the DSpark expert count (found by fuzzing). */
    {
        size_t n;
        char *s = fixture_read("v41-tiny-config.json", &n);
        cJSON *root = cJSON_Parse(s);
        cJSON *tc = cJSON_GetObjectItem(root, "text_config");
        cJSON_DeleteItemFromObject(tc, "dspark_num_experts_per_tok");
        cJSON_DeleteItemFromObject(tc, "dspark_n_routed_experts");
        cJSON_AddItemToObject(tc, "dspark_n_routed_experts", cJSON_CreateNumber(1));
        char *doc = cJSON_PrintUnformatted(root);
        di_config c1;
        di_err e1 = {0};
        CHECK(di_config_parse(doc, strlen(doc), &c1, &e1) == DI_ERR_UNSUPPORTED);
        CHECK_STR_CONTAINS(e1.msg, "dspark_num_experts_per_tok");
        free(doc);
        cJSON_Delete(root);
        free(s);
    }

    di_config c;
    di_err e = {0};
    CHECK(di_config_parse("{\"a\":", 5, &c, &e) == DI_ERR_FORMAT);
    CHECK_STR_CONTAINS(e.msg, "invalid JSON");
    CHECK(di_config_load("/nonexistent/config.json", &c, &e) == DI_ERR_IO);
    CHECK_STR_CONTAINS(e.msg, "/nonexistent/config.json");
}

/* The manifest of the tiny config names exactly the golden checkpoint's
 * tensors, and its byte total is the index's total_size. */
static void test_manifest_tiny(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    char *buf = fixture_golden_index(shared);
    if (!buf) SKIP("golden v41-tiny index missing");
    char path[4200];
    cJSON *idx = cJSON_Parse(buf);
    free(buf);
    cJSON *map = cJSON_GetObjectItem(idx, "weight_map");
    double total = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(idx, "metadata"), "total_size"));
    di_config c;
    di_err e = {0};
    snprintf(path, sizeof path, "%s/golden/v41-tiny/config.json", shared);
    CHECKF(di_config_load(path, &c, &e) == DI_OK, "%s", e.msg);
    di_manifest m;
    CHECKF(di_manifest_build(&m, &c, NULL, &e) == DI_OK, "%s", e.msg);
    CHECK_EQ_INT(m.n, cJSON_GetArraySize(map));
    cJSON *it;
    int unknown = 0;
    cJSON_ArrayForEach(it, map) if (!di_manifest_find(&m, it->string)) {
        unknown++;
        fprintf(stderr, "not in manifest: %s\n", it->string);
    }
    CHECK_EQ_INT(unknown, 0);
    uint64_t sum = 0;
    for (size_t i = 0; i < m.n; i++) sum += di_manifest_entry_bytes(&m.v[i]);
    CHECK_EQ_INT(sum, (uint64_t)total);
    CHECK(di_manifest_find(&m, "layers.0.ffn.gate.bias_vl")->optional == 1);
    CHECK(di_manifest_find(&m, "nope") == NULL);
    di_manifest_free(&m);
    cJSON_Delete(idx);
}

/* Real config: the dtype totals of architecture.md §8.1 (the text model; the
 * ~0.97 GB of BF16 vision tower is not part of the manifest). */
static void test_manifest_real(void) {
    di_config c;
    di_err e = {0};
    CHECK(parse_data("v41-flash-config.json", &c, &e) == DI_OK);
    di_manifest m;
    CHECKF(di_manifest_build(&m, &c, NULL, &e) == DI_OK, "%s", e.msg);
    double by[DI_DTYPE_COUNT] = {0}, total = 0;
    for (size_t i = 0; i < m.n; i++) {
        double b = (double)di_manifest_entry_bytes(&m.v[i]);
        by[m.v[i].dtype] += b;
        total += b;
    }
    CHECKF(fabs(total / 510.286023e9 - 1) < 0.005, "total %.0f", total);
    CHECKF(fabs(by[DI_DTYPE_I8] / 1e9 - 278.6) < 0.05, "I8 %.3f GB", by[DI_DTYPE_I8] / 1e9);
    CHECKF(fabs(by[DI_DTYPE_F8_E4M3] / 1e9 - 204.0) < 0.05, "E4M3 %.3f GB", by[DI_DTYPE_F8_E4M3] / 1e9);
    CHECKF(fabs(by[DI_DTYPE_F8_E8M0] / 1e9 - 23.6) < 0.05, "E8M0 %.3f GB", by[DI_DTYPE_F8_E8M0] / 1e9);
    CHECKF(fabs(by[DI_DTYPE_F32] / 1e9 - 0.17) < 0.005, "F32 %.3f GB", by[DI_DTYPE_F32] / 1e9);
    const di_manifest_entry *x = di_manifest_find(&m, "layers.1.engram.embed.weight");
    CHECK(x && x->shape[0] == 384006168 && x->shape[1] == 256);
    x = di_manifest_find(&m, "mtp.2.confidence_head.proj.weight");
    CHECK(x && x->shape[0] == 1 && x->shape[1] == 5376);
    x = di_manifest_find(&m, "layers.20.attn.wo_a.weight");
    CHECK(x && x->shape[0] == 8192 && x->shape[1] == 4096);
    CHECK(di_manifest_find(&m, "layers.20.attn.compressor.wgate.weight") == NULL);
    CHECK(di_manifest_find(&m, "layers.24.attn.indexer.wk.weight") == NULL);
    CHECK(di_manifest_find(&m, "layers.24.attn.indexer.wq_b.weight") != NULL);
    CHECK(di_manifest_find(&m, "mtp.1.ffn.experts.127.w2.scale") != NULL);
    CHECK(di_manifest_find(&m, "mtp.1.ffn.experts.128.w2.scale") == NULL);
    CHECK(di_manifest_tolerated("vision.blocks.0.attn.qkv.weight") && di_manifest_tolerated("image_newline"));
    CHECK(!di_manifest_tolerated("layers.0.attn.wq_a.weight"));
    di_manifest_free(&m);
}

int main(void) {
    RUN(test_tiny_roles);
    RUN(test_real_roles);
    RUN(test_flat_layout);
    RUN(test_errors);
    RUN(test_manifest_tiny);
    RUN(test_manifest_real);
    return test_summary();
}
