"""Writes tests/data/chat/*.jsonl: outputs of DeepSeek's deepseek-recipe
(0.2.0) that the C unit tests check without Python.

  python3 tests/python/make_chat_fixtures.py

render_cases.jsonl  {"chat": request object as JSON text, "thinking": 0|1, "prompt": str,
                     "ids": [...] (tiny V4.1 tokenizer) or null}
parse_cases.jsonl   {"text": str, "flags": int, "stop": [...], "reasoning": str|null,
                     "content": str, "tool_calls": [[name, arguments], ...]}
floats.jsonl        {"literal": JSON number text, "repr": how the prompt prints it}
"""
import json
import os
import random
import sys

import deepseek_recipe as dr

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "data", "chat")
TINY = os.path.join(ROOT, "tests", "data", "tokenizer-v41-tiny.json")
sys.path.insert(0, HERE)
import test_chat_recipe as t  # noqa: E402


def main():
    os.makedirs(OUT, exist_ok=True)
    enc = dr.DeepseekV41Encoding()
    tiny = dr.DeepseekV41Encoding().with_tokenizer(dr.Tokenizer.from_file(TINY))
    with open(os.path.join(OUT, "render_cases.jsonl"), "w") as f:
        for case in t.cases(seed=21, n=60):
            conv = t.to_recipe(case)
            prompt = enc.render_conversation(conv).prompt
            try:
                ids = tiny.encode(conv)
            except RuntimeError:
                ids = None  # the tiny vocabulary has no DSML / reminder tokens
            body, thinking = t.to_request(case)
            # the chat is kept as text: numbers must reach the C side as written
            f.write(json.dumps({"chat": json.dumps(body, ensure_ascii=False), "thinking": thinking,
                                "prompt": prompt, "ids": ids},
                               ensure_ascii=False) + "\n")
    rng = random.Random(22)
    with open(os.path.join(OUT, "parse_cases.jsonl"), "w") as f:
        outs = t.generated_outputs(rng)[:40] + t.generated_outputs(rng)[-34:]
        cut = random.Random(24)
        for full, thinking, _ in outs:
            if 'name="a b"' in full:
                continue
            for text, tools in ((full, True), (full, False), (full[:cut.randint(0, len(full))], True)):
                r, c, calls = t.recipe_parse(text, thinking, tools, [text])
                flags = (1 if thinking else 0) | (2 if tools else 0)
                f.write(json.dumps({"text": text, "flags": flags, "stop": [], "reasoning": r, "content": c,
                                    "tool_calls": calls}, ensure_ascii=False) + "\n")
        for text, stop in [("a STOP b", ["STOP"]), ("rSTOP</think>aSTOPb", ["STOP"]), ("a xy b yz", ["yz", "xy"])]:
            for thinking in (True, False):
                r, c, calls = t.recipe_parse(text, thinking, False, [text], stop=stop)
                f.write(json.dumps({"text": text, "flags": 1 if thinking else 0, "stop": stop, "reasoning": r,
                                    "content": c, "tool_calls": calls}, ensure_ascii=False) + "\n")
    with open(os.path.join(OUT, "floats.jsonl"), "w") as f:
        lits = ["1.50", "1e2", "-0", "0", "-0.0", "123456789012345678901234567890", "0.1", "1e-7", "1.5e300",
                "1e16", "1e15", "9999999999999998", "1E+2", "2.5E-5", "0.0001", "0.00001", "18446744073709551615",
                "18446744073709551616", "-9223372036854775808", "-9223372036854775809", "5e-324",
                "1.7976931348623157e308", "123.456", "100", "-42"]
        rng = random.Random(23)
        for _ in range(60):
            lits.append(repr(rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30)).replace("+", ""))
        for lit in lits:
            conv = dr.Conversation([dr.UserMessage("u"), dr.AssistantMessage("", tool_calls=[
                dr.ToolCall("i", "f", '{"x": %s}' % lit)])], thinking_mode=False,
                tools=[dr.ToolDefinition("f", "", {})])
            p = enc.render_conversation(conv).prompt
            k = p.index('string="false">') + len('string="false">')
            f.write(json.dumps({"literal": lit, "repr": p[k:p.index("</", k)]}) + "\n")


if __name__ == "__main__":
    main()
