/* libFuzzer target: the regex front end (parser, UTF-8 classes, NFA→DFA).
 * The input is compiled with small limits against a tiny vocabulary; when it
 * compiles, a matcher consumes a few tokens derived from the input and fills
 * masks (tests/fuzz/fuzz_grammar.h). */
#include "fuzz_grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_constraint(DI_CONSTRAINT_REGEX, data, size);
}
