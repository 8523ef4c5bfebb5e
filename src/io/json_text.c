/* Lexical pre-checks for untrusted JSON: see json_text.h. */
#include "io/json_text.h"

#include <cjson/cJSON.h>

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

di_status di_json_text_check(const char *text, size_t n, const char *what, int integers_only,
                             di_err *err) {
    const unsigned char *s = (const unsigned char *)text;
    size_t bad = di_utf8_valid_prefix(s, n);
    if (bad < n)
        return di_err_set(err, DI_ERR_FORMAT, "%s is not valid UTF-8 (byte %zu: 0x%02X)", what,
                          bad, s[bad]);
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (in_string) {
            if (c == '"') in_string = 0;
            else if (c < 0x20)
                return di_err_set(err, DI_ERR_FORMAT,
                                  "%s has a raw control character 0x%02X inside a string "
                                  "(byte %zu)", what, c, i);
            else if (c == '\\' && i + 1 < n) {
                /* \u0000 would end the C string cJSON hands back early, so
                 * "a\u0000b" and "a" would name the same tensor. */
                if (s[i + 1] == 'u' && n - i >= 6 && s[i + 2] == '0' && s[i + 3] == '0' &&
                    s[i + 4] == '0' && s[i + 5] == '0')
                    return di_err_set(err, DI_ERR_FORMAT,
                                      "%s has an escaped NUL character (\\u0000) in a string "
                                      "(byte %zu)", what, i);
                i++; /* the escaped character cannot end the string */
            }
            continue;
        }
        if (c == '"') in_string = 1;
        else if (c < 0x20 && c != '\t' && c != '\n' && c != '\r')
            return di_err_set(err, DI_ERR_FORMAT,
                              "%s has a control character 0x%02X outside a string (byte %zu)",
                              what, c, i);
        else if (integers_only && is_digit(c)) {
            size_t start = i;
            while (i + 1 < n && is_digit(s[i + 1])) i++;
            if (s[start] == '0' && i > start)
                return di_err_set(err, DI_ERR_FORMAT,
                                  "%s has a number with a leading zero (byte %zu)", what, start);
            if (i + 1 < n && (s[i + 1] == '.' || s[i + 1] == 'e' || s[i + 1] == 'E'))
                return di_err_set(err, DI_ERR_FORMAT,
                                  "%s has a non-integer number (byte %zu); only integers are "
                                  "allowed", what, start);
        }
    }
    return DI_OK;
}

di_status di_json_parse_strict(const char *text, size_t n, const char *what, int integers_only,
                               cJSON **out, di_err *err) {
    *out = NULL;
    di_status s = di_json_text_check(text, n, what, integers_only, err);
    if (s) return s;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    if (!root) {
        size_t at = end && end >= text && end <= text + n ? (size_t)(end - text) : 0;
        return di_err_set(err, DI_ERR_FORMAT, "%s is not valid JSON (near byte %zu of %zu)", what,
                          at, n);
    }
    /* Writers pad with spaces; anything else after the value (NUL padding
     * included) is rejected, as the reference reader does. */
    for (const char *p = end; p < text + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return di_err_set(err, DI_ERR_FORMAT,
                              "%s has trailing characters after the JSON value (byte %zu)", what,
                              (size_t)(p - text));
        }
    *out = root;
    return DI_OK;
}
