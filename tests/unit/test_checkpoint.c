/* Checkpoint directories: a corpus of malformed files and indexes, each
 * rejected with a message naming the problem (through the library and
 * through `deepinfer check`), and the golden tiny model read back exactly. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "test.h"

static char tmp_root[256];
static char cli_path[4096];

/* ---- corpus writers ---- */

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

/* A safetensors file: the 8-byte length (len_field, or the header's real
 * length when 0), the header text, then data_len bytes 0, 1, 2, ... */
static void write_st(const char *path, const char *header, uint64_t len_field, size_t data_len) {
    size_t hn = strlen(header);
    uint64_t len = len_field ? len_field : hn;
    size_t total = 8 + hn + data_len;
    unsigned char *buf = malloc(total);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(len >> (8 * i));
    memcpy(buf + 8, header, hn);
    for (size_t i = 0; i < data_len; i++) buf[8 + hn + i] = (unsigned char)i;
    write_bytes(path, buf, total);
    free(buf);
}

static const char *case_dir(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", tmp_root, name);
    mkdir(buf, 0755);
    return buf;
}

static const char *file_in(const char *dir, const char *name) {
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        for (struct dirent *e; (e = readdir(d));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            remove_tree(sub);
        }
        closedir(d);
        rmdir(path);
    } else unlink(path);
}

/* Opens dir, expecting failure whose message contains `expect`. */
static void expect_open_error(const char *dir, const char *expect) {
    di_checkpoint *ck = NULL;
    di_err err = {0};
    di_status s = di_checkpoint_open(dir, &ck, &err);
    CHECKF(s != DI_OK, "%s: opened, expected \"%s\"", dir, expect);
    CHECK(ck == NULL);
    CHECK_STR_CONTAINS(err.msg, expect);
    if (ck) di_checkpoint_close(ck);
}

/* Runs `deepinfer check --model dir`: returns the exit code, output in out. */
static int run_cli(const char *dir, char *out, size_t n) {
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "'%s' check --model '%s' 2>&1", cli_path, dir);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t got = fread(out, 1, n - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* ---- single-file corpus ---- */

typedef struct st_case {
    const char *dir;
    const char *header;  /* NULL: raw bytes below */
    uint64_t len_field;  /* 0: the header's real length */
    size_t data_len;
    const char *raw;
    size_t raw_len;
    const char *expect;  /* substring of the error */
} st_case;

#define T2(a, b)                                                                             \
    "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[" a "]},"                     \
    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[" b "]}}"

static const st_case st_cases[] = {
    {"empty", NULL, 0, 0, "", 0, "empty file (0 bytes)"},
    {"truncated_header", NULL, 0, 0, "\x10\x00\x00", 3, "file too short (3 bytes)"},
    {"len_past_eof", "{}", 1000, 4, NULL, 0, "header length 1000 runs past the end of the file"},
    {"len_huge", "{}", 1ull << 40, 0, NULL, 0, "exceeds the limit of 100000000 bytes"},
    {"len_u64_max", "{}", UINT64_MAX, 0, NULL, 0, "exceeds the limit"},
    {"bad_utf8", "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 0, 4, NULL,
     0, "header is not valid UTF-8 (byte 3"},
    {"overlong_utf8", "{\"\xc0\xaf\":{}}", 0, 0, NULL, 0, "not valid UTF-8"},
    {"not_object", "[1, 2]", 0, 0, NULL, 0, "header is not a JSON object"},
    {"not_json", "{\"a\": ", 0, 0, NULL, 0, "header is not valid JSON"},
    {"nul_padding", NULL, 0, 0, "\x08\0\0\0\0\0\0\0{}\0\0\0\0\0\0", 16, "control character 0x00"},
    {"overlap", T2("0,8", "4,12"), 0, 12, NULL, 0, "'b': data_offsets [4, 12] overlap tensor 'a'"},
    {"aliased", T2("0,8", "0,8"), 0, 8, NULL, 0, "overlap tensor"},
    {"gap", T2("0,8", "12,20"), 0, 20, NULL, 0, "'b': gap of 4 bytes before data_offsets [12, 20]"},
    {"gap_at_start", T2("4,12", "12,20"), 0, 20, NULL, 0, "gap of 4 bytes at the start"},
    {"reversed_offsets",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 0, 8, NULL, 0,
     "data_offsets [8, 0] has begin > end"},
    {"unknown_dtype", "{\"w\":{\"dtype\":\"F7\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8, NULL,
     0, "tensor 'w': unknown dtype \"F7\""},
    {"unsupported_dtype", "{\"w\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 0, 1,
     NULL, 0, "dtype \"F4\" is not supported"},
    {"size_mismatch", "{\"w\":{\"dtype\":\"BF16\",\"shape\":[3,2],\"data_offsets\":[0,8]}}", 0, 8,
     NULL, 0, "tensor 'w': size mismatch: data_offsets [0, 8] span 8 bytes but shape x BF16 is 12"},
    {"shape_overflow",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
     "\"data_offsets\":[0,0]}}",
     0, 0, NULL, 0, "tensor 'w': shape overflows"},
    {"bytes_overflow",
     "{\"w\":{\"dtype\":\"I64\",\"shape\":[2147483648,4294967296],\"data_offsets\":[0,0]}}", 0, 0,
     NULL, 0, "overflows 64-bit byte count"},
    {"negative_dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, 0,
     NULL, 0, "tensor 'w': shape[0] is not a non-negative integer"},
    {"fraction_dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 0, 8,
     NULL, 0, "non-integer number"},
    {"rank_9", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 0,
     1, NULL, 0, "rank 9 exceeds"},
    {"missing_offsets", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 0, 1, NULL, 0,
     "missing field \"data_offsets\""},
    {"trailing_bytes", "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 0, 9,
     NULL, 0, "5 trailing bytes after the last tensor"},
    {"truncated_data", "{\"w\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]}}", 0, 10,
     NULL, 0, "truncated data"},
    {"duplicate_name",
     "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
     "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
     0, 2, NULL, 0, "duplicate tensor name 'w'"},
    {"nul_in_name",
     "{\"w\\u0000x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1, NULL, 0,
     "escaped NUL"},
    {"metadata_not_string", "{\"__metadata__\":{\"format\":1}}", 0, 0, NULL, 0,
     "__metadata__ value of 'format' is not a string"},
    {"entry_not_object", "{\"w\":[1]}", 0, 0, NULL, 0, "tensor 'w': entry is not a JSON object"},
};

static void test_malformed_files(void) {
    for (size_t i = 0; i < sizeof st_cases / sizeof *st_cases; i++) {
        const st_case *c = &st_cases[i];
        const char *dir = case_dir(c->dir);
        char path[1024];
        snprintf(path, sizeof path, "%s", file_in(dir, "model.safetensors"));
        if (c->header) write_st(path, c->header, c->len_field, c->data_len);
        else write_bytes(path, c->raw, c->raw_len);
        t_current = c->dir;
        expect_open_error(dir, c->expect);
        expect_open_error(dir, path); /* the message names the file */
    }
    t_current = "test_malformed_files";
}

/* The reference sorts entries by offset: header order does not matter. */
static void test_header_order_free(void) {
    const char *dir = case_dir("unsorted_header");
    write_st(file_in(dir, "model.safetensors"), T2("8,16", "0,8"), 0, 16);
    di_checkpoint *ck = NULL;
    di_err err = {0};
    CHECK_EQ_INT(di_checkpoint_open(dir, &ck, &err), DI_OK);
    if (!ck) return;
    const di_ckpt_tensor *a = di_checkpoint_find(ck, "a"), *b = di_checkpoint_find(ck, "b");
    CHECK(a && b);
    if (a && b) {
        /* data bytes are 0, 1, 2, ...: a holds 8..15 and b 0..7 */
        CHECK_EQ_INT(((const unsigned char *)a->t.data)[0], 8);
        CHECK_EQ_INT(((const unsigned char *)b->t.data)[7], 7);
        CHECK_EQ_INT(a->t.nbytes, 8);
    }
    CHECK(di_checkpoint_find(ck, "c") == NULL);
    CHECK_EQ_INT(di_checkpoint_dtype_bytes(ck, DI_DTYPE_F32), 16);
    di_ckpt_read_stats rs;
    CHECK_EQ_INT(di_checkpoint_read_all(ck, &rs, &err), DI_OK);
    CHECK_EQ_INT(rs.bytes, 16);
    /* words 0x0706050403020100 + 0x0f0e0d0c0b0a0908 */
    CHECK(rs.checksum == 0x0706050403020100ull + 0x0f0e0d0c0b0a0908ull);
    di_checkpoint_close(ck);
}

/* A file of several read chunks: every thread count gives the checksum of
 * the format's definition (wrapping sum of little-endian words, tail padded
 * with zeros), computed here from the bytes as written. */
static void test_read_all_split(void) {
    const size_t n = (64u << 20) + 3; /* two full read chunks and an odd 3-byte third */
    char header[128];
    snprintf(header, sizeof header, "{\"t\":{\"dtype\":\"U8\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}}",
             n, n);
    const char *dir = case_dir("read_split");
    write_st(file_in(dir, "model.safetensors"), header, 0, n);
    uint64_t want = 0;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = 0;
        for (size_t k = 0; k < 8 && i + k < n; k++) w |= (uint64_t)(unsigned char)(i + k) << (8 * k);
        want += w;
    }
    di_checkpoint *ck = NULL;
    di_err err = {0};
    CHECKF(di_checkpoint_open(dir, &ck, &err) == DI_OK, "%s", err.msg);
    if (!ck) return;
    static const int threads[] = {1, 2, 3, 0};
    for (int i = 0; i < 4; i++) {
        di_ckpt_read_stats rs;
        CHECK_EQ_INT(di_checkpoint_read_all_threads(ck, threads[i], &rs, &err), DI_OK);
        CHECK_EQ_INT(rs.bytes, n);
        CHECKF(rs.checksum == want, "threads %d: %016llx != %016llx", threads[i],
               (unsigned long long)rs.checksum, (unsigned long long)want);
    }
    CHECK_EQ_INT(di_checkpoint_read_all_threads(ck, -1, &(di_ckpt_read_stats){0}, &err),
                 DI_ERR_INVALID_ARG);
    di_checkpoint_close(ck);
}

/* ---- sharded corpus ---- */

#define SHARD1 "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}"
#define SHARD2                                                                                \
    "{\"__metadata__\":{\"format\":\"pt\"},"                                                 \
    "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}"

static const char *sharded(const char *name, const char *index) {
    const char *dir = case_dir(name);
    char p[1024];
    snprintf(p, sizeof p, "%s", file_in(dir, "s1.safetensors"));
    write_st(p, SHARD1, 0, 4);
    snprintf(p, sizeof p, "%s", file_in(dir, "s2.safetensors"));
    write_st(p, SHARD2, 0, 8);
    snprintf(p, sizeof p, "%s", file_in(dir, "model.safetensors.index.json"));
    write_bytes(p, index, strlen(index));
    return dir;
}

static void test_index(void) {
    const char *dir = sharded("index_good",
                              "{\"metadata\":{\"total_size\":12},\"weight_map\":"
                              "{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}");
    di_checkpoint *ck = NULL;
    di_err err = {0};
    CHECK_EQ_INT(di_checkpoint_open(dir, &ck, &err), DI_OK);
    if (ck) {
        CHECK_EQ_INT(di_checkpoint_count(ck), 2);
        CHECK_EQ_INT(di_checkpoint_file_count(ck), 2);
        const di_ckpt_tensor *b = di_checkpoint_find(ck, "b");
        CHECK(b && !strcmp(b->file, "s2.safetensors") && b->t.dtype == DI_DTYPE_I32);
        CHECK_EQ_INT(di_checkpoint_total_bytes(ck), 12);
        di_checkpoint_close(ck);
    }

    expect_open_error(sharded("index_missing_shard",
                              "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\","
                              "\"c\":\"s3.safetensors\"}}"),
                      "names shard s3.safetensors, which does not exist");
    expect_open_error(sharded("index_extra_tensor",
                              "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\","
                              "\"z\":\"s2.safetensors\"}}"),
                      "lists tensor 'z' in s2.safetensors, which does not contain it");
    expect_open_error(sharded("index_unlisted", "{\"weight_map\":{\"a\":\"s1.safetensors\","
                                                "\"x\":\"s2.safetensors\"}}"),
                      "tensor 'b' in s2.safetensors is not listed in model.safetensors.index.json");
    expect_open_error(sharded("index_wrong_shard", "{\"weight_map\":{\"a\":\"s2.safetensors\","
                                                   "\"b\":\"s1.safetensors\"}}"),
                      "tensor 'b' is in s2.safetensors but model.safetensors.index.json maps it "
                      "to s1.safetensors");
    expect_open_error(sharded("index_total_size",
                              "{\"metadata\":{\"total_size\":13},\"weight_map\":"
                              "{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}"),
                      "metadata.total_size is 13 but the shards hold 12 tensor bytes");
    expect_open_error(sharded("index_total_size_type",
                              "{\"metadata\":{\"total_size\":\"12\"},\"weight_map\":{}}"),
                      "metadata.total_size is not a non-negative integer");
    expect_open_error(sharded("index_no_map", "{\"metadata\":{}}"), "missing \"weight_map\"");
    expect_open_error(sharded("index_dup_metadata",
                              "{\"metadata\":{\"total_size\":13},\"metadata\":{},\"weight_map\":"
                              "{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}"),
                      "duplicate \"metadata\"");
    expect_open_error(sharded("index_traversal", "{\"weight_map\":{\"a\":\"../s1.safetensors\"}}"),
                      "not a file name inside the model directory");
    expect_open_error(sharded("index_dup", "{\"weight_map\":{\"a\":\"s1.safetensors\","
                                           "\"a\":\"s1.safetensors\"}}"),
                      "weight_map lists tensor 'a' twice");
    expect_open_error(sharded("index_not_json", "{\"weight_map\":"), "index is not valid JSON");
    expect_open_error(sharded("index_empty", ""), "model.safetensors.index.json: index is not valid");
    /* The shard's own errors still name the shard. */
    const char *bad = sharded("index_bad_shard", "{\"weight_map\":{\"a\":\"s1.safetensors\","
                                                 "\"b\":\"s2.safetensors\"}}");
    write_st(file_in(bad, "s2.safetensors"), SHARD2, 0, 9);
    expect_open_error(bad, "s2.safetensors: 1 trailing bytes");
}

static void test_no_index(void) {
    /* Without index or model.safetensors, every *.safetensors is a shard. */
    const char *dir = case_dir("glob_dup");
    write_st(file_in(dir, "x1.safetensors"), SHARD1, 0, 4);
    write_st(file_in(dir, "x2.safetensors"), SHARD1, 0, 4);
    expect_open_error(dir, "tensor 'a' is in both x1.safetensors and x2.safetensors");
    expect_open_error(case_dir("nothing"), "no model.safetensors.index.json, model.safetensors");
    /* a FIFO or a folder where a file should be: refused, without blocking */
    const char *fifo = case_dir("fifo_shard");
    CHECK(mkfifo(file_in(fifo, "model.safetensors"), 0644) == 0);
    expect_open_error(fifo, "model.safetensors: not a regular file");
    const char *fifo_ix = case_dir("fifo_index");
    CHECK(mkfifo(file_in(fifo_ix, "model.safetensors.index.json"), 0644) == 0);
    expect_open_error(fifo_ix, "model.safetensors.index.json: not a readable regular file");
    const char *sub = case_dir("dir_shard");
    mkdir(file_in(sub, "model.safetensors"), 0755);
    expect_open_error(sub, "not a regular file");
    char missing[600];
    snprintf(missing, sizeof missing, "%s/does_not_exist", tmp_root);
    expect_open_error(missing, "does_not_exist");
}

/* ---- the CLI on the corpus ---- */

static void test_cli(void) {
    if (access(cli_path, X_OK) != 0) SKIP("%s not built", cli_path);
    static const struct { const char *dir, *expect; } runs[] = {
        {"len_past_eof", "runs past the end of the file"},
        {"overlap", "overlap tensor 'a'"},
        {"unknown_dtype", "unknown dtype \"F7\""},
        {"index_missing_shard", "s3.safetensors, which does not exist"},
        {"index_unlisted", "is not listed in model.safetensors.index.json"},
    };
    char buf[8192];
    const char *out = buf;
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/%s", tmp_root, runs[i].dir);
        int rc = run_cli(dir, buf, sizeof buf);
        CHECKF(rc == 1, "%s: exit %d", runs[i].dir, rc);
        CHECK_STR_CONTAINS(out, runs[i].expect);
        CHECK_STR_CONTAINS(out, "deepinfer check: ");
    }
    char dir[600];
    snprintf(dir, sizeof dir, "%s/index_good", tmp_root);
    int rc = run_cli(dir, buf, sizeof buf);
    CHECKF(rc == 0, "index_good: exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "tensors  2 (12 bytes");
    CHECK_STR_CONTAINS(out, "ok: ");
}

/* Copies src to dst, replacing the first occurrence of `from` by `to` (same
 * length) when from is non-NULL. Returns 0 when from was not found. */
static int copy_patched(const char *src, const char *dst, const char *from, const char *to) {
    FILE *f = fopen(src, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    int ok = got == (size_t)n;
    if (ok && from) {
        size_t fl = strlen(from);
        char *hit = NULL;
        for (size_t i = 0; i + fl <= got && !hit; i++)
            if (!memcmp(buf + i, from, fl)) hit = buf + i;
        if (hit) memcpy(hit, to, fl);
        else ok = 0;
    }
    if (ok) write_bytes(dst, buf, got);
    free(buf);
    return ok;
}

/* With a config.json, check binds every tensor to the model it describes. */
static void test_cli_binding(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    if (access(cli_path, X_OK) != 0) SKIP("%s not built", cli_path);
    static const char *const files[] = {"config.json", "model.safetensors.index.json",
                                        "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors"};
    char src[4400], dst[1024], buf[8192];
    const char *out = buf;
    /* A shard whose attention sink is declared I32 instead of F32: a valid
     * file, but not the model's dtype. */
    const char *dir = case_dir("bind_mistyped");
    for (int i = 0; i < 4; i++) {
        snprintf(src, sizeof src, "%s/golden/v41-tiny/%s", shared, files[i]);
        snprintf(dst, sizeof dst, "%s", file_in(dir, files[i]));
        int ok = i == 2 ? copy_patched(src, dst, "\"layers.0.attn.attn_sink\":{\"dtype\":\"F32\"",
                                       "\"layers.0.attn.attn_sink\":{\"dtype\":\"I32\"")
                        : copy_patched(src, dst, NULL, NULL);
        CHECKF(ok, "copy %s", src);
    }
    int rc = run_cli(dir, buf, sizeof buf);
    CHECKF(rc == 1, "bind_mistyped: exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "layers.0.attn.attn_sink");
    CHECK_STR_CONTAINS(out, "I32");
    /* The right files with the wrong config: a synthetic shard + the tiny
     * config misses every model tensor. */
    dir = case_dir("bind_missing");
    snprintf(src, sizeof src, "%s/golden/v41-tiny/config.json", shared);
    CHECK(copy_patched(src, file_in(dir, "config.json"), NULL, NULL));
    write_st(file_in(dir, "model.safetensors"), SHARD1, 0, 4);
    rc = run_cli(dir, buf, sizeof buf);
    CHECKF(rc == 1, "bind_missing: exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "missing");
}

/* ---- the golden tiny model ---- */

static cJSON *load_json(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = '\0';
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    return j;
}

/* Reads a tensor's bytes with plain file I/O, independently of the mapping. */
static int pread_tensor(const char *dir, const di_ckpt_tensor *t, size_t off_in_data,
                        unsigned char *out, size_t n) {
    char path[8400];
    snprintf(path, sizeof path, "%s/%s", dir, t->file);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    unsigned char len8[8];
    uint64_t hl = 0;
    int ok = fread(len8, 1, 8, f) == 8;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | len8[i];
    ok = ok && fseek(f, (long)(8 + hl + off_in_data), SEEK_SET) == 0 && fread(out, 1, n, f) == n;
    fclose(f);
    return ok;
}

static void test_golden_tiny(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    char dir[4200], path[4400];
    snprintf(dir, sizeof dir, "%s/golden/v41-tiny", shared);
    di_checkpoint *ck = NULL;
    di_err err = {0};
    CHECKF(di_checkpoint_open(dir, &ck, &err) == DI_OK, "%s", err.msg);
    if (!ck) return;

    snprintf(path, sizeof path, "%s/golden.json", dir);
    cJSON *g = load_json(path);
    const cJSON *w = cJSON_GetObjectItem(g, "weights");
    CHECK(w != NULL);
    CHECK_EQ_INT(di_checkpoint_count(ck), cJSON_GetObjectItem(w, "n_tensors")->valuedouble);
    CHECK_EQ_INT(di_checkpoint_total_bytes(ck), cJSON_GetObjectItem(w, "weight_bytes")->valuedouble);
    cJSON_Delete(g);
    CHECK_EQ_INT(di_checkpoint_file_count(ck), 2);
    uint64_t sum = 0;
    for (int d = 0; d < DI_DTYPE_COUNT; d++) sum += di_checkpoint_dtype_bytes(ck, (di_dtype)d);
    CHECK_EQ_INT(sum, di_checkpoint_total_bytes(ck));

    /* Every tensor the index names is found, in the shard the index says. */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    cJSON *ix = load_json(path);
    const cJSON *map = cJSON_GetObjectItem(ix, "weight_map");
    int n_map = 0, found = 0;
    for (const cJSON *c = map ? map->child : NULL; c; c = c->next, n_map++) {
        const di_ckpt_tensor *t = di_checkpoint_find(ck, c->string);
        if (t && !strcmp(t->file, c->valuestring) && !strcmp(t->name, c->string)) found++;
    }
    CHECK_EQ_INT(n_map, 1005);
    CHECK_EQ_INT(found, n_map);
    cJSON_Delete(ix);

    const di_ckpt_tensor *wq = di_checkpoint_find(ck, "layers.0.attn.wq_a.weight");
    const di_ckpt_tensor *sc = di_checkpoint_find(ck, "layers.0.attn.wq_a.scale");
    CHECK(wq && sc);
    if (wq && sc) {
        CHECK_EQ_INT(wq->t.dtype, DI_DTYPE_F8_E4M3);
        CHECK_EQ_INT(sc->t.dtype, DI_DTYPE_F8_E8M0);
        CHECK_EQ_INT(wq->t.ndim, 2);
        CHECK_EQ_INT(sc->t.ndim, 2);
        CHECK_EQ_INT(sc->t.shape[0], (wq->t.shape[0] + 31) / 32);
        CHECK_EQ_INT(sc->t.shape[1], (wq->t.shape[1] + 31) / 32);
        CHECK_EQ_INT(wq->t.nbytes, wq->t.shape[0] * wq->t.shape[1]);
    }
    const di_ckpt_tensor *emb = di_checkpoint_find(ck, "embed.weight");
    CHECK(emb && emb->t.dtype == DI_DTYPE_BF16 && emb->t.ndim == 2 && emb->t.shape[0] == 1024 &&
          emb->t.shape[1] == 128);

    /* Each tensor's first and last bytes through the mapping equal the same
     * bytes read with stdio at the header's offset. Offsets come from the
     * tensor order: within a file, tensors are contiguous from 0. */
    const char *cur_file = "";
    size_t off = 0, mismatches = 0, checked = 0;
    for (size_t i = 0; i < di_checkpoint_count(ck); i++) {
        const di_ckpt_tensor *t = di_checkpoint_at(ck, i);
        if (strcmp(t->file, cur_file)) {
            cur_file = t->file;
            off = 0;
        }
        size_t n = t->t.nbytes < 16 ? t->t.nbytes : 16;
        unsigned char head[16];
        if (n && (i % 25 == 0 || i + 1 == di_checkpoint_count(ck))) {
            checked++;
            if (!pread_tensor(dir, t, off + t->t.nbytes - n, head, n) ||
                memcmp(head, (const unsigned char *)t->t.data + t->t.nbytes - n, n))
                mismatches++;
        }
        off += t->t.nbytes;
    }
    CHECK(checked > 40);
    CHECK_EQ_INT(mismatches, 0);

    di_ckpt_read_stats rs;
    CHECK_EQ_INT(di_checkpoint_read_all(ck, &rs, &err), DI_OK);
    CHECK_EQ_INT(rs.bytes, di_checkpoint_total_bytes(ck));
    CHECK(rs.seconds >= 0.0);
    di_checkpoint_close(ck);
}

int main(int argc, char **argv) {
    (void)argc;
    snprintf(tmp_root, sizeof tmp_root, "/tmp/di_test_checkpoint_XXXXXX");
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        return 1;
    }
    /* The CLI of the same build: <build>/tests/test_checkpoint -> <build>/deepinfer */
    snprintf(cli_path, sizeof cli_path, "%s", argv[0]);
    char *slash = strrchr(cli_path, '/');
    if (slash) {
        *slash = '\0';
        slash = strrchr(cli_path, '/');
    }
    if (slash) snprintf(slash, sizeof cli_path - (size_t)(slash - cli_path), "/deepinfer");
    else snprintf(cli_path, sizeof cli_path, "build/deepinfer");

    RUN(test_malformed_files);
    RUN(test_header_order_free);
    RUN(test_read_all_split);
    RUN(test_index);
    RUN(test_no_index);
    RUN(test_cli);
    RUN(test_cli_binding);
    RUN(test_golden_tiny);
    remove_tree(tmp_root);
    return test_summary();
}
