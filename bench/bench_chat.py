#!/usr/bin/env python3
"""V4.1 chat rendering and output parsing: deepinfer's C code against
DeepSeek's deepseek-recipe (Rust behind Python bindings) in the same run.

Rendering: Chat Completions bodies (JSON text, the differential test's
generated conversations that the recipe's request conversion accepts) to
the prompt string. Ours: di_chat_render through ctypes. Peer: the recipe's
ChatCompletionRequest(body).convert() then DeepseekV41Encoding.render.
Parsing: generated assistant outputs (reasoning, content, DSML tool calls) to
a message. Ours: di_chat_parse. Peer: the recipe's StreamProcessor fed the
whole text as one chunk, accumulated into a response.
Both sides start from text and end with text/objects Python holds, so the
ctypes and binding overheads are both in. Times are single-thread CPU time
(time.thread_time), medians of --repeat runs; the machine may be shared.

    python3 bench/bench_chat.py [--repeat 5]
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from chat_lib import PARSE_THINKING, PARSE_TOOLS, ChatLib, library_path  # noqa: E402

try:
    import deepseek_recipe as dr
    import test_chat_recipe as gen
except ImportError:
    sys.exit("pip install deepseek-recipe==0.2.0 (the peer)")


def timed(fn, items, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.thread_time()
        for x in items:
            fn(x)
        times.append(time.thread_time() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    lib = ChatLib(library_path())

    bodies = []
    for case in gen.cases(seed=31, n=1500):
        body, _ = gen.to_request(case)
        if case["tool_choice"] == "required" or any(m["role"] == "system" and m.get("tools")
                                                    for m in case["messages"]):
            continue
        body["model"] = "DeepSeek-V4.1-Flash"
        body["thinking"] = {"type": "enabled" if case["thinking"] else "disabled"}
        text = json.dumps(body, ensure_ascii=False)
        try:
            dr.ChatCompletionRequest(text).convert(dr.ConversionOptions())
        except (dr.ConversionError, ValueError):
            continue
        bodies.append(text)
    enc = dr.DeepseekV41Encoding()
    opts = dr.ConversionOptions()

    def recipe_render(text):
        return enc.render_conversation(dr.ChatCompletionRequest(text).convert(opts).conversation).prompt

    for text in bodies[:50]:  # same prompts, or the timing means nothing
        assert lib.render(text) == recipe_render(text)
    n_bytes = sum(len(t.encode()) for t in bodies)
    ours = timed(lib.render, bodies, args.repeat)
    peer = timed(recipe_render, bodies, args.repeat)
    print(f"render  {len(bodies)} requests, {n_bytes / 1e6:.2f} MB of JSON")
    print(f"  deepinfer       {ours * 1e6 / len(bodies):8.1f} us/request")
    print(f"  deepseek-recipe {peer * 1e6 / len(bodies):8.1f} us/request")
    print(f"  ratio (recipe / deepinfer) {peer / ours:.2f}x")

    outs = [(t, th) for t, th, _ in gen.generated_outputs(random.Random(32))]
    flags = {th: (PARSE_THINKING if th else 0) | PARSE_TOOLS for _, th in outs}
    procs = {}
    for th in (True, False):
        body = {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "u"}],
                "thinking": {"type": "enabled" if th else "disabled"},
                "tools": [{"type": "function", "function": {"name": "f"}}]}
        procs[th] = json.dumps(body)

    def recipe_parse(item):
        text, th = item
        cr = dr.ChatCompletionRequest(procs[th]).convert(opts)
        sp = dr.StreamProcessor(dr.ChatCompletionRequest.chunk_generator(cr, "id", "m"), cr.parsing_options)
        out = sp.push(dr.InferenceChunk.ready()) + sp.push(dr.InferenceChunk.text(text, 1))
        out += sp.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop)) + sp.finish()
        resp = dr.ChatCompletionResponse("id", "m", 0, 0, 0)
        for c in out:
            resp.accumulate(c)
        return resp.to_json()

    def ours_parse(item):
        return lib.parse(item[0], flags[item[1]])

    n_bytes = sum(len(t.encode()) for t, _ in outs)
    ours = timed(ours_parse, outs, args.repeat)
    peer = timed(recipe_parse, outs, args.repeat)
    print(f"parse   {len(outs)} outputs, {n_bytes / 1e6:.2f} MB")
    print(f"  deepinfer       {ours * 1e6 / len(outs):8.1f} us/output ({n_bytes / ours / 1e6:.1f} MB/s)")
    print(f"  deepseek-recipe {peer * 1e6 / len(outs):8.1f} us/output ({n_bytes / peer / 1e6:.1f} MB/s)")
    print(f"  ratio (recipe / deepinfer) {peer / ours:.2f}x")


if __name__ == "__main__":
    main()
