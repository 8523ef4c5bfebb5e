/* safetensors header parsing from memory buffers, the strict JSON/UTF-8
 * pre-checks and the name table. Expected values come from the format
 * definition (ecosystem.md §3.1) and from hand-built files, never from the
 * reader itself. */
#include <stdint.h>

#include "io/checkpoint_index.h"
#include "io/json_text.h"
#include "io/name_table.h"
#include "io/safetensors.h"
#include "test.h"

/* Builds "len8 | header | data" into buf; data bytes are 0x40 + i. */
static size_t build(unsigned char *buf, size_t cap, const char *header, uint64_t len_field,
                    size_t data_len) {
    size_t hn = strlen(header);
    uint64_t len = len_field ? len_field : hn;
    if (8 + hn + data_len > cap) return 0;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(len >> (8 * i));
    memcpy(buf + 8, header, hn);
    for (size_t i = 0; i < data_len; i++) buf[8 + hn + i] = (unsigned char)(0x40 + i);
    return 8 + hn + data_len;
}

static di_status parse(const char *header, uint64_t len_field, size_t data_len, di_safetensors *st,
                       di_err *err) {
    static unsigned char buf[4096];
    size_t n = build(buf, sizeof buf, header, len_field, data_len);
    return di_safetensors_parse(buf, n, "mem.safetensors", st, err);
}

static void test_valid_file(void) {
    const char *h =
        "  {\"__metadata__\":{\"format\":\"pt\",\"note\":\"\\u00e9\"},"
        "\"w.scale\":{\"dtype\":\"F8_E8M0\",\"shape\":[2,1],\"data_offsets\":[16,18]},"
        "\"w.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,8],\"data_offsets\":[0,16],\"extra\":1},"
        "\"s\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[18,22]},"
        "\"z\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[22,22]}}\n ";
    di_safetensors st;
    di_err err = {0};
    CHECKF(parse(h, 0, 22, &st, &err) == DI_OK, "%s", err.msg);
    CHECK_EQ_INT(st.n_entries, 4);
    CHECK_EQ_INT(st.n_meta, 2);
    CHECK(di_safetensors_meta(&st, "format") && !strcmp(di_safetensors_meta(&st, "format"), "pt"));
    CHECK(di_safetensors_meta(&st, "note") && !strcmp(di_safetensors_meta(&st, "note"), "\xc3\xa9"));
    CHECK(di_safetensors_meta(&st, "absent") == NULL);
    CHECK_EQ_INT(st.header_len, strlen(h));
    CHECK_EQ_INT(st.data_size, 22);
    /* entries come out in offset order */
    static const char *const order[] = {"w.weight", "w.scale", "s", "z"};
    static const int64_t begin[] = {0, 16, 18, 22};
    for (int i = 0; i < 4; i++) {
        CHECK(!strcmp(st.entries[i].name, order[i]));
        CHECK_EQ_INT(st.entries[i].begin, begin[i]);
    }
    di_tensor t;
    di_safetensors_tensor(&st, 1, &t);
    CHECK_EQ_INT(t.dtype, DI_DTYPE_F8_E8M0);
    CHECK_EQ_INT(t.ndim, 2);
    CHECK_EQ_INT(t.shape[0], 2);
    CHECK_EQ_INT(t.shape[1], 1);
    CHECK_EQ_INT(t.nbytes, 2);
    CHECK_EQ_INT(((const unsigned char *)t.data)[0], 0x40 + 16);
    di_safetensors_tensor(&st, 2, &t);
    CHECK_EQ_INT(t.ndim, 0);
    CHECK_EQ_INT(t.nbytes, 4);
    CHECK_EQ_INT(((const unsigned char *)t.data)[3], 0x40 + 21);
    di_safetensors_tensor(&st, 3, &t);
    CHECK_EQ_INT(t.nbytes, 0);
    CHECK_EQ_INT(t.shape[1], 0);
    di_safetensors_close(&st);
    CHECK(st.entries == NULL && st.n_entries == 0);

    /* an empty header object with no data is a valid (empty) file */
    CHECK_EQ_INT(parse("{}", 0, 0, &st, &err), DI_OK);
    CHECK_EQ_INT(st.n_entries, 0);
    di_safetensors_close(&st);
}

static void test_every_dtype(void) {
    static const struct { const char *name; int size; } dt[] = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"U16", 2}, {"I16", 2},     {"F16", 2},
        {"BF16", 2}, {"U32", 4}, {"I32", 4}, {"F32", 4}, {"U64", 8},     {"I64", 8},
        {"F64", 8},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
    };
    for (size_t i = 0; i < sizeof dt / sizeof *dt; i++) {
        char h[256];
        snprintf(h, sizeof h, "{\"t\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[0,%d]}}",
                 dt[i].name, 3 * dt[i].size);
        di_safetensors st;
        di_err err = {0};
        CHECKF(parse(h, 0, (size_t)(3 * dt[i].size), &st, &err) == DI_OK, "%s: %s", dt[i].name,
               err.msg);
        if (st.n_entries == 1) CHECK(!strcmp(di_dtype_name(st.entries[0].dtype), dt[i].name));
        di_safetensors_close(&st);
        /* one byte short is a size mismatch for every dtype */
        snprintf(h, sizeof h, "{\"t\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[0,%d]}}",
                 dt[i].name, 3 * dt[i].size - 1);
        CHECK_EQ_INT(parse(h, 0, (size_t)(3 * dt[i].size - 1), &st, &err), DI_ERR_FORMAT);
        CHECK_STR_CONTAINS(err.msg, "size mismatch");
    }
}

static void expect_err(const char *header, uint64_t len_field, size_t data_len, const char *expect) {
    di_safetensors st;
    di_err err = {0};
    di_status s = parse(header, len_field, data_len, &st, &err);
    CHECKF(s != DI_OK, "accepted, expected \"%s\"", expect);
    CHECK_STR_CONTAINS(err.msg, expect);
    CHECK_STR_CONTAINS(err.msg, "mem.safetensors: ");
    if (s == DI_OK) di_safetensors_close(&st);
}

static void test_header_limits(void) {
    /* the limit is checked before the file size: 10^8 runs past the end of
     * this small buffer, 10^8 + 1 is over the limit */
    expect_err("{}", 100000000ull, 0, "runs past the end");
    expect_err("{}", 100000001ull, 0, "exceeds the limit of 100000000 bytes");
    expect_err("{}", 3, 0, "runs past the end of the file (10 bytes)");
    expect_err("", 0, 0, "header is not valid JSON");
    expect_err("{} x", 0, 0, "trailing characters after the JSON value (byte 3)");
    expect_err("{}\x01", 0, 0, "control character 0x01");
    expect_err("{\"a\t\":{}}", 0, 0, "raw control character 0x09 inside a string");
    expect_err("{\"__metadata__\":{},\"__metadata__\":{}}", 0, 0, "two __metadata__");
    expect_err("{\"__metadata__\":[]}", 0, 0, "__metadata__ is not a JSON object");
    expect_err("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0, 0, "duplicate key 'a'");
    expect_err("{\"t\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
               0, 1, "duplicate field \"dtype\"");
    expect_err("{\"t\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1,
               "dtype is not a string");
    expect_err("{\"t\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 0, 1,
               "shape is not an array");
    expect_err("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 0, 1,
               "data_offsets is not a pair");
    expect_err("{\"t\":{\"dtype\":\"U8\",\"shape\":[01],\"data_offsets\":[0,1]}}", 0, 1,
               "leading zero");
    expect_err("{\"t\":{\"dtype\":\"U8\",\"shape\":[1e0],\"data_offsets\":[0,1]}}", 0, 1,
               "non-integer number");
    /* 2^53 cannot be told apart from 2^53 + 1 in a double: refused */
    expect_err("{\"t\":{\"dtype\":\"U8\",\"shape\":[9007199254740993],\"data_offsets\":[0,1]}}", 0,
               1, "shape[0] is not a non-negative integer");
    expect_err("{\"t\":{\"dtype\":\"u8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1,
               "unknown dtype \"u8\"");
}

/* Every truncation of a valid file fails cleanly, and every one-byte change
 * of its header parses or fails without touching memory outside the buffer
 * (the ASan build checks the latter). */
static void test_truncations_and_flips(void) {
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}";
    unsigned char full[512];
    size_t n = build(full, sizeof full, h, 0, 12);
    di_safetensors st;
    di_err err = {0};
    int failed = 0;
    for (size_t len = 0; len < n; len++) {
        unsigned char *copy = malloc(len ? len : 1); /* exact size: ASan sees overreads */
        memcpy(copy, full, len);
        if (di_safetensors_parse(copy, len, "cut", &st, &err) != DI_OK) failed++;
        else di_safetensors_close(&st);
        free(copy);
    }
    CHECK_EQ_INT(failed, n);
    static const unsigned char subst[] = {0x00, '"', '{', '}', '[', ']', ',', '9', '-', 0xff, '\\'};
    for (size_t pos = 0; pos < n; pos++)
        for (size_t k = 0; k < sizeof subst; k++) {
            unsigned char *copy = malloc(n);
            memcpy(copy, full, n);
            copy[pos] = subst[k];
            if (di_safetensors_parse(copy, n, "flip", &st, &err) == DI_OK) {
                /* whatever was accepted is self-consistent */
                uint64_t end = 0;
                for (size_t i = 0; i < st.n_entries; i++)
                    if (st.entries[i].end > end) end = st.entries[i].end;
                CHECK_EQ_INT(end, st.data_size);
                di_safetensors_close(&st);
            }
            free(copy);
        }
}

static void test_utf8(void) {
    static const struct { const char *s; size_t valid; } v[] = {
        {"plain", 5},
        {"\xc2\x80", 2},            /* U+0080 */
        {"\xdf\xbf", 2},            /* U+07FF */
        {"\xe0\xa0\x80", 3},        /* U+0800 */
        {"\xed\x9f\xbf", 3},        /* U+D7FF */
        {"\xee\x80\x80", 3},        /* U+E000 */
        {"\xf0\x90\x80\x80", 4},    /* U+10000 */
        {"\xf4\x8f\xbf\xbf", 4},    /* U+10FFFF */
        {"a\xc0\x80", 1},           /* overlong NUL */
        {"ab\xc1\xbf", 2},          /* overlong */
        {"\xe0\x9f\xbf", 0},        /* overlong 3-byte */
        {"x\xed\xa0\x80", 1},       /* surrogate U+D800 */
        {"\xf0\x8f\xbf\xbf", 0},    /* overlong 4-byte */
        {"\xf4\x90\x80\x80", 0},    /* above U+10FFFF */
        {"\xf5\x80\x80\x80", 0},
        {"\x80", 0},                /* lone continuation */
        {"ok\xe2\x82", 2},          /* truncated */
        {"\xe2\x28\xa1", 0},        /* bad continuation */
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        CHECKF(di_utf8_valid_prefix((const unsigned char *)v[i].s, strlen(v[i].s)) == v[i].valid,
               "case %zu", i);
}

static void test_name_table(void) {
    di_name_table t;
    di_err err = {0};
    CHECK_EQ_INT(di_name_table_init(&t, 1000, &err), DI_OK);
    static char names[1000][32];
    for (int i = 0; i < 1000; i++) {
        snprintf(names[i], sizeof names[i], "layers.%d.ffn.experts.%d.w1", i / 7, i % 7);
        CHECK_EQ_INT(di_name_table_insert(&t, names[i], (uint32_t)i, NULL), 1);
    }
    int wrong = 0;
    for (int i = 0; i < 1000; i++) {
        uint32_t v = 0;
        char probe[32];
        memcpy(probe, names[i], sizeof probe); /* a different pointer, same text */
        if (!di_name_table_find(&t, probe, &v) || v != (uint32_t)i) wrong++;
    }
    CHECK_EQ_INT(wrong, 0);
    uint32_t prev = 0;
    CHECK_EQ_INT(di_name_table_insert(&t, "layers.3.ffn.experts.2.w1", 99, &prev), 0);
    CHECK_EQ_INT(prev, 3 * 7 + 2);
    CHECK_EQ_INT(di_name_table_find(&t, "layers.3.ffn.experts.2.w2", NULL), 0);
    CHECK_EQ_INT(t.count, 1000);
    /* more names than sized for: refused, never an endless probe */
    int refused = 0;
    static char extra[2000][16];
    for (int i = 0; i < 2000; i++) {
        snprintf(extra[i], sizeof extra[i], "x%d", i);
        if (di_name_table_insert(&t, extra[i], 0, NULL) < 0) refused++;
    }
    CHECK(refused > 0);
    CHECK(t.count <= t.cap / 2);
    di_name_table_free(&t);
}

static void test_index_parse(void) {
    const char *good = "{\"metadata\":{\"total_size\":10,\"other\":\"x\"},\"weight_map\":"
                       "{\"b\":\"s2\",\"a\":\"s1\",\"c\":\"s2\"}}";
    di_ckpt_index ix;
    di_err err = {0};
    CHECKF(di_ckpt_index_parse(good, strlen(good), &ix, &err) == DI_OK, "%s", err.msg);
    CHECK_EQ_INT(ix.n_names, 3);
    CHECK_EQ_INT(ix.n_files, 2);
    CHECK(!strcmp(ix.files[0], "s2") && !strcmp(ix.files[1], "s1"));
    CHECK(ix.has_total_size && ix.total_size == 10);
    uint32_t k = 9;
    CHECK(di_name_table_find(&ix.lookup, "a", &k) && k == 1 && ix.file_of[k] == 1);
    di_ckpt_index_free(&ix);
    static const struct { const char *text, *expect; } bad[] = {
        {"{\"weight_map\":{\"a\":\"\"}}", "not a file name"},
        {"{\"weight_map\":{\"a\":\"..\"}}", "not a file name"},
        {"{\"weight_map\":{\"a\":\"d\\\\x\"}}", "not a file name"},
        {"{\"weight_map\":{\"a\":1}}", "weight_map value of 'a' is not a string"},
        {"{\"weight_map\":[]}", "\"weight_map\" is not an object"},
        {"{\"weight_map\":{},\"weight_map\":{}}", "duplicate \"weight_map\""},
        {"{\"metadata\":{\"total_size\":-1},\"weight_map\":{}}", "total_size is not"},
        {"{\"metadata\":{\"total_size\":1.5},\"weight_map\":{}}", "non-integer"},
        {"{\"metadata\":7,\"weight_map\":{}}", "\"metadata\" is not an object"},
        {"[]", "not a JSON object"},
        {"{\"weight_map\":{\"\xff\":\"s\"}}", "not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        di_status s = di_ckpt_index_parse(bad[i].text, strlen(bad[i].text), &ix, &err);
        CHECKF(s != DI_OK, "case %zu accepted", i);
        CHECK_STR_CONTAINS(err.msg, bad[i].expect);
        if (s == DI_OK) di_ckpt_index_free(&ix);
    }
    /* metadata: null and no total_size are fine */
    const char *nul = "{\"metadata\":null,\"weight_map\":{}}";
    CHECK_EQ_INT(di_ckpt_index_parse(nul, strlen(nul), &ix, &err), DI_OK);
    CHECK_EQ_INT(ix.has_total_size, 0);
    di_ckpt_index_free(&ix);
}

int main(void) {
    RUN(test_valid_file);
    RUN(test_every_dtype);
    RUN(test_header_limits);
    RUN(test_truncations_and_flips);
    RUN(test_utf8);
    RUN(test_name_table);
    RUN(test_index_parse);
    return test_summary();
}
