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
    /* Checkpoints: 0 = the weights stay mapped from the shard files (the
     * default); 1 = copied into memory the model owns, each tensor 64-byte
     * aligned, on 2 MB pages where the kernel grants them (the files' own
     * layout leaves rows off cache lines: the CPU kernels read copied
     * weights faster; same bytes, same results); -1 = copied when they take
     * at most half of the memory available now, else mapped (an engine on
     * the CPU asks for this). The environment's DI_WEIGHTS_IN_MEMORY=0 / 1
     * turns -1 into 0 / 1. */
    int weights_in_memory;
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
    uint64_t in_memory_bytes; /* a checkpoint's weights copied into memory (weights_in_memory), else 0 */
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

/* ------------------------------------------------------------ constraints */

/* Structured output (docs/structured-output.md): a regex, JSON Schema, EBNF
 * (GBNF dialect), list of choices or "any JSON object" is compiled against a
 * vocabulary into an immutable grammar; a matcher per request follows the
 * generated tokens and fills the allowed-token mask. Grammars and
 * vocabularies may be shared by threads; a matcher belongs to one thread. */
typedef struct di_vocab di_vocab;
typedef struct di_grammar di_grammar;
typedef struct di_matcher di_matcher;

/* A vocabulary of n_vocab ids (the logits size: ids without a token get
 * lens[i] = 0 or bytes[i] = NULL and are never allowed; so do special
 * tokens, which are not text). eos_id (-1: none) is allowed exactly where
 * the grammar may end. The bytes are copied. */
DI_API di_status di_vocab_create(size_t n_vocab, const uint8_t *const *bytes, const size_t *lens,
                                 int32_t eos_id, di_vocab **out);
DI_API size_t di_vocab_size(const di_vocab *v);
DI_API void di_vocab_free(di_vocab *v);

typedef enum di_constraint_kind {
    DI_CONSTRAINT_JSON_SCHEMA = 0, /* text: a JSON Schema (draft 2020-12) */
    DI_CONSTRAINT_REGEX = 1,       /* text: a regex the whole output must match */
    DI_CONSTRAINT_EBNF = 2,        /* text: GBNF rules, start symbol `root` */
    DI_CONSTRAINT_CHOICE = 3,      /* text: JSON array of strings, output one of them */
    DI_CONSTRAINT_JSON_OBJECT = 4  /* text ignored: any JSON object */
} di_constraint_kind;

typedef enum di_whitespace {
    DI_WS_FLEXIBLE = 0, /* JSON whitespace around punctuation, at most max_whitespace bytes each */
    DI_WS_COMPACT = 1   /* no whitespace between JSON tokens */
} di_whitespace;

typedef enum di_format_mode {
    DI_FORMAT_CHECKED = 0,    /* the formats we check are asserted, other formats are annotations */
    DI_FORMAT_ANNOTATION = 1, /* every format is an annotation (draft 2020-12's default vocabulary) */
    DI_FORMAT_ASSERT = 2      /* every format is asserted; one we cannot check exactly is an error */
} di_format_mode;

typedef struct di_grammar_options {
    int lenient;                     /* 1: skip unsupported JSON Schema keywords instead of failing */
    int forbid_additional_properties;/* 1: objects without additionalProperties get false (spec default: true) */
    di_whitespace whitespace;
    uint32_t max_whitespace;         /* per gap, flexible policy (default 16) */
    uint32_t max_rules;              /* grammar size cap (default 200000) */
    uint32_t max_depth;              /* schema / grammar nesting cap (default 64) */
    uint32_t max_lexer_states;       /* DFA states over all lexemes (default 500000) */
    uint32_t max_repeat;             /* cap on unrolled counts: maxItems, maxLength... (default 4096) */
    double max_compile_ms;           /* compile time budget (default 10000) */
    di_format_mode format_mode;      /* JSON Schema `format` (default DI_FORMAT_CHECKED) */
} di_grammar_options;

DI_API void di_grammar_options_default(di_grammar_options *opts);

/* Compiles a constraint. Failures: DI_ERR_FORMAT (syntax, with line:column),
 * DI_ERR_UNSUPPORTED (names the keyword / construct), DI_ERR_LIMIT (names
 * the cap). The vocabulary must outlive the grammar. */
DI_API di_status di_grammar_compile(const di_vocab *vocab, di_constraint_kind kind,
                                    const char *text, size_t len,
                                    const di_grammar_options *opts, di_grammar **out);
DI_API void di_grammar_free(di_grammar *g);

DI_API di_status di_matcher_create(const di_grammar *g, di_matcher **out);
DI_API void di_matcher_free(di_matcher *m);
/* Consumes one token. A token the mask would not allow fails with
 * DI_ERR_INVALID_ARG and leaves the state unchanged. EOS ends the output. */
DI_API di_status di_matcher_advance(di_matcher *m, int32_t token);
/* Consumes raw bytes as one step (counts as one token for rollback). */
DI_API di_status di_matcher_advance_bytes(di_matcher *m, const uint8_t *bytes, size_t len);
/* Undoes the last n steps (DI_ERR_INVALID_ARG if fewer were taken). */
DI_API di_status di_matcher_rollback(di_matcher *m, size_t n);
/* 1 when the output so far is complete (EOS would be allowed). */
DI_API int di_matcher_is_accepting(const di_matcher *m);
/* 1 once EOS was consumed. */
DI_API int di_matcher_is_finished(const di_matcher *m);
/* Writes the allowed-token bitset: bit (i % 32) of mask[i / 32] is set when
 * token i may come next. n_words must be at least (n_vocab + 31) / 32. */
DI_API di_status di_matcher_fill_mask(di_matcher *m, uint32_t *mask, size_t n_words);

/* ----------------------------------------------------------------- engine */

/* The offline generation engine (docs/engine.md): continuous batching of
 * many requests over one model, chunked prefill mixed with decode under a
 * per-step token budget, admission by the memory each sequence's state
 * needs and preemption (recompute) when it runs short, sampling with
 * per-request seeds, stop strings, structured output and chat parsing.
 *
 * Usage: di_engine_open, then any number of di_engine_submit_* (each
 * validated on its own: a bad request fails at submit and leaves the others
 * alone), then di_engine_run (to completion) or di_engine_step in a loop,
 * then read each request's outputs. Requests may be submitted between steps.
 * One engine is driven by one thread at a time. */
typedef struct di_engine di_engine;

typedef enum di_accelerator {
    DI_ACCEL_ENV = 0,    /* $DEEPINFER_ACCELERATOR, else cpu */
    DI_ACCEL_CPU = 1,
    DI_ACCEL_NVIDIA = 2  /* CUDA (Hopper); an error when the build has no CUDA or no GPU is visible */
} di_accelerator;

typedef struct di_engine_options {
    /* Model: a checkpoint folder (DI_LOAD_AUTO), or a config.json / folder
     * with one (DI_LOAD_DUMMY, weights generated from dummy_seed). NULL:
     * $DEEPINFER_HF_MODEL_DIR, else the embedded default tiny model. */
    const char *model;
    di_load_format load_format;
    uint64_t dummy_seed;
    /* tokenizer.json; NULL: <model folder>/tokenizer.json. Without a usable
     * tokenizer only token-id prompts are accepted and no text is produced. */
    const char *tokenizer;
    di_accelerator accelerator;
    int n_threads;               /* backend threads; 0 = all cores */
    /* Per-step budgets and the state budget; 0 (the default) = the
     * backend's: on the CPU 64 sequences, 512 tokens and 2 GiB; on a GPU
     * 1,024 sequences, 16,384 tokens and half the device memory the
     * weights leave (di_engine_info gives the values taken). */
    int max_batch;               /* sequences per step, 1..4096 */
    int64_t max_tokens_per_step; /* token budget of one step */
    int64_t max_prefill_chunk;   /* longest prefill chunk (default 0 = the budget) */
    uint64_t memory_limit;       /* bytes for per-sequence state */
    int64_t max_model_len;       /* prompt + output cap (default 0 = the config's
                                    max_position_embeddings, at most 65536) */
    int batch_invariant;         /* -1 (default): $DEEPINFER_BATCH_INVARIANT; 0 off; 1 on */
    int async_scheduling;        /* 1 (default): prepare step N+1 while step N runs */
    int bf16_numerics;           /* 1: skip FP8 activation quantization (reference dtype="bf16") */
    uint64_t seed;               /* seeds requests that set none (vLLM's LLM(seed=0)) */
} di_engine_options;

DI_API void di_engine_options_default(di_engine_options *opts);

/* Opens the model, its tokenizer and the backend; reads and validates the
 * DEEPINFER_* environment variables (a bad value is an error naming the
 * variable and the accepted values). */
DI_API di_status di_engine_open(const di_engine_options *opts, di_engine **out);
DI_API void di_engine_close(di_engine *e);

typedef struct di_engine_info {
    int64_t vocab_size;
    int64_t max_model_len;
    int32_t bos_id, eos_id;
    int has_tokenizer;
    int batch_invariant;   /* effective setting */
    int async_scheduling;
    int n_threads;
    const char *accelerator; /* "cpu" / "nvidia" */
    const char *model_path;  /* the folder or config actually opened */
    int max_batch;               /* the budgets in effect (options or the backend's defaults) */
    int64_t max_tokens_per_step;
    uint64_t memory_limit;
    uint64_t weights_in_memory; /* bytes of the checkpoint's weights copied into memory
                                   (di_model_options.weights_in_memory), 0 when mapped or dummy */
} di_engine_info;

DI_API di_status di_engine_get_info(const di_engine *e, di_engine_info *out);
/* The engine's tokenizer (NULL when it has none); lives as long as e. */
DI_API const di_tokenizer *di_engine_tokenizer(const di_engine *e);

/* The DEEPINFER_* environment variables, their values and meaning, as text
 * (one per line) in a new string released with di_free(). Fails like
 * di_engine_open on a bad value. */
DI_API di_status di_engine_env_describe(char **out);

/* Sampling settings of one request: vLLM's SamplingParams field names and
 * defaults, plus seq_seed and the structured-output fields. Pointers are
 * read during submit only (copied). */
typedef struct di_sampling_params {
    int32_t n;                  /* completions (default 1), 1..64 */
    double temperature;         /* default 1.0; 0 = greedy; [0, 100] */
    double top_p;               /* default 1.0; (0, 1] */
    int32_t top_k;              /* default 0; 0 or -1 = all */
    double min_p;               /* default 0; [0, 1] */
    double presence_penalty;    /* default 0; [-2, 2] */
    double frequency_penalty;   /* default 0; [-2, 2] */
    double repetition_penalty;  /* default 1; (0, 2] */
    /* Deterministic sampling: the draw of output position i of completion
     * j depends only on (seq_seed, j, i). Without it the seed is derived
     * from the engine seed and the request's submit order. */
    int has_seq_seed;
    uint64_t seq_seed;
    const char *const *stop;    /* [n_stop] stop strings (matched on the text) */
    size_t n_stop;
    const int32_t *stop_token_ids; /* [n_stop_token_ids] */
    size_t n_stop_token_ids;
    int include_stop_str_in_output; /* default 0 */
    int ignore_eos;             /* default 0 */
    int64_t max_tokens;         /* default 16; >= 1 (0 allowed with prompt_logprobs) */
    int64_t min_tokens;         /* default 0: EOS / stop ids masked before this many */
    int32_t logprobs;           /* default -1: none; k >= 0: sampled token + top k (k <= 20) */
    int32_t prompt_logprobs;    /* default -1: none; k >= 0: each prompt token + top k */
    const int32_t *logit_bias_ids;   /* [n_logit_bias] added to the logits */
    const float *logit_bias_values;  /* [n_logit_bias], each in [-100, 100] */
    size_t n_logit_bias;
    int skip_special_tokens;    /* default 1: special tokens left out of the text */
    /* Structured output: at most one of these (else DI_ERR_INVALID_ARG). */
    const char *json_schema;    /* JSON Schema text */
    const char *regex;
    const char *ebnf;           /* GBNF, start symbol root */
    const char *const *choice;  /* [n_choice] strings */
    size_t n_choice;
    int json_object;            /* 1: any JSON object */
    int disable_any_whitespace;        /* compact JSON */
    int disable_additional_properties; /* objects closed unless the schema says */
    /* Thinking (requests whose prompt ends by opening a think block): at most
     * this many tokens of reasoning, then `</think>` is forced; -1 = no cap.
     * A constraint applies to the answer after `</think>`. */
    int64_t thinking_token_budget;
} di_sampling_params;

DI_API void di_sampling_params_default(di_sampling_params *p);

/* Submitting. Every submit validates the request completely (prompt not
 * empty, ids in the vocabulary, prompt shorter than max_model_len, sampling
 * values in range, at most one constraint and a constraint that compiles)
 * and fails with DI_ERR_INVALID_ARG (or the compile error) and a message
 * naming the field, or returns a request id (> 0, never reused). */
DI_API di_status di_engine_submit_tokens(di_engine *e, const int32_t *ids, size_t n_ids,
                                         const di_sampling_params *params, uint64_t *id);
/* Text is encoded with special-token spellings recognised (like a HF
 * tokenizer's encode of a template-rendered prompt); no BOS is added. */
DI_API di_status di_engine_submit_text(di_engine *e, const char *text, size_t len,
                                       const di_sampling_params *params, uint64_t *id);
/* A chat: a JSON array of OpenAI messages or a Chat Completions body
 * (messages, tools, response_format, thinking, reasoning_effort, and, when
 * params is NULL, its sampling fields: temperature, top_p, max_tokens,
 * seed, stop, n, logprobs/top_logprobs; response_format json_schema /
 * json_object becomes the constraint). chat_opts may be NULL. Outputs of a
 * chat are parsed into reasoning_content / content / tool_calls. */
DI_API di_status di_engine_submit_chat(di_engine *e, const char *json, size_t len,
                                       const di_chat_options *chat_opts,
                                       const di_sampling_params *params, uint64_t *id);
/* Ends a request now (finish reason abort). Unknown id: DI_ERR_NOT_FOUND. */
DI_API di_status di_engine_abort(di_engine *e, uint64_t id);

/* Progress of a run. */
typedef struct di_engine_progress {
    uint64_t requests_done, requests_total;
    uint64_t prompt_tokens, output_tokens; /* processed / generated so far */
    double elapsed_s;
    double prompt_tps, output_tps;         /* tokens per second so far */
} di_engine_progress;

/* Called after each step; a nonzero return stops di_engine_run early (the
 * requests stay and a later run continues them). */
typedef int (*di_engine_progress_fn)(void *user, const di_engine_progress *p);

/* One scheduler step: a batch of decode tokens and prefill chunks. *n_active
 * (may be NULL) receives the number of unfinished requests after it. A
 * failure here is an engine failure (the backend); a request's own problem
 * ends that request with DI_FINISH_ERROR and the step succeeds. */
DI_API di_status di_engine_step(di_engine *e, size_t *n_active);
/* Steps until every submitted request has finished. progress may be NULL. */
DI_API di_status di_engine_run(di_engine *e, di_engine_progress_fn progress, void *user);

typedef enum di_finish_reason {
    DI_FINISH_NONE = 0,       /* still running */
    DI_FINISH_STOP = 1,       /* EOS, a stop string or a stop token id */
    DI_FINISH_LENGTH = 2,     /* max_tokens or max_model_len reached */
    DI_FINISH_CONSTRAINT = 3, /* the constraint allowed no token (dead end) */
    DI_FINISH_ERROR = 4,      /* see error */
    DI_FINISH_ABORT = 5       /* di_engine_abort */
} di_finish_reason;

DI_API const char *di_finish_reason_name(di_finish_reason r); /* "stop", "length", ... */

/* Ids of requests finished since the last call (each reported once):
 * up to cap ids into ids, their number into *n. */
DI_API di_status di_engine_poll_finished(di_engine *e, uint64_t *ids, size_t cap, size_t *n);

/* One completion of a request. Pointers stay valid until the request is
 * released or the engine closed. */
typedef struct di_completion {
    int32_t index;                /* 0..n-1 */
    const int32_t *token_ids;     /* [n_tokens] generated ids (stop string text trimmed
                                     from `text`, ids kept) */
    size_t n_tokens;
    const char *text;             /* detokenized output, NUL-terminated */
    size_t text_len;
    di_finish_reason finish_reason;
    const char *stop_str;         /* the matched stop string, else NULL */
    int32_t stop_token;           /* the stop token id (EOS included), else -1 */
    const char *error;            /* DI_FINISH_ERROR: the message, else NULL */
    double cumulative_logprob;    /* sum of the sampled tokens' logprobs */
    /* logprobs >= 0: per position, the sampled token's logprob and the top k */
    const float *logprobs;        /* [n_tokens] or NULL */
    int32_t n_top;                /* k */
    const int32_t *top_ids;       /* [n_tokens, n_top] by decreasing logprob */
    const float *top_logprobs;    /* [n_tokens, n_top] */
    /* Chat requests: the parsed assistant message (NULL otherwise). */
    const char *reasoning_content;
    const char *content;
    const char *tool_calls_json;  /* JSON array, or NULL when no calls */
    const char *message_json;     /* the whole message as JSON */
} di_completion;

/* A request as a whole. */
typedef struct di_request_output {
    uint64_t id;
    int finished;                 /* 1 when every completion has finished */
    const int32_t *prompt_ids;    /* [n_prompt] */
    size_t n_prompt;
    /* prompt_logprobs >= 0: logprob of each prompt token given the ones
     * before it (entry 0 is NaN: nothing predicts it) and the top k. */
    const float *prompt_logprobs; /* [n_prompt] or NULL */
    int32_t n_prompt_top;
    const int32_t *prompt_top_ids;       /* [n_prompt, n_prompt_top] (row 0 all -1) */
    const float *prompt_top_logprobs;    /* [n_prompt, n_prompt_top] */
    size_t n_completions;
    const char *error;            /* a request-level error, else NULL */
} di_request_output;

DI_API di_status di_engine_get_output(const di_engine *e, uint64_t id, di_request_output *out);
DI_API di_status di_engine_get_completion(const di_engine *e, uint64_t id, size_t index,
                                          di_completion *out);
/* Forgets a finished request and frees its outputs. */
DI_API di_status di_engine_release(di_engine *e, uint64_t id);

/* Counters since open. */
typedef struct di_engine_stats {
    uint64_t steps;
    uint64_t prompt_tokens;        /* prefill tokens computed (recomputation included) */
    uint64_t output_tokens;        /* tokens sampled */
    uint64_t preemptions;          /* sequences evicted and requeued for memory */
    uint64_t memory_used, memory_peak, memory_limit; /* per-sequence state bytes */
    double forward_s;              /* time the backend spent in forward passes */
    double host_s;                 /* host work: scheduling, masks, sampling, text */
    double overlap_s;              /* host work done while a forward ran (async) */
    double wall_s;                 /* inside di_engine_step / run */
} di_engine_stats;

DI_API di_status di_engine_get_stats(const di_engine *e, di_engine_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* DEEPINFER_H */
