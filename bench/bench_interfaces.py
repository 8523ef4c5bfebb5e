#!/usr/bin/env python3
"""Throughput of the engine through its user interfaces.

1. `deepinfer bench` (llama-bench-style pp/tg rows; on the tiny model also
   decode after 1024 tokens of context) on the embedded default
   tiny model and on a ~130M-parameter dummy config (the golden tiny config
   widened as bench/bench_engine.c does), with the SVG plot.
2. The Python API against the C engine in the same run: B requests of a
   one-token prompt generating N greedy tokens each through LLM.generate,
   against `deepinfer bench -n N -b B` (decode only); the ratio shows what
   ctypes, output assembly and the one-token prefill cost.

usage: bench/bench_interfaces.py [SHARED_DIR] [--quick]
Medians over the repetitions. Writes bench/engine_throughput_<model>.svg."""
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = ROOT / os.environ.get("DEEPINFER_BUILD", "build")
BIN = BUILD / "deepinfer"
sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("DEEPINFER_LIB", str(BUILD / "libdeepinfer.so"))


def wide_config(shared, out):
    cfg = json.loads((shared / "golden" / "v41-tiny" / "config.json").read_text())
    tc = cfg["text_config"]
    tc.update(hidden_size=512, moe_intermediate_size=512, n_routed_experts=10, num_attention_heads=8,
              q_lora_rank=256, o_lora_rank=256)
    out.write_text(json.dumps(cfg, indent=1))


def cli_bench(model_args, p, n, b, reps, svg=None, d="0"):
    args = [str(BIN), "bench", "-p", p, "-n", n, "-b", b, "-d", d, "-r", str(reps), "-o", "json", *model_args]
    if svg:
        args += ["--svg", str(svg)]
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def print_rows(name, rows):
    print("| model | batch | test | t/s (mean ± sd) | median |")
    print("|---|---:|---|---:|---:|")
    for r in rows:
        print("| %s | %d | %s | %.1f ± %.1f | %.1f |" % (name, r["n_batch"], r["test"], r["avg_ts"], r["stddev_ts"],
                                                        statistics.median(r["samples_ts"])))


def python_vs_c(llm, model_args, name, n_gen, batches, reps):
    from deepinfer import SamplingParams
    sp = SamplingParams(temperature=0, max_tokens=n_gen, ignore_eos=True)
    print("\n| model | batch | Python LLM.generate tok/s | C engine tg tok/s | Python / C |")
    print("|---|---:|---:|---:|---:|")
    c_rows = cli_bench(model_args, "0", str(n_gen), ",".join(map(str, batches)), reps)
    for b, row in zip(batches, c_rows):
        times = []
        for k in range(reps):
            prompts = [{"prompt_token_ids": [17 + i + k]} for i in range(b)]
            t0 = time.perf_counter()
            llm.generate(prompts, sp, use_tqdm=False)
            times.append(time.perf_counter() - t0)
        py = b * n_gen / statistics.median(times)
        c = statistics.median(row["samples_ts"])
        print("| %s | %d | %.1f | %.1f | %.2f |" % (name, b, py, c, py / c))


def main():
    quick = "--quick" in sys.argv
    rest = [a for a in sys.argv[1:] if a != "--quick"]
    shared = pathlib.Path(rest[0] if rest else ROOT.parent / "shared")
    from deepinfer import LLM
    reps = 2 if quick else 3
    print("## deepinfer bench: embedded default tiny model")
    rows = cli_bench([], "64,256,1024", "32", "1,4,16", reps, ROOT / "bench" / "engine_throughput_tiny.svg",
                     d="0,1024")
    print_rows("v41-tiny", rows)
    with LLM() as llm:
        python_vs_c(llm, [], "v41-tiny", 32, [1, 4, 16], reps)
    if not (shared / "golden" / "v41-tiny" / "config.json").exists():
        print("\n(no %s/golden: the ~130M dummy model is skipped)" % shared)
        return
    with tempfile.TemporaryDirectory() as d:
        cfg = pathlib.Path(d) / "config.json"
        wide_config(shared, cfg)
        tok = shared / "golden" / "v41-tiny" / "tokenizer.json"
        model_args = ["--config", str(cfg), "--tokenizer", str(tok)]
        print("\n## deepinfer bench: dummy ~130M")
        rows = cli_bench(model_args, "64", "16", "1,4,16", reps, ROOT / "bench" / "engine_throughput_130m.svg")
        print_rows("dummy ~130M", rows)
        with LLM(model=str(cfg), load_format="dummy", tokenizer=str(tok)) as llm:
            python_vs_c(llm, model_args, "dummy ~130M", 16, [1, 4, 16], reps)


if __name__ == "__main__":
    main()
