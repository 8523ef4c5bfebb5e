/* Fixture access for the chat tests: the JSON lines files in tests/data/chat, written by
 * tests/python/make_chat_fixtures.py from DeepSeek's deepseek-recipe. */
#ifndef DI_TEST_CHAT_TESTDATA_H
#define DI_TEST_CHAT_TESTDATA_H

#include <stddef.h>

struct cJSON;

/* Parses the JSON lines of tests/data/<name> into a cJSON array the caller
 * deletes; NULL when absent or malformed (reported on stderr). */
struct cJSON *chat_test_jsonl(const char *name);

#endif
