/* libFuzzer target: the V4.1 chat layer (architecture.md §9.2) on arbitrary
 * bytes. The first byte picks options; the rest is read three ways:
 * - as a chat (messages array or request object): a rejection must carry a
 *   message; a rendered prompt must be covered exactly by its segments, each
 *   special one a single known spelling;
 * - as a Chat Completions body: the same rule for rejections;
 * - as model output: parsing it whole and in pieces must agree. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/chat.h"
#include "recipe/openai.h"
#include "recipe/parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_prompt(const di_chat_prompt *p) {
    size_t at = 0;
    for (size_t i = 0; i < p->n_segs; i++) {
        const di_chat_segment *s = &p->segs[i];
        if (s->offset != at || s->len == 0) abort();
        at += s->len;
        if (!s->special) {
            if (i && !p->segs[i - 1].special) abort();
            continue;
        }
        static const char *const known[] = {DI_CHAT_BOS, DI_CHAT_EOS, DI_CHAT_SYSTEM_TOK,
                                            DI_CHAT_USER_TOK, DI_CHAT_ASSISTANT_TOK,
                                            DI_CHAT_REMINDER_TOK, DI_CHAT_THINK_START,
                                            DI_CHAT_THINK_END, DI_CHAT_DSML};
        int ok = 0;
        for (size_t k = 0; k < sizeof known / sizeof *known; k++)
            ok |= strlen(known[k]) == s->len && !memcmp(p->text + s->offset, known[k], s->len);
        if (!ok) abort();
    }
    if (at != p->len || strlen(p->text) > p->len) abort();
}

static void render(const char *text, size_t n, uint8_t opt) {
    di_jv *root = NULL;
    di_err err = {0};
    if (di_jv_parse(text, n, "chat", &root, &err) != DI_OK) {
        if (!err.msg[0]) abort();
        return;
    }
    di_chat c;
    di_sampling s;
    di_status st;
    if (root->type == DI_JV_ARRAY) {
        di_chat_init(&c);
        st = di_openai_messages(root, "messages", &c, &err);
    } else {
        st = di_openai_convert_value(root, NULL, &c, &s, &err);
        if (st == DI_OK) di_sampling_free(&s);
    }
    di_jv_free(root);
    if (st != DI_OK) {
        if (!err.msg[0]) abort();
        di_chat_free(&c);
        return;
    }
    c.thinking = opt & 1;
    c.effort = (di_chat_effort)((opt >> 1) % 5);
    c.add_generation_prompt = (opt >> 4) & 1;
    if (opt & 0x20) c.tool_choice = DI_CHAT_TOOL_REQUIRED;
    di_chat_prompt p;
    st = di_chat_prompt_render(&c, &p, &err);
    if (st == DI_OK) check_prompt(&p);
    else if (!err.msg[0]) abort();
    di_chat_prompt_free(&p);
    di_chat_free(&c);
}

static int same_buf(const di_buf *a, const di_buf *b) {
    return a->len == b->len && (!a->len || !memcmp(a->p, b->p, a->len));
}

static void parse(const char *text, size_t n, uint8_t opt) {
    di_parse_start start = (di_parse_start)(opt % 5);
    const char *stop[] = {"\n\nUser:", "##"};
    size_t n_stop = (opt >> 3) & 1 ? 2 : 0;
    di_parser whole, pieces;
    di_err err;
    if (di_parser_init(&whole, start, (opt >> 4) & 1, stop, n_stop, &err) ||
        di_parser_init(&pieces, start, (opt >> 4) & 1, stop, n_stop, &err))
        abort();
    di_parser_push(&whole, text, n, &err);
    di_parser_finish(&whole, &err);
    size_t step = 1 + (opt >> 5);
    for (size_t off = 0; off < n; off += step)
        di_parser_push(&pieces, text + off, off + step > n ? n - off : step, &err);
    di_parser_finish(&pieces, &err);
    if (!same_buf(&whole.reasoning, &pieces.reasoning) || !same_buf(&whole.content, &pieces.content) ||
        whole.n_calls != pieces.n_calls)
        abort();
    for (size_t i = 0; i < whole.n_calls; i++)
        if (!same_buf(&whole.calls[i].name, &pieces.calls[i].name) ||
            !same_buf(&whole.calls[i].arguments, &pieces.calls[i].arguments))
            abort();
    char *msg = di_parser_message_json(&whole);
    if (!msg) abort();
    free(msg);
    di_parser_free(&whole);
    di_parser_free(&pieces);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    render(text, n, data[0]);
    parse(text, n, data[0]);
    return 0;
}
