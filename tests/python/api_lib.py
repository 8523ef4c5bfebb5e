"""Shared set-up of the Python API tests: puts python/ (the deepinfer
package) on sys.path and skips when the library is not built."""
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = ROOT / os.environ.get("DEEPINFER_BUILD", "build")
sys.path.insert(0, str(ROOT / "python"))

if not (BUILD / "libdeepinfer.so").exists():
    pytest.skip("%s/libdeepinfer.so not built (run make)" % BUILD, allow_module_level=True)
os.environ.setdefault("DEEPINFER_LIB", str(BUILD / "libdeepinfer.so"))

import deepinfer  # noqa: E402


def hf_tokenizer(model_dir):
    """The Hugging Face `tokenizers` reading of the model's tokenizer.json:
    the oracle for prompt ids and output text."""
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(str(pathlib.Path(model_dir) / "tokenizer.json"))
