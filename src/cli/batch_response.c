/* Output lines of `deepinfer batch` (see batch_response.h). */
#include "cli/batch_response.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t batch_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static cJSON *line_head(const char *custom_id) {
    char id[64];
    snprintf(id, sizeof id, "batch_req_%016llx", (unsigned long long)batch_hash(custom_id));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "custom_id", custom_id);
    return o;
}

static char *finish(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

char *batch_error_line(const char *custom_id, const char *code, const char *message) {
    cJSON *o = line_head(custom_id);
    cJSON_AddNullToObject(o, "response");
    cJSON *err = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(err, "code", code);
    cJSON_AddStringToObject(err, "message", message);
    return finish(o);
}

/* choices[i].message: role, content, reasoning_content, tool_calls (null
 * when absent), each call given an id derived from the request. */
static cJSON *message(const di_completion *c, const char *custom_id) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    if (c->content) cJSON_AddStringToObject(m, "content", c->content);
    else if (c->message_json) cJSON_AddNullToObject(m, "content");
    else cJSON_AddStringToObject(m, "content", c->text);
    if (c->reasoning_content) cJSON_AddStringToObject(m, "reasoning_content", c->reasoning_content);
    else cJSON_AddNullToObject(m, "reasoning_content");
    cJSON *calls = c->tool_calls_json ? cJSON_Parse(c->tool_calls_json) : NULL;
    if (cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0) {
        int k = 0;
        cJSON *call;
        cJSON_ArrayForEach(call, calls) {
            char id[96];
            snprintf(id, sizeof id, "call_%016llx_%d_%d", (unsigned long long)batch_hash(custom_id), c->index, k++);
            cJSON_DeleteItemFromObjectCaseSensitive(call, "index");
            cJSON_AddStringToObject(call, "id", id);
        }
        cJSON_AddItemToObject(m, "tool_calls", calls);
    } else {
        cJSON_Delete(calls);
        cJSON_AddNullToObject(m, "tool_calls");
    }
    return m;
}

static const char *openai_finish(const di_completion *c) {
    if (c->finish_reason == DI_FINISH_STOP && c->tool_calls_json && strcmp(c->tool_calls_json, "[]"))
        return "tool_calls";
    return di_finish_reason_name(c->finish_reason);
}

char *batch_response_line(const di_engine *e, uint64_t id, const char *custom_id, const char *model) {
    di_request_output ro;
    if (di_engine_get_output(e, id, &ro)) return batch_error_line(custom_id, "engine_error", di_last_error());
    uint64_t h = batch_hash(custom_id);
    cJSON *choices = cJSON_CreateArray();
    uint64_t completion_tokens = 0;
    for (size_t j = 0; j < ro.n_completions; j++) {
        di_completion c;
        if (di_engine_get_completion(e, id, j, &c)) {
            cJSON_Delete(choices);
            return batch_error_line(custom_id, "engine_error", di_last_error());
        }
        if (c.finish_reason == DI_FINISH_ERROR) {
            cJSON_Delete(choices);
            return batch_error_line(custom_id, "generation_error", c.error ? c.error : "generation failed");
        }
        completion_tokens += c.n_tokens;
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", (double)j);
        cJSON_AddItemToObject(ch, "message", message(&c, custom_id));
        cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddStringToObject(ch, "finish_reason", openai_finish(&c));
        cJSON_AddItemToArray(choices, ch);
    }
    char rid[64], cid[64];
    snprintf(rid, sizeof rid, "req_%016llx", (unsigned long long)h);
    snprintf(cid, sizeof cid, "chatcmpl-%016llx", (unsigned long long)h);
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "id", cid);
    cJSON_AddStringToObject(body, "object", "chat.completion");
    cJSON_AddNumberToObject(body, "created", (double)time(NULL));
    cJSON_AddStringToObject(body, "model", model ? model : "deepinfer");
    cJSON_AddItemToObject(body, "choices", choices);
    cJSON *usage = cJSON_AddObjectToObject(body, "usage");
    cJSON_AddNumberToObject(usage, "prompt_tokens", (double)ro.n_prompt);
    cJSON_AddNumberToObject(usage, "completion_tokens", (double)completion_tokens);
    cJSON_AddNumberToObject(usage, "total_tokens", (double)(ro.n_prompt + completion_tokens));
    cJSON *o = line_head(custom_id);
    cJSON *resp = cJSON_AddObjectToObject(o, "response");
    cJSON_AddNumberToObject(resp, "status_code", 200);
    cJSON_AddStringToObject(resp, "request_id", rid);
    cJSON_AddItemToObject(resp, "body", body);
    cJSON_AddNullToObject(o, "error");
    return finish(o);
}
