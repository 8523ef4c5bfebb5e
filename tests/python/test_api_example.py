"""examples/offline_inference.py: the default run, the structured-output
check (passes, and fails when its validator disagrees with the output), and
the validation of --ep/--dp/--cp and of the sampling flags."""
import importlib.util
import os
import subprocess
import sys

import pytest

from api_lib import ROOT

EXAMPLE = ROOT / "examples" / "offline_inference.py"


def run(*args):
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))


def test_default_run_prints_outputs_and_speed():
    p = run("--max_tokens", "8")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("Prompt: ") == 4
    assert "embedded default model" in p.stdout and "tokens/s generated" in p.stdout


def test_check_structured_output_passes():
    p = run("--check_structured_output")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "FAIL" not in p.stdout and " 0 failed" in p.stdout
    assert p.stdout.count("  ok    ") >= 14


def test_check_structured_output_can_fail(capsys):
    spec = importlib.util.spec_from_file_location("offline_inference", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.EBNF_AS_REGEX = r"maybe"  # a validator that rejects what the grammar allows
    assert mod.main(["--check_structured_output"]) == 1
    assert "FAIL  ebnf" in capsys.readouterr().out


@pytest.mark.parametrize("args,msg", [
    (["--ep", "8"], "parallelism are not available in this build"),
    (["--ep", "2", "--dp", "8"], "asks for 16 devices"),
    (["--ep", "2", "--cp", "8"], "asks for 16 devices"),
    (["--ep", "0"], "expected a positive integer"),
    (["--dp", "x"], "expected a positive integer"),
    (["--dp", "2", "--cp", "2"], "--dp and --cp are alternatives"),
    (["--temperature", "-1"], "temperature must be in [0, 100]"),
    (["--temperature", "nan"], "temperature must be"),
    (["--seed", "-3"], "seed"),
])
def test_flags_are_validated(args, msg):
    p = run(*args)
    assert p.returncode == 2 and msg in p.stderr, p.stderr
