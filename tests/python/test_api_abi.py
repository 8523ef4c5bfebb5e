"""The ctypes mirror of the engine API (python/deepinfer/_ffi.py) against
include/deepinfer.h: every mirrored structure has the header's fields, in
the header's order, with matching C types, so a change to the header that
the package does not follow fails here instead of corrupting memory."""
import ctypes
import re

import pytest

from api_lib import ROOT

from deepinfer import _ffi

HEADER = (ROOT / "include" / "deepinfer.h").read_text()

SCALARS = {
    "int": ctypes.c_int, "unsigned": ctypes.c_uint, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64, "size_t": ctypes.c_size_t, "double": ctypes.c_double, "float": ctypes.c_float,
}
ENUMS = set(re.findall(r"}\s*(di_\w+)\s*;", HEADER)) & set(re.findall(r"typedef enum \w+ {[^}]*}\s*(di_\w+)", HEADER))


def c_fields(name):
    m = re.search(r"typedef struct %s {(.*?)} %s;" % (name, name), HEADER, re.S)
    assert m, "struct %s not found in the header" % name
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    out = []
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        m = re.match(r"((?:const )?\w+)((?: ?\*(?: ?const)?)*) ?(.*)", decl)
        base, stars, names = m.group(1).replace("const ", ""), m.group(2), m.group(3)
        for n in names.split(","):
            n = n.strip()
            ptr = stars.count("*") + n.count("*")
            out.append((n.strip("* "), base, ptr))
    return out


@pytest.mark.parametrize("c_name,py", [
    ("di_engine_options", _ffi.EngineOptions),
    ("di_engine_info", _ffi.EngineInfo),
    ("di_chat_options", _ffi.ChatOptions),
    ("di_sampling_params", _ffi.CSamplingParams),
    ("di_engine_progress", _ffi.EngineProgress),
    ("di_completion", _ffi.Completion),
    ("di_request_output", _ffi.RequestOutputC),
])
def test_structures_match_the_header(c_name, py):
    cf = c_fields(c_name)
    assert [n for n, _, _ in cf] == [n for n, _ in py._fields_]
    for (n, base, ptr), (_, t) in zip(cf, py._fields_):
        if ptr:
            assert t in (ctypes.c_void_p, ctypes.c_char_p) or issubclass(t, ctypes._Pointer), n
        elif base in ENUMS:
            assert t is ctypes.c_int, n
        else:
            assert ctypes.sizeof(t) == ctypes.sizeof(SCALARS[base]) and t._type_ == SCALARS[base]._type_, n
