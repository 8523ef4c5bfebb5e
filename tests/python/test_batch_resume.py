"""`deepinfer batch` is resumable: killed with SIGKILL at random moments and
rerun until it finishes, its output equals an uninterrupted run's line for
line (order aside; "created" is a timestamp and left out). Also: a torn
last line is removed, duplicate custom_ids and foreign output files are
refused, per-request errors become error lines."""
import json
import os
import random
import signal
import subprocess
import time

import pytest

from cli_lib import need_bin, run


def requests():
    reqs = []
    for i in range(28):
        body = {"model": "deepseek-v4.1-flash", "messages": [{"role": "user", "content": "Item %d: say something." % i}],
                "max_tokens": 6 + (i * 7) % 30, "temperature": 0.8 if i % 3 else 0.0}
        if i % 2:
            body["thinking"] = {"type": "disabled"}
        if i % 4 == 0:
            body["seed"] = 1000 + i  # the others get a seed derived from their custom_id
        if i % 5 == 0:
            body["reasoning_effort"] = "high"
        if i == 6:
            body.update(logprobs=True, top_logprobs=2, thinking={"type": "disabled"})
        if i == 9:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "n", "schema": {
                "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                "additionalProperties": False}}}
            body["max_tokens"] = 80
        reqs.append({"custom_id": "req-%02d" % i, "method": "POST", "url": "/v1/chat/completions", "body": body})
    reqs.insert(5, {"custom_id": "bad-role", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"messages": [{"role": "wizard", "content": "x"}]}})
    reqs.insert(17, {"custom_id": "bad-url", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}})
    return reqs


def write_jsonl(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))


def normalized(path):
    """custom_id -> the line without its timestamp; fails on a corrupt or repeated line."""
    out = {}
    for line in path.read_text().splitlines():
        o = json.loads(line)
        if o.get("response"):
            o["response"]["body"].pop("created")
        assert o["custom_id"] not in out, "duplicate line for %s" % o["custom_id"]
        out[o["custom_id"]] = json.dumps(o, sort_keys=True)
    return out


def complete_lines_ok(path):
    """Every newline-terminated line of a partial output parses."""
    data = path.read_bytes() if path.exists() else b""
    for line in data.split(b"\n")[:-1]:
        json.loads(line)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    need_bin()
    d = tmp_path_factory.mktemp("batch")
    write_jsonl(d / "in.jsonl", requests())
    t0 = time.monotonic()
    run("batch", "--input", d / "in.jsonl", "--output", d / "ref.jsonl", "--quiet")
    (d / "seconds").write_text(str(time.monotonic() - t0))
    return d


def test_reference_run_lines(job):
    ref = normalized(job / "ref.jsonl")
    reqs = requests()
    assert sorted(ref) == sorted(r["custom_id"] for r in reqs)
    assert json.loads(ref["bad-url"])["error"]["code"] == "invalid_request"
    assert "wizard" in json.loads(ref["bad-role"])["error"]["message"]
    for r in reqs:
        o = json.loads(ref[r["custom_id"]])
        if o["error"]:
            assert o["response"] is None
            continue
        body = o["response"]["body"]
        assert o["response"]["status_code"] == 200 and body["object"] == "chat.completion"
        msg = body["choices"][0]["message"]
        assert msg["role"] == "assistant" and {"content", "reasoning_content", "tool_calls"} <= set(msg)
        u = body["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert u["completion_tokens"] <= r["body"]["max_tokens"]
        if body["choices"][0]["finish_reason"] == "length":
            assert u["completion_tokens"] == r["body"]["max_tokens"]
        if r["body"].get("thinking", {}).get("type") == "disabled":
            assert msg["reasoning_content"] is None
    lp_out = json.loads(ref["req-06"])["response"]["body"]
    entries = lp_out["choices"][0]["logprobs"]["content"]
    assert len(entries) == lp_out["usage"]["completion_tokens"]
    for t in entries:
        assert t["logprob"] <= 0 and len(t["top_logprobs"]) == 2
        assert t["top_logprobs"][0]["logprob"] >= t["top_logprobs"][1]["logprob"]
        assert t["logprob"] <= t["top_logprobs"][0]["logprob"] + 1e-6
        assert t["token"] == bytes(t["bytes"]).decode("utf-8", "replace")
    text = bytes(b for t in entries for b in t["bytes"]).decode("utf-8", "replace")
    assert text == lp_out["choices"][0]["message"]["content"]
    assert json.loads(ref["req-02"])["response"]["body"]["choices"][0]["logprobs"] is None
    schema_out = json.loads(ref["req-09"])["response"]["body"]["choices"][0]
    if schema_out["finish_reason"] == "stop":
        assert isinstance(json.loads(schema_out["message"]["content"])["n"], int)


def test_killed_at_random_points_then_resumed(job):
    out = job / "killed.jsonl"
    rng = random.Random(20261130)
    whole = float((job / "seconds").read_text())
    kills = 0
    partial = set()  # line counts seen between kills
    attempt = 0
    while attempt < 8 or (kills < 3 and attempt < 16):
        t0 = time.monotonic()
        p = subprocess.Popen([str(need_bin()), "batch", "--input", str(job / "in.jsonl"), "--output", str(out),
                              "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        done = out.read_bytes().count(b"\n") if out.exists() else 0
        frac = 1 - done / len(requests())
        deadline = t0 + 0.05 + rng.uniform(0.0, 0.7) * whole * frac  # somewhere inside what is left of the job
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            kills += 1
        p.wait()
        complete_lines_ok(out)
        if out.exists():
            partial.add(out.read_bytes().count(b"\n"))
        if p.returncode == 0 and frac > 0:
            # it ran to the end first: the reference run (the job's first, on a machine that may
            # have been busier) overstated the job's time; take the time seen and start over
            whole = min(whole, (time.monotonic() - t0) / frac)
            out.unlink()
        if attempt == 3 and out.exists():
            # a write cut in the middle: half of a line, no newline
            with open(out, "ab") as f:
                f.write(b'{"id": "batch_req_torn", "custom_id": "req-')
        attempt += 1
    assert kills >= 3, "the job finished too fast to be interrupted"
    assert any(0 < n < len(requests()) for n in partial), partial  # killed between written lines
    p = run("batch", "--input", job / "in.jsonl", "--output", out)
    assert normalized(out) == normalized(job / "ref.jsonl")
    # a finished job run again writes nothing
    before = out.read_bytes()
    p = run("batch", "--input", job / "in.jsonl", "--output", out)
    assert "already answered" in p.stderr and out.read_bytes() == before


def test_torn_last_line_is_removed(job):
    out = job / "torn.jsonl"
    ref_lines = (job / "ref.jsonl").read_text().splitlines(keepends=True)
    out.write_text("".join(ref_lines[:5]) + ref_lines[5][:40])
    p = run("batch", "--input", job / "in.jsonl", "--output", out)
    assert "torn last line (40 bytes)" in p.stderr
    assert "%d of %d requests answered in this run, 5 before" % (len(ref_lines) - 5, len(ref_lines)) in p.stderr
    assert normalized(out) == normalized(job / "ref.jsonl")


def test_duplicate_custom_ids_are_refused(tmp_path):
    reqs = requests()[:3] + [requests()[1]]
    write_jsonl(tmp_path / "in.jsonl", reqs)
    p = run("batch", "--input", tmp_path / "in.jsonl", "--output", tmp_path / "o.jsonl", check=False)
    assert p.returncode == 1
    assert 'in.jsonl:4: duplicate custom_id "%s" (first on line 2)' % reqs[1]["custom_id"] in p.stderr
    assert not (tmp_path / "o.jsonl").exists() or (tmp_path / "o.jsonl").read_text() == ""


def test_bad_input_lines_and_foreign_output(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"custom_id": "a", "url": "/v1/chat/completions", "body": {}}\nnot json\n')
    p = run("batch", "--input", tmp_path / "in.jsonl", "--output", tmp_path / "o.jsonl", check=False)
    assert p.returncode == 1 and "in.jsonl:2: not a JSON object" in p.stderr
    write_jsonl(tmp_path / "in2.jsonl", requests()[:2])
    (tmp_path / "other.jsonl").write_text('{"custom_id": "zzz", "response": null, "error": null}\n')
    p = run("batch", "--input", tmp_path / "in2.jsonl", "--output", tmp_path / "other.jsonl", check=False)
    assert p.returncode == 1 and 'custom_id "zzz", which is not in' in p.stderr
    p = run("batch", "--input", tmp_path / "in2.jsonl", check=False)
    assert p.returncode == 2 and "--input and --output are required" in p.stderr
