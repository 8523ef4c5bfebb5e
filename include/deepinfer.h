/* deepinfer — offline inference engine for DeepSeek-V4.1-Flash.
 *
 * The public C API. It is deliberately narrow: opaque handles, plain C types,
 * and one rule for failures — every function that can fail returns a
 * di_status (DI_OK == 0 on success) and leaves a human-readable message that
 * the caller reads with di_last_error() on the same thread. The library never
 * prints and never terminates the process.
 *
 * Sections: status & errors, version, models (open / inspect / close),
 * memory plans. Later sections (tokenizer, constraints, engine) follow the
 * same conventions. */
#ifndef DEEPINFER_H
#define DEEPINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DI_API __attribute__((visibility("default")))
#else
#define DI_API
#endif

/* ---------------------------------------------------------------- status */

typedef enum di_status {
    DI_OK = 0,
    DI_ERR_INVALID_ARG = 1, /* a caller-supplied value is out of range */
    DI_ERR_IO = 2,          /* open / read / mmap / write failed */
    DI_ERR_FORMAT = 3,      /* malformed file or document */
    DI_ERR_UNSUPPORTED = 4, /* valid but not supported by this build/model */
    DI_ERR_NOMEM = 5,       /* allocation failed */
    DI_ERR_LIMIT = 6,       /* a configured cap was exceeded */
    DI_ERR_NOT_FOUND = 7,   /* a named thing does not exist */
    DI_ERR_STATE = 8,       /* call not valid in the object's current state */
    DI_ERR_BACKEND = 9,     /* accelerator / kernel failure */
    DI_ERR_INTERNAL = 10    /* a bug: please report */
} di_status;

/* Message of the last failure on this thread ("" if none). The pointer stays
 * valid until the next failing call on the same thread. */
DI_API const char *di_last_error(void);
DI_API di_status di_last_status(void);

/* --------------------------------------------------------------- version */

DI_API const char *di_version(void);

/* ----------------------------------------------------------------- models */

typedef struct di_model di_model; /* opaque: config + bound weights */

typedef enum di_load_format {
    DI_LOAD_AUTO = 0,  /* safetensors checkpoint from a model directory */
    DI_LOAD_DUMMY = 1  /* random weights in the official formats, no files */
} di_load_format;

typedef struct di_model_options {
    di_load_format load_format;
    uint64_t seed;        /* dummy weights: generator seed */
    int verify_data;      /* 1 = read every byte once while opening (check) */
    /* Dummy weights only. The real config is 510 GB: materialise only blocks
     * [dummy_block_begin, dummy_block_end) (0, 0 = all), or nothing at all
     * with dummy_lazy = 1. Tensors left out keep their shapes and dtypes and
     * are generated on demand. dummy_max_bytes (0 = no cap) refuses larger
     * allocations with DI_ERR_LIMIT. */
    int32_t dummy_block_begin, dummy_block_end;
    int dummy_lazy;
    uint64_t dummy_max_bytes;
} di_model_options;

DI_API void di_model_options_default(di_model_options *opts);

/* Opens a model directory (config.json + safetensors shards [+ index]).
 * For DI_LOAD_DUMMY, `path` is a config.json file or a directory holding one. */
DI_API di_status di_model_open(const char *path, const di_model_options *opts,
                               di_model **out);
DI_API void di_model_close(di_model *model);

/* Summary of an opened model. */
typedef struct di_model_info {
    int n_layers;          /* backbone layers */
    int n_dspark_stages;   /* mtp.* blocks */
    int64_t hidden_size;
    int64_t vocab_size;
    int n_routed_experts;
    int n_active_experts;
    uint64_t n_tensors;    /* bound tensors */
    uint64_t weight_bytes; /* bytes of the bound tensors */
    uint64_t resident_bytes; /* of which in memory now (dummy) or mapped (checkpoint) */
    int is_dummy;
} di_model_info;

DI_API di_status di_model_get_info(const di_model *model, di_model_info *out);

/* Human-readable summary (config, per-layer roles, weights) in a new string
 * released with di_free(). */
DI_API di_status di_model_describe(const di_model *model, char **out);

/* Directory of the embedded default tiny model. It is generated
 * deterministically (dummy weights in the official format) into the cache
 * folder ($DEEPINFER_CACHE_DIR, else $XDG_CACHE_HOME/deepinfer, else
 * ~/.cache/deepinfer) on first use. Writes the path into buf. */
DI_API di_status di_default_model_path(char *buf, size_t buf_size);

/* ------------------------------------------------------------ memory plan */

/* Renders the memory plan of a model (weights per dtype, per-token KV/index
 * bytes, fixed per-sequence state, devices needed) as text or JSON into a
 * newly allocated string the caller releases with di_free(). Zero for
 * context_tokens, batch or device_gib takes the default (131072 tokens, 1
 * sequence, 140 GiB). */
DI_API di_status di_model_plan(const di_model *model, int as_json,
                               uint64_t context_tokens, uint32_t batch,
                               double device_gib, char **out);

/* Releases memory the library allocated for the caller. */
DI_API void di_free(void *p);

/* -------------------------------------------------------------- tokenizer */

/* A byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json of the
 * DeepSeek V3/V4 family. Immutable once loaded: every function below may be
 * called from several threads at once on the same tokenizer. */
typedef struct di_tokenizer di_tokenizer;

DI_API di_status di_tokenizer_load(const char *path, di_tokenizer **out);
DI_API di_status di_tokenizer_load_memory(const char *json, size_t len, di_tokenizer **out);
DI_API void di_tokenizer_free(di_tokenizer *tok);

/* Number of token ids (largest id + 1, added tokens included). */
DI_API size_t di_tokenizer_vocab_size(const di_tokenizer *tok);

/* Encoding flags. Without DI_TOKENIZE_PARSE_SPECIAL the text is plain text:
 * the spelling of an added token ("<｜User｜>") encodes as ordinary
 * characters, so user content cannot inject control tokens. With it, added
 * tokens are matched first (leftmost-longest), as HF tokenizers' encode()
 * does; use it only for trusted prompt templates. */
enum { DI_TOKENIZE_PARSE_SPECIAL = 1 };

/* Encodes text[0..len) into a new array *ids of *n_ids ids, released with
 * di_free(). Any bytes are accepted: a byte that is not part of valid UTF-8
 * is pre-tokenized as if it were U+FFFD (what HF tokenizers would see after
 * a lossy decode) but keeps its own byte, so decode(encode(x)) == x for
 * every byte string. Each calling thread keeps a 1 MiB cache of short
 * pieces across calls (freed when the thread exits). */
DI_API di_status di_tokenizer_encode(const di_tokenizer *tok, const char *text, size_t len,
                                     unsigned flags, int32_t **ids, size_t *n_ids);

/* Decodes ids into a new NUL-terminated byte string (*text, *len bytes
 * before the NUL), released with di_free(). An id outside the vocabulary is
 * an error. The bytes need not be valid UTF-8 (a partial sequence). */
DI_API di_status di_tokenizer_decode(const di_tokenizer *tok, const int32_t *ids, size_t n_ids,
                                     char **text, size_t *len);

/* The bytes one token decodes to; *bytes stays valid while tok lives. */
DI_API di_status di_tokenizer_token_bytes(const di_tokenizer *tok, int32_t id,
                                          const char **bytes, size_t *len);

/* Id of a token by its spelling in tokenizer.json (added tokens such as
 * "<｜end▁of▁sentence｜>", or vocabulary entries in the byte-level alphabet).
 * DI_ERR_NOT_FOUND when absent. */
DI_API di_status di_tokenizer_token_id(const di_tokenizer *tok, const char *spelling,
                                       int32_t *id);

/* 1 when id is an added token marked "special" in tokenizer.json. */
DI_API int di_tokenizer_is_special(const di_tokenizer *tok, int32_t id);

/* Streaming detokenizer: feed ids one at a time and get the text that is
 * complete so far. An incomplete UTF-8 sequence at the end is held back
 * until the next token completes it (or the flush). */
typedef struct di_detokenizer di_detokenizer;

/* Flags: DI_DETOK_LOSSY replaces every ill-formed sequence by U+FFFD, so
 * all output is valid UTF-8; without it the concatenated output equals
 * di_tokenizer_decode() of the same ids byte for byte. */
enum { DI_DETOK_LOSSY = 1 };

DI_API di_status di_detokenizer_new(const di_tokenizer *tok, unsigned flags,
                                    di_detokenizer **out);
/* Appends one token. *text / *len: the newly completed bytes (possibly
 * none), valid until the next call on d. */
DI_API di_status di_detokenizer_push(di_detokenizer *d, int32_t id, const char **text,
                                     size_t *len);
/* Ends the stream: returns what was held back (an unfinished sequence,
 * as U+FFFD in lossy mode) and resets d for a new stream. */
DI_API di_status di_detokenizer_flush(di_detokenizer *d, const char **text, size_t *len);
DI_API void di_detokenizer_free(di_detokenizer *d);

/* Engram compressed-token map (architecture.md §6.2): map_out (room for
 * di_tokenizer_vocab_size() entries) receives each id's class, numbered in
 * first-seen order; *n_classes the number of classes. */
DI_API di_status di_tokenizer_engram_map(const di_tokenizer *tok, int32_t *map_out,
                                         int *n_classes);

/* ------------------------------------------------------------------- chat */

/* V4.1 chat encoding and output parsing (architecture.md §9.2). A chat is
 * given as JSON: either an array of OpenAI messages, or a Chat Completions
 * request object (messages, tools, tool_choice, response_format, thinking,
 * reasoning_effort, ...). Roles: system (and developer), user, assistant
 * (content, reasoning_content, tool_calls, prefix), tool (tool_call_id),
 * latest_reminder; a system message may carry "tools" (V4.1 updated tool
 * schemas). */
typedef struct di_chat_options {
    int thinking;                 /* -1: as the JSON says (default on); 0 off; 1 on */
    const char *reasoning_effort; /* NULL: as the JSON says; else none/minimal/low/
                                     medium/high/xhigh/max */
    int add_generation_prompt;    /* 1 (default): end with the assistant turn opening */
} di_chat_options;

DI_API void di_chat_options_default(di_chat_options *opts);

/* The prompt text (special tokens spelled out), NUL-terminated, released
 * with di_free(); *prompt_len (may be NULL) receives its length. */
DI_API di_status di_chat_render(const char *json, size_t len, const di_chat_options *opts,
                                char **prompt, size_t *prompt_len);

/* The prompt's token ids (released with di_free()): the template's special
 * tokens as their ids, all message text encoded as plain text, so special
 * spellings typed by users stay ordinary characters. */
DI_API di_status di_chat_encode(const di_tokenizer *tok, const char *json, size_t len,
                                const di_chat_options *opts, int32_t **ids, size_t *n_ids);

/* Output parsing flags: how the prompt ended. */
enum {
    DI_CHAT_PARSE_THINKING = 1,   /* the prompt opened a think block */
    DI_CHAT_PARSE_TOOLS = 2,      /* tools were offered: parse DSML tool calls */
    DI_CHAT_PARSE_IN_CALLS = 4,   /* the prompt opened the tool-call block (required) */
    DI_CHAT_PARSE_CONTINUE = 8    /* the output continues a prefix message */
};

/* The flags above for the output of a chat's prompt (same JSON and options
 * as di_chat_render). */
DI_API di_status di_chat_output_flags(const char *json, size_t len, const di_chat_options *opts,
                                      unsigned *flags);

/* Parses a whole generated text into an assistant message, as JSON:
 * {"role": "assistant", "content": ..., "reasoning_content": ... (thinking),
 *  "tool_calls": [{"index", "type": "function", "function": {"name",
 *  "arguments"}}] (when any)}. Released with di_free(). */
DI_API di_status di_chat_parse(const char *text, size_t len, unsigned flags, char **message_json);

/* Incremental parsing. Each push returns the delta it completed as JSON
 * ({} when nothing): {"reasoning_content": ..., "content": ..., "tool_calls":
 * [{"index": i, "function": {"name": ... (first delta), "arguments": ...}}]}.
 * finish returns the last delta and the whole message. The result never
 * depends on how the text was split. Strings released with di_free(). */
typedef struct di_chat_stream di_chat_stream;

DI_API di_status di_chat_stream_new(unsigned flags, const char *const *stop, size_t n_stop,
                                    di_chat_stream **out);
DI_API di_status di_chat_stream_push(di_chat_stream *s, const char *text, size_t len,
                                     char **delta_json);
DI_API di_status di_chat_stream_finish(di_chat_stream *s, char **delta_json, char **message_json);
DI_API void di_chat_stream_free(di_chat_stream *s);

#ifdef __cplusplus
}
#endif

#endif /* DEEPINFER_H */
