"""`deepinfer dump` against the golden fixtures (golden README levels 3-5).

The dump of each fixture's own inputs (prompt ids, decode inputs, draft
input) must have the golden's names, dtypes and shapes, and its logits must
lie within the fixture's recommended bounds: that is the end-to-end check any
fixture of this layout can be given. The inputs file is written fresh from
the golden (only the input tensors), so the command cannot lean on anything
else the golden holds; the Engram map then comes from the model's
tokenizer.json.
"""
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file


INPUTS = ("prompt_ids", "decode.input_ids", "draft0.input_id", "draft0.start_pos")
BOUNDS = {  # golden.json -> tolerances.recommended
    "v41-tiny": dict(mean=0.25, p99=1.2, max=3.9, agree=0.85),
    "v41-tiny-bf16": dict(mean=0.14, p99=1.2, max=4.9, agree=0.85),
}




@pytest.mark.parametrize("fixture", ["v41-tiny", "v41-tiny-bf16"])
def test_dump_matches_golden(cli, shared_dir, tmp_path, fixture):
    gold = load_file(str(shared_dir / "golden" / fixture / "golden.safetensors"))
    prompts = ["short"]  # the long prompt is covered by the C tests
    inputs = {f"{p}.{k}": gold[f"{p}.{k}"] for p in prompts for k in INPUTS}
    save_file(inputs, str(tmp_path / "in.safetensors"))
    args = [str(cli), "dump", "--model", str(shared_dir / "golden" / "v41-tiny"),
            "--inputs", str(tmp_path / "in.safetensors"), "--out", str(tmp_path / "out.safetensors")]
    if fixture.endswith("bf16"):
        args.append("--bf16")
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = load_file(str(tmp_path / "out.safetensors"))
    b = BOUNDS[fixture]
    for p in prompts:
        for name in ("prefill.logits", "decode.logits", "decode.next_ids",
                     "draft0.logits", "draft0.confidence", "draft0.ids"):
            key = f"{p}.{name}"
            assert out[key].dtype == gold[key].dtype and out[key].shape == gold[key].shape, key
        for name in ("prefill.logits", "decode.logits", "draft0.logits"):
            d = np.abs(out[f"{p}.{name}"] - gold[f"{p}.{name}"])
            assert d.mean() <= b["mean"], (name, d.mean())
            assert np.quantile(d, 0.99) <= b["p99"], name
            assert d.max() <= b["max"], name
            agree = (out[f"{p}.{name}"].argmax(-1) == gold[f"{p}.{name}"].argmax(-1)).mean()
            assert agree >= b["agree"], (name, agree)
        # greedy ids agree up to the first step whose golden margin is small
        for i, m in enumerate(gold[f"{p}.decode.margin"]):
            if m < 1.0:
                break
            assert out[f"{p}.decode.next_ids"][i] == gold[f"{p}.decode.next_ids"][i]
        # drafted ids up to the first slot whose golden margin is small
        for i, row in enumerate(gold[f"{p}.draft0.logits"]):
            top2 = np.sort(row)[-2:]
            if top2[1] - top2[0] < 1.0:
                break
            assert out[f"{p}.draft0.ids"][i] == gold[f"{p}.draft0.ids"][i]


def test_dump_rejects_bad_inputs(cli, shared_dir, tmp_path):
    save_file({"x.prompt_ids": np.array([5, 99999], dtype=np.int32)}, str(tmp_path / "in.safetensors"))
    r = subprocess.run([str(cli), "dump", "--model", str(shared_dir / "golden" / "v41-tiny"),
                        "--inputs", str(tmp_path / "in.safetensors"), "--out", str(tmp_path / "o.safetensors")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "outside" in r.stderr
    assert not (tmp_path / "o.safetensors").exists()
