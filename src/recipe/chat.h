/* V4.1 chat encoding: the conversation model and its prompt rendering
 * (architecture.md §9.2; ecosystem.md §2.2).
 *
 * A conversation is a list of messages (system / user / assistant / tool /
 * latest_reminder) plus prompt settings (thinking, reasoning effort, tools,
 * tool choice, response format). Rendering produces the exact prompt text of
 * DeepSeek's V4.1 encoder, split into segments: each segment is either one
 * explicit special token the template placed, or plain text. Token ids come
 * from encoding special segments as their token and plain segments with the
 * added vocabulary switched off, so a user who types a special-token
 * spelling gets its characters, never the control token.
 *
 * The layout, as DeepSeek's V4.1 encoder produces it:
 *   BOS, then a header <｜System｜> [Reasoning Effort line (thinking)] [first
 *   system message] [## Tools section] [## Response Format section] [the
 *   first system message's ### Updated Tool Schemas]; the header exists when
 *   any part but the effort line does, or thinking is on and there is a
 *   message. Then per message: later system turns <｜System｜>text; a run of
 *   user/tool messages is one <｜User｜> turn, parts joined by blank lines,
 *   tool results as <tool_result>…</tool_result> stably sorted into the
 *   order of the latest assistant calls (unknown ids rank with the first
 *   call); a run of latest_reminder messages shows only its first; an
 *   assistant turn is <｜Assistant｜> + (<think>reasoning</think> when
 *   thinking with tools offered, else </think>) + content + DSML calls +
 *   EOS. A final prefix message is continued instead (its reasoning shown,
 *   think block left open while it has no content). The generation prompt
 *   is <｜Assistant｜><think> or </think>, plus an opened call block when a
 *   tool call is required. */
#ifndef DI_RECIPE_CHAT_H
#define DI_RECIPE_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "recipe/chat_json.h"

typedef enum di_chat_role {
    DI_CHAT_SYSTEM,
    DI_CHAT_USER,
    DI_CHAT_ASSISTANT,
    DI_CHAT_TOOL,
    DI_CHAT_LATEST_REMINDER
} di_chat_role;

typedef enum di_chat_tool_choice {
    DI_CHAT_TOOL_AUTO,
    DI_CHAT_TOOL_NONE,     /* tools are left out of the prompt */
    DI_CHAT_TOOL_REQUIRED  /* the generation prompt opens a tool-call block */
} di_chat_tool_choice;

typedef enum di_chat_effort {
    DI_CHAT_EFFORT_DEFAULT, /* same as high */
    DI_CHAT_EFFORT_LOW,     /* 50 */
    DI_CHAT_EFFORT_HIGH,    /* 75 */
    DI_CHAT_EFFORT_XHIGH,   /* 75: V4.1 has no separate level for it */
    DI_CHAT_EFFORT_MAX      /* 100 */
} di_chat_effort;

typedef enum di_chat_format {
    DI_CHAT_FORMAT_TEXT,
    DI_CHAT_FORMAT_JSON_OBJECT,
    DI_CHAT_FORMAT_JSON_SCHEMA,
    DI_CHAT_FORMAT_REGEX /* enforced by decoding only; nothing in the prompt */
} di_chat_format;

typedef struct di_chat_tool_call {
    char *id;        /* may be NULL */
    char *name;
    char *arguments; /* JSON object text as the client sent it */
} di_chat_tool_call;

typedef struct di_chat_tool {
    char *name;
    char *description;  /* NULL: none */
    di_jv *parameters;  /* NULL: none (printed as null) */
} di_chat_tool;

typedef struct di_chat_msg {
    di_chat_role role;
    char *content;               /* never NULL */
    char *reasoning;             /* assistant: NULL when absent */
    di_chat_tool_call *calls;    /* assistant: [n_calls] */
    size_t n_calls;
    char *tool_call_id;          /* tool: NULL when absent */
    di_chat_tool *tools;         /* system: tool schemas this message updates, [n_tools] */
    size_t n_tools;
    int prefix;                  /* assistant: the final message is continued */
} di_chat_msg;

typedef struct di_chat {
    di_chat_msg *msgs;   /* [n_msgs] */
    size_t n_msgs, cap_msgs;
    di_chat_tool *tools; /* [n_tools] */
    size_t n_tools, cap_tools;
    int thinking;                    /* default 1 */
    di_chat_effort effort;
    di_chat_tool_choice tool_choice;
    di_chat_format format;
    di_jv *response_schema;          /* DI_CHAT_FORMAT_JSON_SCHEMA */
    char *response_regex;            /* DI_CHAT_FORMAT_REGEX */
    int add_generation_prompt;       /* default 1 */
} di_chat;

void di_chat_init(di_chat *c);
void di_chat_free(di_chat *c);

/* Appends a message with a copy of content[0..n); returns it, or NULL when
 * out of memory. The pointer is valid until the next append. */
di_chat_msg *di_chat_add(di_chat *c, di_chat_role role, const char *content, size_t n);
/* Setters copy their strings; each returns -1 when out of memory. */
int di_chat_msg_set_reasoning(di_chat_msg *m, const char *s, size_t n);
int di_chat_msg_set_tool_call_id(di_chat_msg *m, const char *s);
int di_chat_msg_add_call(di_chat_msg *m, const char *id, const char *name, const char *args,
                         size_t args_len);
/* Adds a tool definition to the conversation (system == NULL) or to a system
 * message; parameters (may be NULL) is copied. */
int di_chat_add_tool(di_chat *c, di_chat_msg *system, const char *name, const char *description,
                     const di_jv *parameters);

/* Checks what the renderer relies on (prefix only on a final assistant
 * message, calls only on assistant messages, names present...). */
di_status di_chat_validate(const di_chat *c, di_err *err);

/* ----------------------------------------------------------------- render */

typedef struct di_chat_segment {
    size_t offset, len; /* bytes of di_chat_prompt.text */
    int special;        /* 1: exactly one special token's spelling */
} di_chat_segment;

typedef struct di_chat_prompt {
    char *text;             /* NUL-terminated prompt, [len] bytes */
    size_t len;
    di_chat_segment *segs;  /* [n_segs], in order, covering text; no two plain ones adjacent */
    size_t n_segs;
} di_chat_prompt;

di_status di_chat_prompt_render(const di_chat *c, di_chat_prompt *out, di_err *err);
void di_chat_prompt_free(di_chat_prompt *p);

/* How output generated after this chat's prompt must be parsed: the
 * DI_CHAT_PARSE_* flags of deepinfer.h (think block open, tools offered, call
 * block open, continuing a prefix message), derived with the renderer's own
 * rules. */
unsigned di_chat_parse_flags(const di_chat *c);

/* The special-token spellings the template uses (for the tokenizer). */
#define DI_CHAT_BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DI_CHAT_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DI_CHAT_SYSTEM_TOK "<\xef\xbd\x9cSystem\xef\xbd\x9c>"
#define DI_CHAT_USER_TOK "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DI_CHAT_ASSISTANT_TOK "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define DI_CHAT_REMINDER_TOK "<\xef\xbd\x9clatest_reminder\xef\xbd\x9c>"
#define DI_CHAT_THINK_START "<think>"
#define DI_CHAT_THINK_END "</think>"
#define DI_CHAT_DSML "\xef\xbd\x9c" "DSML\xef\xbd\x9c"

/* Turns a prompt into token ids through two callbacks: `special` maps one
 * special spelling to its id, `plain` appends the ids of plain text encoded
 * without the added vocabulary. Both return DI_OK or an error. */
typedef di_status (*di_chat_special_fn)(void *ctx, const char *s, size_t n, int32_t *id,
                                        di_err *err);
typedef di_status (*di_chat_plain_fn)(void *ctx, const char *s, size_t n, int32_t **ids,
                                      size_t *n_ids, size_t *cap, di_err *err);
di_status di_chat_prompt_ids(const di_chat_prompt *p, di_chat_special_fn special,
                             di_chat_plain_fn plain, void *ctx, int32_t **ids, size_t *n_ids,
                             di_err *err);

#endif
