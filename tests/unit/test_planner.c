/* Memory planner against the spec's figures (architecture.md §8.1, §13) and
 * the golden tiny checkpoint's byte total. */
#include <cjson/cJSON.h>
#include <stdint.h>

#include "model/planner.h"
#include "model_fixtures.h"
#include "test.h"

static di_config tiny, real;

static void test_real_figures(void) {
    di_plan p;
    di_err e = {0};
    CHECKF(di_plan_compute(&real, NULL, &p, &e) == DI_OK, "%s", e.msg);
    /* §8.1: index total_size 510,286,023,000 (includes ~0.97 GB of vision tower) */
    CHECKF(fabs((double)p.weights_bytes / 510286023000.0 - 1) < 0.005, "%llu", (unsigned long long)p.weights_bytes);
    CHECKF(fabs((double)p.weights_bytes / 510.3e9 - 1) < 0.005, "%llu", (unsigned long long)p.weights_bytes);
    /* §13.2 */
    CHECK(p.kv_entries_per_token == 2.5);
    CHECK(p.kv_bytes_per_token[DI_KV_FP4] == 890);
    CHECK(p.kv_bytes_per_token[DI_KV_FP8] == 1650);
    CHECK(p.kv_bytes_per_token[DI_KV_BF16] == 3200);
    CHECKF(fabs((double)p.window_rings_fp8 / (1024 * 1024) - 2.77) < 0.005, "%llu", (unsigned long long)p.window_rings_fp8);
    CHECKF(fabs((double)p.window_rings_bf16 / (1024 * 1024) - 5.38) < 0.005, "%llu", (unsigned long long)p.window_rings_bf16);
    CHECK_EQ_INT(p.compressor_state, 24 * 1024);
    /* §13.1: Engram tables 196.6 B params at one byte, plus one scale byte per 32 */
    CHECKF(fabs((double)p.weights_by_part[DI_PART_ENGRAM] / (196.6e9 * 33 / 32) - 1) < 0.001, "%llu",
           (unsigned long long)p.weights_by_part[DI_PART_ENGRAM]);
    uint64_t sum = 0;
    for (int k = 0; k < DI_PART_COUNT; k++) sum += p.weights_by_part[k];
    CHECK_EQ_INT(sum, p.weights_bytes);
    /* 1M context at FP4: 890 MiB (§13.2) */
    di_plan_request r;
    di_plan_request_default(&r);
    r.context = 1048576;
    CHECK(di_plan_compute(&real, &r, &p, &e) == DI_OK);
    CHECK_EQ_INT(p.kv_bytes_total, 890ull * 1048576 + p.fixed_per_sequence);
}

/* The device count is the smallest n with n × (device − margin) >= weights +
 * KV, and grows with context and batch. */
static void test_devices(void) {
    di_plan_request r;
    di_plan_request_default(&r);
    di_plan p;
    di_err e = {0};
    uint32_t prev = 0;
    const uint32_t batches[] = {1, 8, 64, 1024};
    for (int i = 0; i < 4; i++) {
        r.batch = batches[i];
        CHECK(di_plan_compute(&real, &r, &p, &e) == DI_OK);
        double usable = (double)p.device_bytes - (double)p.device_margin;
        double need = (double)p.weights_bytes + (double)p.kv_bytes_total;
        CHECK(p.devices_needed * usable >= need && (p.devices_needed - 1) * usable < need);
        need -= (double)p.weights_by_part[DI_PART_ENGRAM];
        CHECK(p.devices_needed_engram_on_host * usable >= need && (p.devices_needed_engram_on_host - 1) * usable < need);
        CHECK(p.devices_needed >= prev);
        prev = p.devices_needed;
    }
    CHECK(prev > 4); /* 1024 x 128K of KV does not fit next to the weights on 4 devices */
    r.device_gib = 2; /* smaller than the 4 GiB minimum reserve */
    CHECK(di_plan_compute(&real, &r, &p, &e) == DI_OK);
    CHECK_EQ_INT(p.devices_needed, 0);
    r.batch = 0;
    CHECK(di_plan_compute(&real, &r, &p, &e) == DI_ERR_INVALID_ARG);
}

/* Tiny config: the weights are exactly the golden checkpoint's tensor bytes. */
static void test_tiny_matches_golden(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found");
    char *buf = fixture_golden_index(shared);
    if (!buf) SKIP("golden v41-tiny index missing");
    cJSON *idx = cJSON_Parse(buf);
    free(buf);
    double total = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(idx, "metadata"), "total_size"));
    cJSON_Delete(idx);
    di_plan p;
    di_err e = {0};
    CHECK(di_plan_compute(&tiny, NULL, &p, &e) == DI_OK);
    CHECK_EQ_INT(p.weights_bytes, (uint64_t)total);
    CHECK_EQ_INT(p.n_tensors, 1005);
}

/* JSON carries the same numbers; text mentions every dtype. */
static void test_render(void) {
    di_plan p;
    di_err e = {0};
    CHECK(di_plan_compute(&real, NULL, &p, &e) == DI_OK);
    char *js = di_plan_render(&real, &p, 1);
    cJSON *o = cJSON_Parse(js);
    CHECK(o != NULL);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "weights_bytes")) == (double)p.weights_bytes);
    cJSON *by = cJSON_GetObjectItem(o, "weights_bytes_by_dtype"), *it;
    double sum = 0;
    cJSON_ArrayForEach(it, by) sum += it->valuedouble;
    CHECK(sum == (double)p.weights_bytes);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(by, "I8")) == (double)p.weights_by_dtype[DI_DTYPE_I8]);
    cJSON *kv = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "kv_per_token"), "bytes");
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(kv, "fp4")) == 890);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "devices"), "needed")) == p.devices_needed);
    cJSON_Delete(o);
    free(js);
    char *txt = di_plan_render(&real, &p, 0);
    CHECK_STR_CONTAINS(txt, "F8_E4M3");
    CHECK_STR_CONTAINS(txt, "890.0 B/token");
    CHECK_STR_CONTAINS(txt, "devices of 140.0 GiB needed");
    free(txt);
}

int main(void) {
    if (!fixture_config("v41-tiny-config.json", &tiny) || !fixture_config("v41-flash-config.json", &real)) return 1;
    RUN(test_real_figures);
    RUN(test_devices);
    RUN(test_tiny_matches_golden);
    RUN(test_render);
    return test_summary();
}
