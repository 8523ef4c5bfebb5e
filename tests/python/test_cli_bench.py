"""`deepinfer bench`: llama-bench-style rows (one per batch size x test),
consistent statistics, markdown and JSON forms, and an SVG that parses with
one polyline per series."""
import json
import re
import statistics
import xml.etree.ElementTree as ET

from cli_lib import run


def test_json_rows_and_svg(tmp_path):
    svg = tmp_path / "b.svg"
    rows = json.loads(run("bench", "-p", "8,16", "-n", "3", "-b", "1,2", "-d", "0,8", "-r", "2", "-o", "json",
                          "--svg", svg).stdout)
    tests = [(r["n_batch"], r["test"]) for r in rows]
    assert tests == [(b, t) for b in (1, 2) for t in ("pp8", "pp16", "tg3", "tg3 @ d8")]
    for r in rows:
        assert len(r["samples_ts"]) == 2 and all(s > 0 for s in r["samples_ts"])
        assert abs(r["avg_ts"] - statistics.mean(r["samples_ts"])) < 1e-3
        assert abs(r["stddev_ts"] - statistics.stdev(r["samples_ts"])) < 1e-3
        assert (r["n_prompt"] > 0) != (r["n_gen"] > 0)
        assert r["warmup_ts"] > 0  # each test ran once untimed first
    root = ET.parse(svg).getroot()
    lines = [e for e in root.iter() if e.tag.endswith("polyline")]
    # by batch: pp8, pp16, tg3, tg3 @ d8; by context: pp B=1, tg B=1, pp B=2, tg B=2
    assert len(lines) == 8
    by_batch = [len(e.get("points").split()) for e in lines[:4]]
    assert by_batch == [2, 2, 2, 2]


def test_markdown_and_ranges():
    out = run("bench", "-p", "8", "-n", "0", "-b", "1-4*2", "-r", "1").stdout.splitlines()
    assert out[0] == "| model | threads | n_batch | test | t/s |"
    body = out[2:]
    assert [re.match(r"\| \S+ \| \d+ \| (\d+) \| pp8 \| [\d.]+ ± [\d.]+ \|$", l).group(1) for l in body] == \
        ["1", "2", "4"]


def test_bad_lists():
    p = run("bench", "-p", "x", check=False)
    assert p.returncode == 2 and "-p: expected a list of integers" in p.stderr
    p = run("bench", "-b", "0", check=False)
    assert p.returncode == 2
    p = run("bench", "-o", "csv", check=False)
    assert p.returncode == 2 and "expected md or json" in p.stderr
    p = run("bench", "-p", "0", "-n", "0", check=False)
    assert p.returncode == 2 and "nothing to measure" in p.stderr and "| test |" not in p.stdout


def test_sampling_flags():
    rows = json.loads(run("bench", "-p", "0", "-n", "4", "-b", "1,3", "-r", "1", "-o", "json", "--temp", "0.8",
                          "--top-p", "0.9", "--top-k", "20").stdout)
    assert [r["test"] for r in rows] == ["tg4", "tg4"] and all(r["avg_ts"] > 0 for r in rows)
    assert all((r["temperature"], r["top_p"], r["top_k"]) == (0.8, 0.9, 20) for r in rows)
    assert all(r["forward_ms_step"] > 0 and r["host_ms_step"] >= 0 for r in rows)  # where a decode step goes
    greedy = json.loads(run("bench", "-p", "0", "-n", "2", "-r", "1", "-o", "json").stdout)
    assert (greedy[0]["temperature"], greedy[0]["top_p"], greedy[0]["top_k"]) == (0, 1, 0)
    pen = json.loads(run("bench", "-p", "0", "-n", "3", "-r", "1", "-o", "json", "--temp", "0.7",
                         "--repetition-penalty", "1.2", "--presence-penalty", "0.5", "--frequency-penalty",
                         "-0.25").stdout)
    assert (pen[0]["repetition_penalty"], pen[0]["presence_penalty"], pen[0]["frequency_penalty"]) == (1.2, 0.5, -0.25)
    assert (greedy[0]["repetition_penalty"], greedy[0]["presence_penalty"], greedy[0]["frequency_penalty"]) == (1, 0, 0)
    lp = json.loads(run("bench", "-p", "0", "-n", "3", "-r", "1", "-o", "json", "--logprobs", "5").stdout)
    assert lp[0]["logprobs"] == 5 and greedy[0]["logprobs"] == -1 and lp[0]["avg_ts"] > 0
    for flag, val in (("--temp", "-1"), ("--top-p", "0"), ("--top-p", "1.5"), ("--top-k", "-2"),
                      ("--repetition-penalty", "0"), ("--repetition-penalty", "2.5"), ("--presence-penalty", "3"),
                      ("--frequency-penalty", "-2.5"), ("--logprobs", "21"), ("--logprobs", "-1")):
        p = run("bench", flag, val, check=False)
        assert p.returncode == 2 and flag + ": expected" in p.stderr, (flag, val, p.stderr)


def test_no_warmup():
    rows = json.loads(run("bench", "-p", "8", "-n", "2", "-r", "1", "--no-warmup", "-o", "json").stdout)
    assert [r["test"] for r in rows] == ["pp8", "tg2"]
    assert all("warmup_ts" not in r and len(r["samples_ts"]) == 1 for r in rows)
    assert "forward_ms_step" not in rows[0] and rows[1]["forward_ms_step"] > 0  # tg rows only
    err = run("bench", "-p", "8", "-n", "0", "-r", "1").stderr
    assert re.search(r"pp8, batch 1: [\d.]+ t/s \(warm-up run [\d.]+ t/s\)", err)


def test_tg_window_holds_the_whole_batch():
    """A tg test times the whole batch decoding: with a step budget that
    makes the prefill of 6 sequences of 24 tokens outlast their 4 tokens,
    every sequence still makes its 4 tokens inside the window (6 x 4
    counted); pp rows count no window."""
    for step_tokens in ("16", "512"):
        rows = json.loads(run("bench", "-p", "8", "-n", "4", "-d", "24", "-b", "6", "-r", "1", "-o", "json",
                              "--step-tokens", step_tokens).stdout)
        pp, tg = rows
        assert "tokens_timed" not in pp and tg["tokens_timed"] == 6 * 4, (step_tokens, tg)
        assert tg["avg_ts"] > 0 and tg["forward_ms_step"] > 0

