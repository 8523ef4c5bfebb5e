"""Shared set-up of the CLI tests: the deepinfer binary of the build under
test (skips when it is not built)."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = ROOT / os.environ.get("DEEPINFER_BUILD", "build") / "deepinfer"


def find_shared_dir():
    """../shared (golden fixtures, corpora) or $DEEPINFER_SHARED_DIR; None when absent."""
    for cand in (os.environ.get("DEEPINFER_SHARED_DIR"), ROOT.parent / "shared", ROOT.parent.parent / "shared"):
        if cand and (pathlib.Path(cand) / "golden" / "README.md").is_file():
            return pathlib.Path(cand)
    return None


def need_bin():
    if not BIN.exists():
        pytest.skip("%s not built (run make)" % BIN)
    return BIN


def run(*args, check=True, timeout=300, **kw):
    p = subprocess.run([str(need_bin()), *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError("deepinfer %s -> %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr))
    return p
