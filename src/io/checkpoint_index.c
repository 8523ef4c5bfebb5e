/* model.safetensors.index.json parser: ecosystem.md §3.1. */
#include "io/checkpoint_index.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "io/json_text.h"

#define NAME_FMT "'%.160s'"

static int shard_name_ok(const char *s) {
    return s[0] && strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/') && !strchr(s, '\\');
}

static di_status file_id(di_ckpt_index *ix, const char *file, uint32_t *id, di_err *err) {
    for (size_t i = 0; i < ix->n_files; i++)
        if (!strcmp(ix->files[i], file)) {
            *id = (uint32_t)i;
            return DI_OK;
        }
    /* files has room for one per tensor, allocated by the caller. */
    ix->files[ix->n_files] = strdup(file);
    if (!ix->files[ix->n_files]) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    *id = (uint32_t)ix->n_files++;
    return DI_OK;
}

static di_status parse_total_size(const cJSON *root, di_ckpt_index *ix, di_err *err) {
    const cJSON *meta = NULL;
    for (const cJSON *c = root->child; c; c = c->next)
        if (!strcmp(c->string, "metadata")) {
            if (meta) return di_err_set(err, DI_ERR_FORMAT, "duplicate \"metadata\"");
            meta = c;
        }
    if (!meta || cJSON_IsNull(meta)) return DI_OK;
    if (!cJSON_IsObject(meta)) return di_err_set(err, DI_ERR_FORMAT, "\"metadata\" is not an object");
    const cJSON *ts = NULL;
    for (const cJSON *c = meta->child; c; c = c->next)
        if (!strcmp(c->string, "total_size")) {
            if (ts) return di_err_set(err, DI_ERR_FORMAT, "duplicate metadata.total_size");
            ts = c;
        }
    if (!ts) return DI_OK;
    double d = cJSON_IsNumber(ts) ? ts->valuedouble : -1.0;
    if (!(d >= 0.0 && d <= 9007199254740991.0) || d != (double)(uint64_t)d)
        return di_err_set(err, DI_ERR_FORMAT, "metadata.total_size is not a non-negative integer");
    ix->has_total_size = 1;
    ix->total_size = (uint64_t)d;
    return DI_OK;
}

static di_status parse_root(const cJSON *root, di_ckpt_index *ix, di_err *err) {
    if (!cJSON_IsObject(root)) return di_err_set(err, DI_ERR_FORMAT, "not a JSON object");
    const cJSON *map = NULL;
    for (const cJSON *c = root->child; c; c = c->next)
        if (!strcmp(c->string, "weight_map")) {
            if (map) return di_err_set(err, DI_ERR_FORMAT, "duplicate \"weight_map\"");
            map = c;
        }
    if (!map) return di_err_set(err, DI_ERR_FORMAT, "missing \"weight_map\"");
    if (!cJSON_IsObject(map)) return di_err_set(err, DI_ERR_FORMAT, "\"weight_map\" is not an object");
    di_status s = parse_total_size(root, ix, err);
    if (s) return s;

    size_t n = (size_t)cJSON_GetArraySize(map);
    ix->names = calloc(n ? n : 1, sizeof *ix->names);
    ix->file_of = calloc(n ? n : 1, sizeof *ix->file_of);
    ix->files = calloc(n ? n : 1, sizeof *ix->files);
    if (!ix->names || !ix->file_of || !ix->files)
        return di_err_set(err, DI_ERR_NOMEM, "out of memory for %zu tensors", n);
    if ((s = di_name_table_init(&ix->lookup, n, err))) return s;
    for (const cJSON *c = map->child; c; c = c->next) {
        if (!cJSON_IsString(c))
            return di_err_set(err, DI_ERR_FORMAT, "weight_map value of " NAME_FMT " is not a string",
                              c->string);
        if (!shard_name_ok(c->valuestring))
            return di_err_set(err, DI_ERR_FORMAT,
                              "weight_map maps " NAME_FMT " to " NAME_FMT
                              ", which is not a file name inside the model directory",
                              c->string, c->valuestring);
        uint32_t id = 0;
        if ((s = file_id(ix, c->valuestring, &id, err))) return s;
        char *name = strdup(c->string);
        if (!name) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
        ix->names[ix->n_names] = name;
        ix->file_of[ix->n_names] = id;
        if (di_name_table_insert(&ix->lookup, name, (uint32_t)ix->n_names, NULL) != 1) {
            ix->n_names++; /* owned now: freed with the rest */
            return di_err_set(err, DI_ERR_FORMAT, "weight_map lists tensor " NAME_FMT " twice", name);
        }
        ix->n_names++;
    }
    return DI_OK;
}

di_status di_ckpt_index_parse(const char *text, size_t n, di_ckpt_index *ix, di_err *err) {
    memset(ix, 0, sizeof *ix);
    cJSON *root;
    di_status s = di_json_parse_strict(text, n, "index", 1, &root, err);
    if (s) return s;
    s = parse_root(root, ix, err);
    cJSON_Delete(root);
    if (s) di_ckpt_index_free(ix);
    return s;
}

void di_ckpt_index_free(di_ckpt_index *ix) {
    if (!ix) return;
    for (size_t i = 0; i < ix->n_names; i++) free(ix->names[i]);
    for (size_t i = 0; i < ix->n_files; i++) free(ix->files[i]);
    free(ix->names);
    free(ix->file_of);
    free(ix->files);
    di_name_table_free(&ix->lookup);
    memset(ix, 0, sizeof *ix);
}
