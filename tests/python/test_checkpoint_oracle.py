"""Differential test of the checkpoint reader against the `safetensors` package.

`deepinfer check --list` prints every tensor with dtype, shape, shard and the
CRC-32 of its bytes; the reference reader (safetensors.deserialize) must see
exactly the same tensors with the same bytes. Malformed files that the
reference rejects must be rejected by `check` too.
"""
import json
import struct
import subprocess
import zlib

import pytest
import safetensors





def run_check(cli, model_dir, *extra):
    return subprocess.run([str(cli), "check", "--model", str(model_dir), *extra],
                          capture_output=True, text=True, timeout=120)


def test_tiny_listing_matches_reference(cli, shared_dir):
    model = shared_dir / "golden" / "v41-tiny"
    r = run_check(cli, model, "--list")
    assert r.returncode == 0, r.stderr
    ours = {}
    for line in r.stdout.splitlines():
        if not line.startswith("tensor\t"):
            continue
        _, name, dtype, shape, shard, crc = line.split("\t")
        shape = [int(x) for x in shape.strip("[]").split(",") if x]
        ours[name] = (dtype, shape, shard, int(crc, 16))

    index = json.loads((model / "model.safetensors.index.json").read_text())
    ref = {}
    total = 0
    for shard in sorted(set(index["weight_map"].values())):
        for name, info in safetensors.deserialize((model / shard).read_bytes()):
            data = bytes(info["data"])
            total += len(data)
            ref[name] = (info["dtype"], list(info["shape"]), shard, zlib.crc32(data))
    assert len(ref) == 1005
    assert ours == ref
    assert f"tensors  1005 ({total} bytes" in r.stdout
    assert index["metadata"]["total_size"] == total
    # bytes per dtype in the summary
    per_dtype = {}
    for dtype, shape, _, _ in ref.values():
        n = 1
        for d in shape:
            n *= d
        per_dtype[dtype] = per_dtype.get(dtype, 0) + n * {"I8": 1, "F8_E4M3": 1, "F8_E8M0": 1,
                                                          "BF16": 2, "F32": 4}[dtype]
    summary = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in per_dtype and parts[2] == "bytes":
            summary[parts[0]] = int(parts[1])
    assert summary == per_dtype
    assert sum(per_dtype.values()) == total


def st_file(header: bytes, data: bytes, length=None) -> bytes:
    return struct.pack("<Q", len(header) if length is None else length) + header + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# (case, file bytes): the reference rejects each; ours must too.
MALFORMED = [
    ("short", b"\x01\x00"),
    ("len_past_eof", st_file(b"{}", b"", length=64)),
    ("len_huge", st_file(b"{}", b"", length=1 << 50)),
    ("not_utf8", st_file(b'{"\xff":1}', b"")),
    ("not_object", st_file(b"[]", b"")),
    ("overlap", st_file(json.dumps({"a": entry("F32", [2], 0, 8),
                                    "b": entry("F32", [2], 4, 12)}).encode(), bytes(12))),
    ("gap", st_file(json.dumps({"a": entry("F32", [2], 0, 8),
                                "b": entry("F32", [2], 12, 20)}).encode(), bytes(20))),
    ("size", st_file(json.dumps({"a": entry("F32", [3], 0, 8)}).encode(), bytes(8))),
    ("dtype", st_file(json.dumps({"a": entry("Q7", [2], 0, 2)}).encode(), bytes(2))),
    ("trailing", st_file(json.dumps({"a": entry("U8", [2], 0, 2)}).encode(), bytes(3))),
    ("truncated", st_file(json.dumps({"a": entry("U8", [8], 0, 8)}).encode(), bytes(3))),
    ("meta", st_file(json.dumps({"__metadata__": {"k": 1}}).encode(), b"")),
    ("nul_pad", st_file(b"{}\0\0\0\0\0\0", b"")),
]


@pytest.mark.parametrize("case,blob", MALFORMED, ids=[c for c, _ in MALFORMED])
def test_malformed_rejected_like_reference(cli, tmp_path, case, blob):
    with pytest.raises(Exception):
        safetensors.deserialize(blob)
    (tmp_path / "model.safetensors").write_bytes(blob)
    r = run_check(cli, tmp_path)
    assert r.returncode == 1, r.stdout
    assert "model.safetensors" in r.stderr


# Valid files the reference accepts: ours must accept them, with the same bytes.
VALID = [
    ("reordered", st_file(json.dumps({"b": entry("F32", [2], 8, 16),
                                      "a": entry("BF16", [2, 2], 0, 8)}).encode(), bytes(range(16)))),
    ("scalar_and_empty", st_file(json.dumps({"s": entry("I64", [], 0, 8),
                                             "e": entry("F8_E4M3", [0, 5], 8, 8)}).encode(),
                                 bytes(range(8)))),
    ("padded", st_file(b'  {"x":{"dtype":"F8_E8M0","shape":[3],"data_offsets":[0,3]}}   ', b"abc")),
]


@pytest.mark.parametrize("case,blob", VALID, ids=[c for c, _ in VALID])
def test_valid_accepted_like_reference(cli, tmp_path, case, blob):
    ref = {n: (i["dtype"], list(i["shape"]), zlib.crc32(bytes(i["data"])))
           for n, i in safetensors.deserialize(blob)}
    (tmp_path / "model.safetensors").write_bytes(blob)
    r = run_check(cli, tmp_path, "--list")
    assert r.returncode == 0, r.stderr
    ours = {}
    for line in r.stdout.splitlines():
        if line.startswith("tensor\t"):
            _, name, dtype, shape, _, crc = line.split("\t")
            ours[name] = (dtype, [int(x) for x in shape.strip("[]").split(",") if x], int(crc, 16))
    assert ours == ref


def test_golden_outputs_file_matches_reference(cli, shared_dir):
    """A folder without index or model.safetensors: every *.safetensors is read."""
    folder = shared_dir / "golden" / "v41-tiny-bf16"
    r = run_check(cli, folder, "--list")
    assert r.returncode == 0, r.stderr
    ours = {}
    for line in r.stdout.splitlines():
        if line.startswith("tensor\t"):
            _, name, dtype, shape, shard, crc = line.split("\t")
            ours[name] = (dtype, [int(x) for x in shape.strip("[]").split(",") if x], shard,
                          int(crc, 16))
    ref = {n: (i["dtype"], list(i["shape"]), "golden.safetensors", zlib.crc32(bytes(i["data"])))
           for n, i in safetensors.deserialize((folder / "golden.safetensors").read_bytes())}
    assert len(ref) > 50
    assert ours == ref
    assert "binding  skipped: no config.json" in r.stdout
