"""The Triton concat kernel on CPU through Triton's interpreter, compared bitwise with torch.cat.

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated (at import of :mod:`mla_lab.kernels.triton_concat`),
so the kernel runs in a *subprocess* started with ``TRITON_INTERPRET=1``: this file is also that worker
(``python test_kernels_triton_interp.py --worker IN OUT``). Nothing leaks into the other tests' process.

The parent builds the cases (fresh random inputs, strided views, NaN-poisoned outputs) and saves them with
``torch.save`` (which keeps strides and shared storages); the worker runs the kernel and saves the outputs back;
each parametrized test then checks one case here. The interpreter handles bf16 and fp16 CPU tensors (checked:
both dtypes are in the grid below), so no dtype substitution is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _case_grid():
    """(id, spec) pairs; spec: T, H, Hp, dtype, layout, zero_padding, block_rows (None = API default)."""
    grid = []
    for dt in DTYPES:
        for T, H, Hp in [(1, 1, 1), (3, 5, 8), (5, 1, 64), (3, 8, 64), (4, 16, 16), (1, 3, 128)]:
            for zp in (False, True):
                grid.append((f"{dt}-T{T}-H{H}-Hp{Hp}-zp{int(zp)}", dict(T=T, H=H, Hp=Hp, dtype=dt, layout="contig",
                                                                       zero_padding=zp, block_rows=None)))
        for layout in ("slices", "transposed", "odd_stride", "out_slice"):
            for zp in (False, True):
                grid.append((f"{dt}-{layout}-zp{int(zp)}", dict(T=5, H=4, Hp=8, dtype=dt, layout=layout,
                                                               zero_padding=zp, block_rows=None)))
    # tuning knobs the benchmark sweeps (block_rows, streaming cache hints); T*H = 72 rows also exercises EVEN_ROWS
    # both ways (72 % 16 != 0, 72 % 4 == 0)
    for br, st in [(1, False), (4, False), (16, False), (16, True), (64, False)]:
        for zp in (False, True):
            grid.append((f"block{br}-st{int(st)}-zp{int(zp)}",
                         dict(T=9, H=8, Hp=64, dtype="bf16", layout="contig", zero_padding=zp, block_rows=br,
                              streaming=st)))
    grid.append(("T0", dict(T=0, H=8, Hp=64, dtype="bf16", layout="contig", zero_padding=True, block_rows=None)))
    return grid


CASES = _case_grid()


def _make(spec, seed):
    g = torch.Generator().manual_seed(seed)
    T, H, Hp, dtype = spec["T"], spec["H"], spec["Hp"], DTYPES[spec["dtype"]]
    lay = spec["layout"]
    if lay == "slices":
        big = torch.randn(2 * T + 1, H + 2, 640, generator=g).to(dtype)
        a, b = big[: 2 * T : 2, 1 : H + 1, :512], big[1 : T + 1, :H, 576:640]
    elif lay == "transposed":
        a = torch.randn(H, T, 512, generator=g).to(dtype).transpose(0, 1)
        b = torch.randn(H, T, 64, generator=g).to(dtype).transpose(0, 1)
    elif lay == "odd_stride":
        x = torch.randn(T, H, 579, generator=g).to(dtype)
        a, b = x[:, :, :512], x[:, :, 515:]
    else:
        a = torch.randn(T, H, 512, generator=g).to(dtype)
        b = torch.randn(T, H, 64, generator=g).to(dtype)
    ws = None
    if lay in ("out_slice", "transposed"):
        ws = torch.full((T + 3, Hp + 2, 576), float("nan"), dtype=dtype)
        out = ws[:T, 1 : Hp + 1]
    else:
        out = torch.full((T, Hp, 576), float("nan"), dtype=dtype)
    return a, b, out, ws


def _worker(inp: str, outp: str) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from mla_lab.kernels import concat_mla_q, last_backend
    from mla_lab.kernels.triton_concat import concat_mla_q_triton, triton_interpreting

    assert triton_interpreting()
    cases = torch.load(inp)
    results = {}
    for cid, c in cases.items():
        a, b, out = c["a"], c["b"], c["out"]
        try:
            if c["spec"]["block_rows"] is None:
                concat_mla_q(a, b, out, zero_padding=c["spec"]["zero_padding"], backend="triton")
                backend = last_backend("concat_mla_q")
            else:
                concat_mla_q_triton(a, b, out, zero_padding=c["spec"]["zero_padding"],
                                    block_rows=c["spec"]["block_rows"], streaming=c["spec"]["streaming"])
                backend = "triton"
            results[cid] = {"out": out, "backend": backend, "error": None}
            if "ws" in c:  # shares storage with out (one torch.save), so it shows what the kernel wrote
                results[cid]["ws"] = c["ws"]
        except Exception as e:  # reported per case by the parent
            results[cid] = {"out": None, "backend": None, "error": f"{type(e).__name__}: {e}"}
    torch.save(results, outp)


@pytest.fixture(scope="module")
def interp_results(tmp_path_factory):
    d = tmp_path_factory.mktemp("triton_interp")
    cases = {}
    for i, (cid, spec) in enumerate(CASES):
        a, b, out, ws = _make(spec, seed=1000 + i)
        cases[cid] = {"spec": spec, "a": a, "b": b, "out": out}
        if ws is not None:
            cases[cid]["ws"] = ws
    torch.save(cases, d / "in.pt")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(d / "in.pt"),
                           str(d / "out.pt")], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"triton interpreter worker failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return cases, torch.load(d / "out.pt")


def _bits(t):
    return t.contiguous().view(torch.int16)


@pytest.mark.parametrize("cid", [c[0] for c in CASES])
def test_triton_interp_matches_torch(interp_results, cid):
    cases, results = interp_results
    c, r = cases[cid], results[cid]
    assert r["error"] is None, r["error"]
    assert r["backend"] == "triton"
    a, b, before, out = c["a"], c["b"], c["out"], r["out"]
    H = a.shape[1]
    assert out.shape == before.shape and out.stride() == before.stride()
    expect = torch.cat([a, b], dim=-1)
    assert torch.equal(_bits(out[:, :H]), _bits(expect)), "real heads differ from torch.cat"
    assert not out[:, :H].isnan().any()
    if c["spec"]["zero_padding"]:
        assert torch.equal(_bits(out[:, H:]), torch.zeros_like(_bits(out[:, H:]))), "padding not zeroed"
    else:
        assert torch.equal(_bits(out[:, H:]), _bits(before[:, H:])), "padded heads were touched"
    if "ws" in c:
        # the workspace outside the [:T, 1:Hp+1] view must be untouched too
        ws = r["ws"]
        T, Hp = c["spec"]["T"], c["spec"]["Hp"]
        outside = torch.ones(ws.shape[:2], dtype=torch.bool)
        outside[:T, 1 : Hp + 1] = False
        assert ws[outside].isnan().all(), "kernel wrote outside the out view"


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--worker":
    _worker(sys.argv[2], sys.argv[3])
