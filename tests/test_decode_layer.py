"""The decode experiment's layer (mla_lab/measure/experiments/decode_layer.py) on CPU: the tiny model's decode and
mixed steps run op by op under Triton's interpreter (a subprocess: TRITON_INTERPRET must be set before triton is
imported), the decode logits kernel agrees with fp64 torch, both attention paths give the same real heads, and the
kernel's indices stay inside each request's own context."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import json
import torch
from mla_lab.deployment import Deployment
from mla_lab.measure.layer import tiny_model
from mla_lab.measure.experiments import decode_layer as dl

dl.check_decode_logits("cpu", torch.float32)  # raises when the decode logits kernel is wrong
rank = Deployment.seed(model=tiny_model(), tp=2).rank
D = dl.DecodeLayer(rank, 32, 4 * 256, "cpu", torch.float32)  # the interpreter computes bf16 wrongly: fp32 on CPU


def concat(ql_nope, q_pe, out):  # the lab's concat takes fp16 / bf16 only (tested in test_kernels_concat.py)
    out[:, :ql_nope.shape[1]] = torch.cat([ql_nope, q_pe], -1)
    return out


D.k.concat = concat
out = {"H": D.H, "Hp": D.Hp}
for name, (B, c, P) in {"decode": (4, 256, 0), "mixed": (2, 128, 16)}.items():
    S = dl.Step(D, B, c, P)
    dl.as_fn(S.ops("private_workspace"))()  # the layer once: every op's output exists
    heads = {}
    for strat in dl.STRATEGIES:
        dl.as_fn([op for op in S.ops(strat, topk_indices=False) if op[0] in dl.ATTN_OPS])()
        heads[strat] = S.o.clone()
    rows = S.idx_fixed[P:, 0].long()
    lo = (P + torch.arange(B) * c)[:, None]
    out[name] = {"ops": [n for n, _, _ in S.ops("per_call_zeros")],
                 "c_dependent": [n for n, _, dep in S.ops("per_call_zeros") if dep],
                 "same_heads": bool(torch.equal(*heads.values())), "o_shape": list(S.o.shape),
                 "inside_own_context": bool(((rows >= lo) & (rows < lo + c) | (rows == -1)).all()),
                 "distinct": all(len(set(r[r >= 0].tolist())) == int((r >= 0).sum()) for r in rows),
                 "topk_length": S.topk_length.tolist()}
print(json.dumps(out))
'''


@pytest.mark.slow
def test_decode_layer_steps_run_on_cpu():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert (out["H"], out["Hp"]) == (8, 64)  # tiny model: 16 heads at TP 2, padded to sm90's 64
    dec, mix = out["decode"], out["mixed"]
    assert dec["ops"][:3] == ["input_norm", "q_a_proj", "q_a_norm"] and dec["ops"][-1] == "shared_down"
    assert "idx_logits_prefill" not in dec["ops"] and {"idx_logits_prefill", "idx_logits_decode"} <= set(mix["ops"])
    assert {"concat_unfused", "pad_new_zeros_copy"} <= set(dec["ops"]) and "concat_fused" not in dec["ops"]
    assert set(dec["c_dependent"]) == {"idx_logits_decode", "idx_topk_decode", "idx_to_global", "sparse_kernel"}
    for step, T in ((dec, 4), (mix, 18)):
        assert step["same_heads"] and step["o_shape"] == [T, 8, 512]  # zeros pad vs zeroed workspace: bit-identical
        assert step["inside_own_context"] and step["distinct"]
    # topk_length: min(p + 1, topk) for the 16 prompt tokens, min(c, topk) = 128 (tiny topk) for decode tokens
    assert mix["topk_length"] == list(range(1, 17)) + [128, 128] and dec["topk_length"] == [128] * 4
