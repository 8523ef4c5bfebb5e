/* Fixture access for the chat tests (see chat_testdata.h). */
#include "chat_testdata.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *chat_test_read(const char *name, size_t *len) {
    static const char *const dirs[] = {"tests/data", "../tests/data", "../../tests/data"};
    for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dirs[d], name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
        if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
            buf[n] = '\0';
            fclose(f);
            if (len) *len = (size_t)n;
            return buf;
        }
        free(buf);
        fclose(f);
    }
    fprintf(stderr, "missing tests/data/%s\n", name);
    return NULL;
}

cJSON *chat_test_jsonl(const char *name) {
    char *text = chat_test_read(name, NULL);
    if (!text) return NULL;
    cJSON *arr = cJSON_CreateArray();
    char *line = text;
    int lineno = 1;
    while (arr && *line) {
        char *end = strchr(line, '\n');
        if (end) *end = '\0';
        if (*line) {
            cJSON *item = cJSON_Parse(line);
            if (!item) {
                fprintf(stderr, "tests/data/%s:%d: malformed JSON\n", name, lineno);
                cJSON_Delete(arr);
                arr = NULL;
                break;
            }
            cJSON_AddItemToArray(arr, item);
        }
        if (!end) break;
        line = end + 1;
        lineno++;
    }
    free(text);
    return arr;
}
