/* Fixture access for the chat tests (see chat_testdata.h). */
#include "chat_testdata.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_fixtures.h"

cJSON *chat_test_jsonl(const char *name) {
    char *text = fixture_read(name, NULL);
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
