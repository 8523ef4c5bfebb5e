/* deepinfer batch: an OpenAI Batch API job (JSONL of
 * {"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"})
 * through the engine, writing one output line per request as it finishes
 * (batch_response.h). Resumable: rerun after any interruption, it keeps the
 * complete lines already written, drops a torn last one and serves only the
 * requests not yet answered (batch_resume.h). A request without "seed" gets
 * one derived from its custom_id (and --seed), so a resumed job writes what
 * an uninterrupted one would. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/batch_resume.h"
#include "cli/batch_response.h"
#include "cli/cli.h"
#include "cli/engine_args.h"

#define CMD "batch"

static void usage(FILE *out) {
    fprintf(out,
            "usage: deepinfer batch --input IN.jsonl --output OUT.jsonl [options]\n"
            "  --input FILE         requests, one JSON object a line: custom_id (unique), method POST,\n"
            "                       url /v1/chat/completions, body (a Chat Completions request:\n"
            "                       messages, max_tokens, temperature, top_p, seed, stop, n,\n"
            "                       response_format, thinking {type: enabled|disabled}, reasoning_effort)\n"
            "  --output FILE        results, one line per request (appended; rerun to resume)\n"
            "  --seed N             base of the seeds given to requests without one (default 0)\n"
            "  --fsync line|none    flush each line to disk (default line) or leave it to the OS\n"
            "  --max-active N       requests in the engine at once (default: twice the engine's\n"
            "                       sequences a step, at least 256)\n"
            "  --quiet              no progress bar\n"
            "%s",
            cli_engine_args_usage);
}

typedef struct batch_req {
    char *custom_id;
    char *body;     /* JSON text to submit (seed filled in), NULL when refused */
    char *model;    /* the body's "model", echoed in the response */
    char *refusal;  /* why the request is refused before the engine, else NULL */
    size_t line_no;
    uint64_t engine_id;
    int done;
} batch_req;

typedef struct batch_job {
    batch_req *reqs;
    size_t n;
    size_t *table;  /* open addressing: custom_id -> index + 1 */
    size_t cap;
    const char *in_path;
} batch_job;

static size_t *slot(batch_job *j, const char *cid) {
    size_t k = (size_t)batch_hash(cid) & (j->cap - 1);
    while (j->table[k] && strcmp(j->reqs[j->table[k] - 1].custom_id, cid)) k = (k + 1) & (j->cap - 1);
    return &j->table[k];
}

static void job_free(batch_job *j) {
    for (size_t i = 0; i < j->n; i++) {
        free(j->reqs[i].custom_id);
        free(j->reqs[i].body);
        free(j->reqs[i].model);
        free(j->reqs[i].refusal);
    }
    free(j->reqs);
    free(j->table);
}

/* Checks method / url / body, gives the body a seed when it has none. */
static void prepare(batch_req *r, cJSON *line, uint64_t seed) {
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(line, "method");
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(line, "url");
    cJSON *body = cJSON_GetObjectItemCaseSensitive(line, "body");
    char msg[512];
    if (method && !(cJSON_IsString(method) && !strcmp(method->valuestring, "POST"))) {
        snprintf(msg, sizeof msg, "method must be \"POST\"");
    } else if (!cJSON_IsString(url) || strcmp(url->valuestring, "/v1/chat/completions")) {
        snprintf(msg, sizeof msg, "url %s is not supported: only \"/v1/chat/completions\"",
                 cJSON_IsString(url) ? url->valuestring : "(missing)");
    } else if (!cJSON_IsObject(body)) {
        snprintf(msg, sizeof msg, "body must be a JSON object (a Chat Completions request)");
    } else {
        const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
        if (cJSON_IsString(model)) r->model = strdup(model->valuestring);
        if (!cJSON_GetObjectItemCaseSensitive(body, "seed"))
            cJSON_AddNumberToObject(body, "seed", (double)((batch_hash(r->custom_id) ^ seed) & 0x7fffffffu));
        r->body = cJSON_PrintUnformatted(body);
        return;
    }
    r->refusal = strdup(msg);
}

/* Reads and checks the whole input before anything runs: a line that is not
 * JSON, lacks a custom_id or repeats one fails the job. */
static int job_read(batch_job *j, const char *path, uint64_t seed) {
    size_t len;
    char *buf = cli_read_file(CMD, path, &len);
    if (!buf) return -1;
    size_t n_lines = 1;
    for (size_t i = 0; i < len; i++) n_lines += buf[i] == '\n';
    j->reqs = calloc(n_lines, sizeof *j->reqs);
    for (j->cap = 16; j->cap < 2 * n_lines; j->cap *= 2) {}
    j->table = calloc(j->cap, sizeof *j->table);
    if (!j->reqs || !j->table) {
        free(buf);
        fprintf(stderr, "deepinfer " CMD ": out of memory\n");
        return -1;
    }
    int rc = 0;
    size_t line_no = 0;
    for (char *p = buf, *end = buf + len; p < end && !rc; ) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        line_no++;
        size_t k = 0;
        while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r')) k++;
        if (k < n) {
            cJSON *line = cJSON_ParseWithLength(p, n);
            const cJSON *cid = line ? cJSON_GetObjectItemCaseSensitive(line, "custom_id") : NULL;
            if (!line || !cJSON_IsObject(line)) {
                fprintf(stderr, "deepinfer " CMD ": %s:%zu: not a JSON object\n", path, line_no);
                rc = -1;
            } else if (!cJSON_IsString(cid) || !cid->valuestring[0]) {
                fprintf(stderr, "deepinfer " CMD ": %s:%zu: custom_id must be a non-empty string\n", path, line_no);
                rc = -1;
            } else {
                size_t *s = slot(j, cid->valuestring);
                if (*s) {
                    fprintf(stderr, "deepinfer " CMD ": %s:%zu: duplicate custom_id \"%s\" (first on line %zu)\n",
                            path, line_no, cid->valuestring, j->reqs[*s - 1].line_no);
                    rc = -1;
                } else {
                    batch_req *r = &j->reqs[j->n];
                    r->custom_id = strdup(cid->valuestring);
                    r->line_no = line_no;
                    *s = ++j->n;
                    prepare(r, line, seed);
                }
            }
            cJSON_Delete(line);
        }
        p += n + 1;
    }
    free(buf);
    return rc;
}

static int on_seen(void *user, const char *custom_id, size_t line_no) {
    batch_job *j = user;
    size_t *s = slot(j, custom_id);
    if (!*s) {
        fprintf(stderr, "deepinfer " CMD ": output line %zu answers custom_id \"%s\", which is not in %s "
                        "(the output of another job?)\n", line_no, custom_id, j->in_path);
        return -1;
    }
    batch_req *r = &j->reqs[*s - 1];
    if (r->done) {
        fprintf(stderr, "deepinfer " CMD ": output line %zu repeats custom_id \"%s\"\n", line_no, custom_id);
        return -1;
    }
    r->done = 1;
    return 0;
}

static int write_line(batch_out *out, char *line) {
    if (!line) {
        fprintf(stderr, "deepinfer " CMD ": out of memory\n");
        return -1;
    }
    int rc = batch_out_append(out, line, strlen(line));
    free(line);
    return rc;
}

/* Serves the pending requests: up to max_active in the engine, each line
 * written the moment its request finishes. */
static int job_run(batch_job *j, di_engine *e, batch_out *out, size_t max_active, int quiet) {
    size_t total = j->n, done = 0, next = 0, active = 0;
    for (size_t i = 0; i < j->n; i++) done += j->reqs[i].done;
    size_t done_at_start = done;
    cli_progress bar;
    cli_progress_init(&bar, "batch");
    uint64_t *ids = malloc(max_active * sizeof *ids);
    batch_req **by_slot = calloc(max_active, sizeof *by_slot);
    if (!ids || !by_slot) {
        free(ids);
        free(by_slot);
        fprintf(stderr, "deepinfer " CMD ": out of memory\n");
        return -1;
    }
    int rc = 0;
    di_engine_stats st0;
    di_engine_get_stats(e, &st0);
    while (!rc && (next < j->n || active)) {
        /* fill the engine */
        while (!rc && next < j->n && active < max_active) {
            batch_req *r = &j->reqs[next++];
            if (r->done) continue;
            if (r->refusal) {
                rc = write_line(out, batch_error_line(r->custom_id, "invalid_request", r->refusal));
                r->done = 1, done++;
                continue;
            }
            if (di_engine_submit_chat(e, r->body, strlen(r->body), NULL, NULL, &r->engine_id)) {
                rc = write_line(out, batch_error_line(r->custom_id, "invalid_request", di_last_error()));
                r->done = 1, done++;
                continue;
            }
            for (size_t k = 0; k < max_active; k++)
                if (!by_slot[k]) {
                    by_slot[k] = r;
                    break;
                }
            active++;
        }
        if (rc || !active) break;
        if (di_engine_step(e, NULL)) {
            fprintf(stderr, "\ndeepinfer " CMD ": engine failure: %s (rerun to resume)\n", di_last_error());
            rc = -1;
            break;
        }
        size_t n_fin = 0;
        di_engine_poll_finished(e, ids, max_active, &n_fin);
        for (size_t f = 0; f < n_fin && !rc; f++) {
            for (size_t k = 0; k < max_active; k++) {
                batch_req *r = by_slot[k];
                if (!r || r->engine_id != ids[f]) continue;
                rc = write_line(out, batch_response_line(e, r->engine_id, r->custom_id, r->model));
                di_engine_release(e, r->engine_id);
                by_slot[k] = NULL;
                r->done = 1, done++;
                active--;
                break;
            }
        }
        if (!quiet) {
            di_engine_stats st;
            di_engine_get_stats(e, &st);
            cli_progress_draw(&bar, done, total, st.prompt_tokens - st0.prompt_tokens,
                              st.output_tokens - st0.output_tokens, 0);
        }
    }
    if (!quiet) {
        di_engine_stats st;
        di_engine_get_stats(e, &st);
        cli_progress_draw(&bar, done, total, st.prompt_tokens - st0.prompt_tokens,
                          st.output_tokens - st0.output_tokens, 1);
        fprintf(stderr, "deepinfer " CMD ": %zu of %zu requests answered in this run, %zu before\n",
                done - done_at_start, total, done_at_start);
    }
    free(ids);
    free(by_slot);
    return rc;
}

int cli_batch(int argc, char **argv) {
    const char *in = NULL, *outp = NULL;
    int sync_each = 1, quiet = 0;
    int64_t seed = 0, max_active = 0;
    cli_engine_args ea = {0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int has = i + 1 < argc;
        int r = cli_engine_arg(CMD, argc, argv, &i, &ea);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            usage(stdout);
            return 0;
        } else if (has && !strcmp(f, "--input")) in = argv[++i];
        else if (has && !strcmp(f, "--output")) outp = argv[++i];
        else if (has && !strcmp(f, "--seed")) {
            if (cli_parse_i64(CMD, f, argv[++i], 0, INT64_MAX, &seed)) return 2;
        } else if (has && !strcmp(f, "--max-active")) {
            if (cli_parse_i64(CMD, f, argv[++i], 1, 1 << 20, &max_active)) return 2;
        } else if (has && !strcmp(f, "--fsync")) {
            const char *v = argv[++i];
            if (!strcmp(v, "line")) sync_each = 1;
            else if (!strcmp(v, "none")) sync_each = 0;
            else {
                fprintf(stderr, "deepinfer " CMD ": --fsync: expected line or none, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(f, "--quiet")) quiet = 1;
        else {
            fprintf(stderr, "deepinfer " CMD ": unexpected argument '%s'\n", f);
            usage(stderr);
            return 2;
        }
    }
    if (!in || !outp) {
        fprintf(stderr, "deepinfer " CMD ": --input and --output are required\n");
        usage(stderr);
        return 2;
    }
    batch_job job = {.in_path = in};
    batch_out out = {.fd = -1};
    di_engine *e = NULL;
    int rc = 1;
    if (job_read(&job, in, (uint64_t)seed)) goto done;
    if (batch_out_open(&out, outp, sync_each, on_seen, &job)) goto done;
    if (out.torn_bytes)
        fprintf(stderr, "deepinfer " CMD ": %s: removed a torn last line (%zu bytes) left by an interrupted run\n",
                outp, out.torn_bytes);
    if (out.n_kept == job.n) {
        if (!quiet) fprintf(stderr, "deepinfer " CMD ": all %zu requests already answered in %s\n", job.n, outp);
        rc = 0;
        goto done;
    }
    if (!(e = cli_engine_open(CMD, &ea))) goto done;
    if (!max_active) { /* enough waiting to refill the step as sequences finish */
        di_engine_info info;
        di_engine_get_info(e, &info);
        max_active = 2 * (int64_t)info.max_batch > 256 ? 2 * (int64_t)info.max_batch : 256;
    }
    rc = job_run(&job, e, &out, (size_t)max_active, quiet) ? 1 : 0;
done:
    di_engine_close(e);
    batch_out_close(&out);
    job_free(&job);
    return rc;
}
