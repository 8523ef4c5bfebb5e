/* Output parsing for V4.1 (architecture.md §9.2, deepinfer.md §7.1): splits
 * generated text into reasoning content, answer content and DSML tool calls
 * (name + JSON arguments), incrementally while streaming.
 *
 * The rules follow DeepSeek's deepseek-recipe stream parser:
 * - thinking: reasoning runs to the first "</think>" (or to a tool-call
 *   block opening inside it); its leading newlines are dropped, and its
 *   trailing ones when "</think>" or a call block follows;
 * - content: leading newlines are dropped, "</think>" is removed, and the
 *   first "<｜DSML｜" opens the tool-call block (newlines just before it are
 *   dropped); stop strings end the output (in content only);
 * - tool calls: only DSML tags count, text between them is skipped; each
 *   `invoke` becomes one call whose arguments are a JSON object built as the
 *   text arrives: string="true" values as JSON strings, other values copied
 *   verbatim; a bad string attribute or the closing `calls` tag ends
 *   parsing. Output cut by a length limit keeps what was there, as the
 *   reference does (an open string stays open).
 * On well-formed and truncated outputs the result is the reference's; on
 * DSML garbage (tags inside names or values) the two may differ.
 * Text is consumed as it arrives; only a suffix that might still turn into a
 * marker (or a stop string, or newlines whose fate is unknown) is held back,
 * so the result never depends on how the text was split into pieces. */
#ifndef DI_RECIPE_PARSE_H
#define DI_RECIPE_PARSE_H

#include <stddef.h>

#include "core/error.h"
#include "recipe/chat_json.h"

typedef enum di_parse_start {
    DI_PARSE_REASONING,          /* thinking: a new turn (after "<think>") */
    DI_PARSE_REASONING_CONTINUE, /* thinking: continuing reasoning (prefix) */
    DI_PARSE_CONTENT,            /* non-thinking: after "</think>" */
    DI_PARSE_CONTENT_CONTINUE,   /* continuing an answer (prefix) */
    DI_PARSE_TOOL_CALLS          /* the prompt opened the call block (tool_choice required) */
} di_parse_start;

typedef struct di_parse_call {
    di_buf name;
    di_buf arguments;
} di_parse_call;

typedef struct di_parser {
    /* results so far; streaming callers read what grew since the last push */
    di_buf reasoning;
    di_buf content;
    di_parse_call *calls; /* [n_calls] */
    size_t n_calls, cap_calls;
    int has_reasoning;    /* started in thinking mode */
    int stopped;          /* a stop string was found */
    /* internal */
    int state, sub /* parameter header: 4 before the name, 1 in it, 2-3 after it */, params_in_call, value_is_string, leading, finished, parse_tools;
    di_buf pending;       /* text received; bytes from pending_off on are not consumed */
    size_t pending_off;
    size_t held_newlines; /* content/reasoning newlines whose fate is unknown */
    char **stop;          /* [n_stop] copies */
    size_t n_stop;
    int oom;
} di_parser;

/* parse_tools: 0 leaves DSML text in the content (no tools were offered). */
di_status di_parser_init(di_parser *p, di_parse_start start, int parse_tools,
                         const char *const *stop, size_t n_stop, di_err *err);
void di_parser_free(di_parser *p);
di_status di_parser_push(di_parser *p, const char *text, size_t len, di_err *err);
/* End of output: releases what was held back. */
di_status di_parser_finish(di_parser *p, di_err *err);

/* The parsed message as an OpenAI assistant message JSON object:
 * {"role": "assistant", "content": ..., "reasoning_content": ... (thinking
 * only), "tool_calls": [{"type": "function", "function": {"name", "arguments"}}]}. */
char *di_parser_message_json(const di_parser *p);

#endif
