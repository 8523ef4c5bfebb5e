/* OpenAI Chat Completions requests → V4.1 conversation + sampling settings
 * (ecosystem.md §4; deepinfer.md §7.1).
 *
 * The request body is read strictly: every field is either understood,
 * explicitly ignored because it has no effect offline (user, metadata,
 * stream_options...), or rejected with an error that names the field and
 * what is supported. Thinking follows DeepSeek's switches: `"thinking":
 * {"type": "enabled"|"disabled"}`, `reasoning_effort` ("none" turns thinking
 * off; minimal/low → low, medium/high → high, xhigh, max/ultra → max) and the
 * vLLM-style `chat_template_kwargs.thinking`. Unlike DeepSeek's API server,
 * requested temperature and top_p are kept in thinking mode: an offline
 * engine does what the caller asked. Also more lenient than that server:
 * n > 1 is accepted, tool_call_id is optional, tool results need not follow
 * calls, json_object does not require the word "json" in the prompt. Like
 * it: empty system messages are dropped, text parts are joined by blank
 * lines, tools without parameters get {}, strict tools get every property
 * required and no others allowed, and a required (or named) tool choice is
 * refused in thinking mode. */
#ifndef DI_RECIPE_OPENAI_H
#define DI_RECIPE_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "recipe/chat.h"

/* Sampling settings of one request. Defaults are vLLM's except max_tokens,
 * which stays unset (-1) so the caller applies its own limit. */
typedef struct di_sampling {
    double temperature;       /* [0, 2]; 0 = greedy; default 1 */
    double top_p;             /* (0, 1]; default 1 */
    int32_t top_k;            /* 0 or -1 = all; default 0 */
    double min_p;             /* [0, 1]; default 0 */
    double presence_penalty;  /* [-2, 2]; default 0 */
    double frequency_penalty; /* [-2, 2]; default 0 */
    double repetition_penalty;/* (0, 2]; default 1 */
    int64_t max_tokens;       /* >= 1, or -1 when the request sets none */
    int has_seed;
    uint64_t seed;
    char **stop;              /* [n_stop] stop strings */
    size_t n_stop;
    int32_t n;                /* completions per request, >= 1; default 1 */
    int logprobs;             /* 1: report the sampled token's log probability */
    int32_t top_logprobs;     /* [0, 20] */
    int stream;
    int ignore_eos;
    char *model;              /* the request's model name, NULL when absent */
    char *tool_name;          /* tool_choice naming one function, else NULL */
} di_sampling;

void di_sampling_init(di_sampling *s);
void di_sampling_free(di_sampling *s);

/* Options a caller may set before converting. */
typedef struct di_openai_options {
    int default_thinking; /* thinking when the request does not say; default 1 */
} di_openai_options;

void di_openai_options_default(di_openai_options *o);

/* Converts a Chat Completions body (JSON text) into *chat (initialised
 * here) and *sampling (initialised here). On failure both are left empty. */
di_status di_openai_convert(const char *body, size_t len, const di_openai_options *opts,
                            di_chat *chat, di_sampling *sampling, di_err *err);

/* The same for an already parsed body; unlike di_openai_convert it accepts
 * an empty message list (a prompt of the header alone). */
di_status di_openai_convert_value(const di_jv *req, const di_openai_options *opts, di_chat *chat,
                                  di_sampling *sampling, di_err *err);

/* Appends the messages of a JSON array (OpenAI format) to chat. `where`
 * prefixes error locations ("messages"). */
di_status di_openai_messages(const di_jv *messages, const char *where, di_chat *chat, di_err *err);

#endif
