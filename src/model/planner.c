/* Memory planner (architecture.md §13). */
#include "model/planner.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/manifest.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* Per-device reserve for everything that is not weights or KV: the CUDA
 * context and library workspaces (~1 GiB), activations of one prefill chunk
 * (8192 tokens: 4 residual copies × D bf16, the 64-head query, MoE
 * intermediates — about 2–3 GiB at the real shapes) and allocator slack.
 * Taken as 8% of the device, at least 4 GiB. */
#define MARGIN_FRACTION 0.08
#define MARGIN_MIN_BYTES (4.0 * GIB)

const char *di_kv_format_name(di_kv_format f) {
    switch (f) {
    case DI_KV_FP4: return "fp4";
    case DI_KV_FP8: return "fp8";
    case DI_KV_BF16: return "bf16";
    default: return "?";
    }
}

const char *di_plan_part_name(int part) {
    static const char *const names[DI_PART_COUNT] = {"routed_experts", "engram_tables", "dspark", "embed_head",
                                                     "other"};
    return part >= 0 && part < DI_PART_COUNT ? names[part] : "?";
}

void di_plan_request_default(di_plan_request *r) {
    r->context = 131072;
    r->batch = 1;
    r->device_gib = 140;
    r->kv_format = DI_KV_FP4;
}

/* Bytes of one compressed-KV entry (Dh wide) and one index key (Di wide). */
static double entry_bytes(di_kv_format f, int64_t dim, int index_key) {
    switch (f) {
    case DI_KV_FP4: /* E2M1 pairs + one scale byte per 16 (KV, E4M3) or per 32 (keys, E8M0) */
        return (double)dim / 2 + (double)dim / (index_key ? 32 : 16);
    case DI_KV_FP8: return (double)dim + (double)dim / 32;
    default: return 2.0 * (double)dim;
    }
}

static int part_of(const di_config *c, const di_manifest_entry *e) {
    if (e->block >= c->n_layers) return DI_PART_DSPARK;
    if (e->block < 0) return strcmp(e->name, "norm.weight") ? DI_PART_EMBED_HEAD : DI_PART_OTHER;
    if (e->role == DI_TR_FP4_WEIGHT || e->role == DI_TR_FP4_SCALE) return DI_PART_EXPERTS;
    if (e->role == DI_TR_ENGRAM_TABLE || e->role == DI_TR_ENGRAM_SCALE) return DI_PART_ENGRAM;
    return DI_PART_OTHER;
}

di_status di_plan_compute(const di_config *c, const di_plan_request *req, di_plan *p, di_err *err) {
    memset(p, 0, sizeof *p);
    if (req) p->req = *req;
    else di_plan_request_default(&p->req);
    if (p->req.batch < 1 || !(p->req.device_gib > 0) || p->req.device_gib > 1e6 || p->req.kv_format < 0 ||
        p->req.kv_format >= DI_KV_FORMATS || p->req.context > ((uint64_t)1 << 40))
        return di_err_set(err, DI_ERR_INVALID_ARG,
                          "plan: batch must be >= 1, device memory in (0, 1e6] GiB, context at most 2^40 tokens");
    di_manifest m;
    di_status st = di_manifest_build(&m, c, NULL, err);
    if (st) return st;
    for (size_t i = 0; i < m.n; i++) {
        uint64_t b = di_manifest_entry_bytes(&m.v[i]);
        p->weights_bytes += b;
        p->weights_by_dtype[m.v[i].dtype] += b;
        p->weights_by_part[part_of(c, &m.v[i])] += b;
    }
    p->n_tensors = m.n;
    di_manifest_free(&m);

    for (int b = 0; b < c->n_layers; b++)
        if (c->roles[b].owns_compressor) p->kv_entries_per_token += 1.0 / c->roles[b].ratio;
    for (int f = 0; f < DI_KV_FORMATS; f++) {
        p->kv_main_per_token[f] = p->kv_entries_per_token * entry_bytes(f, c->head_dim, 0);
        p->kv_bytes_per_token[f] = p->kv_main_per_token[f] + p->kv_entries_per_token * entry_bytes(f, c->index_head_dim, 1);
    }
    uint64_t ring_slots = (uint64_t)c->n_blocks * (uint64_t)c->window;
    p->window_rings_fp8 = ring_slots * (uint64_t)entry_bytes(DI_KV_FP8, c->head_dim, 0);
    p->window_rings_bf16 = ring_slots * (uint64_t)entry_bytes(DI_KV_BF16, c->head_dim, 0);
    for (int b = 0; b < c->n_layers; b++)
        if (c->roles[b].owns_compressor && c->roles[b].ratio > 1)
            p->compressor_state += 2ull * (uint64_t)c->roles[b].ratio * (uint64_t)c->head_dim * 4;
    /* compressed ids as the sequence state holds them: int32, host memory */
    p->engram_history = c->n_engram ? (uint64_t)(c->engram_max_ngram - 1) * 4 : 0;
    p->fixed_per_sequence = p->window_rings_fp8 + p->compressor_state + p->engram_history;

    double per_seq = ceil((double)p->req.context * p->kv_bytes_per_token[p->req.kv_format]) + (double)p->fixed_per_sequence;
    p->kv_bytes_total = (uint64_t)(per_seq * p->req.batch);
    p->device_bytes = (uint64_t)(p->req.device_gib * GIB);
    double margin = fmax(MARGIN_MIN_BYTES, MARGIN_FRACTION * (double)p->device_bytes);
    p->device_margin = (uint64_t)margin;
    double usable = (double)p->device_bytes - margin;
    double need = (double)p->weights_bytes + (double)p->kv_bytes_total;
    double need_host = need - (double)p->weights_by_part[DI_PART_ENGRAM];
    p->devices_needed = usable > 0 ? (uint32_t)fmin(ceil(need / usable), 4294967295.0) : 0;
    p->devices_needed_engram_on_host = usable > 0 ? (uint32_t)fmin(ceil(need_host / usable), 4294967295.0) : 0;
    return DI_OK;
}

/* ---- rendering ---- */

static cJSON *plan_json(const di_config *c, const di_plan *p) {
    cJSON *o = cJSON_CreateObject();
    cJSON *model = cJSON_AddObjectToObject(o, "model");
    cJSON_AddNumberToObject(model, "layers", c->n_layers);
    cJSON_AddNumberToObject(model, "dspark_stages", c->n_mtp);
    cJSON_AddNumberToObject(model, "hidden_size", (double)c->dim);
    cJSON_AddNumberToObject(model, "vocab_size", (double)c->vocab_size);
    cJSON_AddNumberToObject(model, "routed_experts", c->n_routed_experts);
    cJSON_AddNumberToObject(o, "tensors", (double)p->n_tensors);
    cJSON_AddNumberToObject(o, "weights_bytes", (double)p->weights_bytes);
    cJSON *d = cJSON_AddObjectToObject(o, "weights_bytes_by_dtype");
    for (int t = 0; t < DI_DTYPE_COUNT; t++)
        if (p->weights_by_dtype[t]) cJSON_AddNumberToObject(d, di_dtype_name(t), (double)p->weights_by_dtype[t]);
    cJSON *pt = cJSON_AddObjectToObject(o, "weights_bytes_by_part");
    for (int k = 0; k < DI_PART_COUNT; k++) cJSON_AddNumberToObject(pt, di_plan_part_name(k), (double)p->weights_by_part[k]);
    cJSON_AddStringToObject(o, "weights_not_counted",
                            "vision tower (vision.*, aligner.*, image_*): tolerated in checkpoints, unused by a text engine");
    cJSON *kv = cJSON_AddObjectToObject(o, "kv_per_token");
    cJSON_AddNumberToObject(kv, "compressed_entries", p->kv_entries_per_token);
    cJSON *kb = cJSON_AddObjectToObject(kv, "bytes");
    cJSON *km = cJSON_AddObjectToObject(kv, "compressed_kv_bytes");
    for (int f = 0; f < DI_KV_FORMATS; f++) {
        cJSON_AddNumberToObject(kb, di_kv_format_name(f), p->kv_bytes_per_token[f]);
        cJSON_AddNumberToObject(km, di_kv_format_name(f), p->kv_main_per_token[f]);
    }
    cJSON *fx = cJSON_AddObjectToObject(o, "per_sequence_fixed_bytes");
    cJSON_AddNumberToObject(fx, "window_rings_fp8", (double)p->window_rings_fp8);
    cJSON_AddNumberToObject(fx, "window_rings_bf16", (double)p->window_rings_bf16);
    cJSON_AddNumberToObject(fx, "compressor_state", (double)p->compressor_state);
    cJSON_AddNumberToObject(fx, "engram_history", (double)p->engram_history);
    cJSON_AddNumberToObject(fx, "total", (double)p->fixed_per_sequence);
    cJSON *rq = cJSON_AddObjectToObject(o, "request");
    cJSON_AddNumberToObject(rq, "context_tokens", (double)p->req.context);
    cJSON_AddNumberToObject(rq, "batch", p->req.batch);
    cJSON_AddNumberToObject(rq, "device_gib", p->req.device_gib);
    cJSON_AddStringToObject(rq, "kv_format", di_kv_format_name(p->req.kv_format));
    cJSON_AddNumberToObject(o, "kv_bytes_total", (double)p->kv_bytes_total);
    cJSON *dv = cJSON_AddObjectToObject(o, "devices");
    cJSON_AddNumberToObject(dv, "device_bytes", (double)p->device_bytes);
    cJSON_AddNumberToObject(dv, "margin_bytes_per_device", (double)p->device_margin);
    cJSON_AddNumberToObject(dv, "needed", p->devices_needed);
    cJSON_AddNumberToObject(dv, "needed_engram_tables_on_host", p->devices_needed_engram_on_host);
    return o;
}

static void human(char *buf, size_t n, double bytes) {
    if (bytes >= 1e9) snprintf(buf, n, "%.2f GB (%.2f GiB)", bytes / 1e9, bytes / GIB);
    else if (bytes >= 1e6) snprintf(buf, n, "%.2f MB (%.2f MiB)", bytes / 1e6, bytes / (1024.0 * 1024.0));
    else if (bytes >= 1e3) snprintf(buf, n, "%.2f kB (%.2f KiB)", bytes / 1e3, bytes / 1024.0);
    else snprintf(buf, n, "%.0f B", bytes);
}

static char *plan_text(const di_config *c, const di_plan *p) {
    size_t cap = 8192, k = 0;
    char *s = malloc(cap), h[64];
    if (!s) return NULL;
#define OUT(...) (k += (size_t)snprintf(s + (k < cap ? k : cap), k < cap ? cap - k : 0, __VA_ARGS__))
    human(h, sizeof h, (double)p->weights_bytes);
    OUT("weights: %s in %llu tensors\n", h, (unsigned long long)p->n_tensors);
    for (int t = 0; t < DI_DTYPE_COUNT; t++)
        if (p->weights_by_dtype[t]) {
            human(h, sizeof h, (double)p->weights_by_dtype[t]);
            OUT("  %-9s %s\n", di_dtype_name(t), h);
        }
    OUT("  by part:\n");
    for (int i = 0; i < DI_PART_COUNT; i++) {
        human(h, sizeof h, (double)p->weights_by_part[i]);
        OUT("    %-15s %s\n", di_plan_part_name(i), h);
    }
    OUT("  (vision tower tensors, if present in a checkpoint, are not counted)\n");
    OUT("compressed KV + index keys per token (%.4g entries/token):\n", p->kv_entries_per_token);
    for (int f = 0; f < DI_KV_FORMATS; f++) {
        char h2[64];
        human(h, sizeof h, p->kv_bytes_per_token[f] * 131072);
        human(h2, sizeof h2, p->kv_bytes_per_token[f] * 1048576);
        OUT("  %-4s %8.1f B/token   128K: %s   1M: %s\n", di_kv_format_name(f), p->kv_bytes_per_token[f], h, h2);
    }
    OUT("fixed per sequence:\n");
    human(h, sizeof h, (double)p->window_rings_fp8);
    OUT("  window rings (%d blocks x %d slots, FP8+scale) %s\n", c->n_blocks, c->window, h);
    human(h, sizeof h, (double)p->window_rings_bf16);
    OUT("  window rings if BF16                          %s\n", h);
    human(h, sizeof h, (double)p->compressor_state);
    OUT("  compressor partial groups (fp32)              %s\n", h);
    human(h, sizeof h, (double)p->engram_history);
    OUT("  Engram n-gram history                         %s\n", h);
    human(h, sizeof h, (double)p->kv_bytes_total);
    OUT("context %llu tokens x batch %u (%s KV): %s\n", (unsigned long long)p->req.context, p->req.batch,
        di_kv_format_name(p->req.kv_format), h);
    human(h, sizeof h, (double)p->device_margin);
    if (p->devices_needed) {
        OUT("devices of %.1f GiB needed: %u (reserving %s per device for activations and workspace)\n",
            p->req.device_gib, p->devices_needed, h);
        if (p->weights_by_part[DI_PART_ENGRAM])
            OUT("  with the Engram tables in host memory: %u\n", p->devices_needed_engram_on_host);
    }
    else OUT("devices of %.1f GiB cannot hold the %s reserve\n", p->req.device_gib, h);
#undef OUT
    if (k >= cap) s[cap - 1] = 0;
    return s;
}

char *di_plan_render(const di_config *c, const di_plan *p, int as_json) {
    if (!as_json) return plan_text(c, p);
    cJSON *o = plan_json(c, p);
    if (!o) return NULL;
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (!s) return NULL;
    /* cJSON allocates with its hooks (malloc by default); copy so callers free() it. */
    char *out = strdup(s);
    cJSON_free(s);
    return out;
}
