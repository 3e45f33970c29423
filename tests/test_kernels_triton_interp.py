"""The Triton concat kernel on CPU through Triton's interpreter, compared bitwise with torch.cat.

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated (at import of :mod:`mla_lab.kernels.triton_concat`),
so the kernel runs in a *subprocess* started with ``TRITON_INTERPRET=1``: this file is also that worker
(``python test_kernels_triton_interp.py --worker IN OUT``). Nothing leaks into the other tests' process.

The parent builds the cases (fresh random inputs, strided views, NaN-poisoned outputs) and saves them with
``torch.save`` (which keeps strides and shared storages); the worker runs the kernel and saves the outputs back;
each parametrized test then checks one case here. The interpreter handles bf16 and fp16 CPU tensors (checked:
both dtypes are in the grid below), so no dtype substitution is needed.

The kernel runs the cases through the API, the direct launch and the launcher hot path
(:func:`mla_lab.kernels.make_concat_launcher`; under the interpreter its ``jit`` path). A second worker runs vLLM's own
``tests/kernels/test_concat_mla_q.py`` cases (vllm-project/vllm, commit 0ce15f9d) with exact (bitwise) compares, plus
the padded-workspace twist (H' > H, poisoned padded heads).
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
    """(id, spec) pairs; spec: T, H, Hp, dtype, layout, zero_padding, mode, cfg (``block_rows`` or None)."""
    grid = []
    for dt in DTYPES:
        for T, H, Hp in [(1, 1, 1), (3, 5, 8), (5, 1, 64), (3, 8, 64), (4, 16, 16), (1, 3, 128)]:
            for zp in (False, True):
                grid.append((f"v2-{dt}-T{T}-H{H}-Hp{Hp}-zp{int(zp)}",
                             dict(T=T, H=H, Hp=Hp, dtype=dt, layout="contig", zero_padding=zp, mode="api", cfg=None)))
        for layout in ("slices", "transposed", "odd_stride", "out_slice"):
            for zp in (False, True):
                grid.append((f"v2-{dt}-{layout}-zp{int(zp)}",
                             dict(T=5, H=4, Hp=8, dtype=dt, layout=layout, zero_padding=zp, mode="api", cfg=None)))
    # the launcher hot path: made, inputs changed in place, called again (it must relaunch, not replay a result)
    for T, H, Hp, layout in [(3, 8, 64, "contig"), (5, 4, 8, "transposed"), (5, 4, 8, "out_slice"),
                             (0, 8, 64, "contig")]:
        for zp in (False, True):
            grid.append((f"v2-launcher-T{T}-H{H}-Hp{Hp}-{layout}-zp{int(zp)}",
                         dict(T=T, H=H, Hp=Hp, dtype="bf16", layout=layout, zero_padding=zp, mode="launcher",
                              cfg=None)))
    # rows per program; T*H = 72 rows exercises EVEN_ROWS both ways (72 % 16 != 0, 72 % 4 == 0)
    for br in (1, 4, 16, 64):
        for zp in (False, True):
            grid.append((f"v2-block{br}-zp{int(zp)}", dict(T=9, H=8, Hp=64, dtype="bf16", layout="contig",
                                                            zero_padding=zp, mode="direct", cfg=dict(block_rows=br))))
    grid.append(("v2-T0", dict(T=0, H=8, Hp=64, dtype="bf16", layout="contig", zero_padding=True, mode="api",
                               cfg=None)))
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


def _run_case(spec, a, b, out):
    """Run one case in the worker; returns (backend, launcher path or None)."""
    from mla_lab.kernels import concat_mla_q, last_backend, make_concat_launcher
    from mla_lab.kernels.triton_concat import concat_mla_q_triton

    zp = spec["zero_padding"]
    if spec["mode"] == "api":
        concat_mla_q(a, b, out, zero_padding=zp, backend="triton")
        return last_backend("concat_mla_q"), None
    if spec["mode"] == "direct":
        concat_mla_q_triton(a, b, out, zero_padding=zp, **spec["cfg"])
        return "triton", None
    launcher = make_concat_launcher(a, b, out, zero_padding=zp, backend="triton")
    out.fill_(float("nan"))  # the poison again (the make call wrote out once), then new inputs in place
    a.neg_()
    b.neg_()
    assert launcher() is out
    return last_backend("concat_mla_q"), launcher.path


def _worker(inp: str, outp: str) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from mla_lab.kernels.triton_concat import triton_interpreting

    assert triton_interpreting()
    cases = torch.load(inp)
    results = {}
    for cid, c in cases.items():
        a, b, out = c["a"], c["b"], c["out"]
        try:
            backend, path = _run_case(c["spec"], a, b, out)
            results[cid] = {"out": out, "a": a, "b": b, "backend": backend, "path": path, "error": None}
            if "ws" in c:  # shares storage with out (one torch.save), so it shows what the kernel wrote
                results[cid]["ws"] = c["ws"]
        except Exception as e:  # reported per case by the parent
            results[cid] = {"out": out, "backend": None, "error": f"{type(e).__name__}: {e}"}
    torch.save(results, outp)


def _run_worker(d: Path, cases: dict) -> dict:
    torch.save(cases, d / "in.pt")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(d / "in.pt"),
                           str(d / "out.pt")], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"triton interpreter worker failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return torch.load(d / "out.pt")


@pytest.fixture(scope="module")
def interp_results(tmp_path_factory):
    d = tmp_path_factory.mktemp("triton_interp")
    cases = {}
    for i, (cid, spec) in enumerate(CASES):
        a, b, out, ws = _make(spec, seed=1000 + i)
        cases[cid] = {"spec": spec, "a": a, "b": b, "out": out}
        if ws is not None:
            cases[cid]["ws"] = ws
    return cases, _run_worker(d, cases)


def _bits(t):
    return t.contiguous().view(torch.int16)


@pytest.mark.parametrize("cid", [c[0] for c in CASES])
def test_triton_interp_matches_torch(interp_results, cid):
    cases, results = interp_results
    c, r = cases[cid], results[cid]
    assert r["error"] is None, r["error"]
    assert r["backend"] == "triton"
    if c["spec"]["mode"] == "launcher":  # the interpreter has no compiled handle: the jit path; T = 0 launches nothing
        assert r["path"] == ("noop" if c["spec"]["T"] == 0 else "jit")
    # inputs as the last call saw them (the launcher cases negate them in place before relaunching)
    a, b, before, out = r["a"], r["b"], c["out"], r["out"]
    if c["spec"]["mode"] == "launcher" and a.numel():
        assert torch.equal(_bits(a), _bits(-c["a"])), "the launcher case did not change its inputs"
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


# ------------------------------------------------------------------------------------ vLLM's test_concat_mla_q.py
# Ported from vllm-project/vllm tests/kernels/test_concat_mla_q.py (commit 0ce15f9d): NUM_TOKENS, NUM_HEADS = [128],
# both dtypes; contiguous, transposed nope (the bmm output's transpose), split rope (q_pe a [.., 192] split),
# zero tokens, bit-pattern preservation. vLLM compares with assert_close(atol=0, rtol=0); here bitwise. T >= 16 uses
# 2048 rows per program (a constexpr, same kernel code) to keep the interpreter's per-program cost down.
VLLM_NUM_TOKENS = [1, 4, 16, 64, 128]
VLLM_NUM_HEADS = 128
BIG_CFG = {"block_rows": 2048}


def _vllm_cases():
    cases = []
    for dt in DTYPES:
        for T in VLLM_NUM_TOKENS:
            for kind in ("contiguous", "transposed_nope", "split_rope"):
                if kind == "transposed_nope" and T == 1:  # vLLM: [t for t in NUM_TOKENS if t > 1]
                    continue
                cases.append((f"v2-{dt}-{kind}-T{T}", dict(dtype=dt, kind=kind, T=T)))
    cases.append(("v2-zero_tokens", dict(dtype="bf16", kind="zero_tokens", T=0)))
    for T in (1, 64):
        cases.append((f"v2-values_preserved-T{T}", dict(dtype="bf16", kind="values_preserved", T=T)))
    # the padded-workspace twist: the same inputs into the first H heads of [T, 64, 576] (poisoned), GLM-5 TP8
    for T, H in ((16, 8), (64, 16)):
        for zp in (False, True):
            cases.append((f"v2-padded-T{T}-H{H}-zp{int(zp)}", dict(dtype="bf16", kind="padded", T=T, H=H, zp=zp)))
    return cases


VLLM_CASES = _vllm_cases()


def _vllm_make(spec, seed):
    g = torch.Generator().manual_seed(seed)
    T, dtype, kind = spec["T"], DTYPES[spec["dtype"]], spec["kind"]
    H = spec.get("H", VLLM_NUM_HEADS)
    Hp = 64 if kind == "padded" else H
    if kind == "transposed_nope":
        a = torch.randn(H, T, 512, generator=g).to(dtype).transpose(0, 1)
        assert not a.is_contiguous()
        b = torch.randn(T, H, 64, generator=g).to(dtype)
    elif kind == "split_rope":
        _, b = torch.randn(T, H, 128 + 64, generator=g).to(dtype).split([128, 64], dim=-1)
        assert b.stride(1) == 192 and b.stride(2) == 1
        a = torch.randn(T, H, 512, generator=g).to(dtype)
    elif kind == "values_preserved":  # every int16 bit pattern in order (NaN and inf patterns included)
        a = torch.arange(T * H * 512, dtype=torch.int16).view(T, H, 512).view(torch.bfloat16)
        b = torch.arange(T * H * 64, dtype=torch.int16).view(T, H, 64).view(torch.bfloat16)
    else:
        a = torch.randn(T, H, 512, generator=g).to(dtype)
        b = torch.randn(T, H, 64, generator=g).to(dtype)
    out = torch.full((T, Hp, 576), float("nan"), dtype=dtype)
    return a, b, out


@pytest.fixture(scope="module")
def vllm_results(tmp_path_factory):
    d = tmp_path_factory.mktemp("triton_interp_vllm")
    cases = {}
    for i, (cid, spec) in enumerate(VLLM_CASES):
        a, b, out = _vllm_make(spec, seed=42 + i)
        cfg = BIG_CFG if spec["T"] >= 16 else None
        run_spec = dict(zero_padding=spec.get("zp", False), mode="direct" if cfg else "api", cfg=cfg)
        cases[cid] = {"spec": run_spec, "a": a, "b": b, "out": out}
    return cases, _run_worker(d, cases)


@pytest.mark.parametrize("cid", [c[0] for c in VLLM_CASES])
def test_vllm_concat_mla_q_cases(vllm_results, cid):
    cases, results = vllm_results
    c, r = cases[cid], results[cid]
    assert r["error"] is None, r["error"]
    a, b, before, out = c["a"], c["b"], c["out"], r["out"]
    H, Hp = a.shape[1], out.shape[1]
    assert torch.equal(_bits(out[:, :H, :512]), _bits(a)), "ql_nope part differs (bitwise)"
    assert torch.equal(_bits(out[:, :H, 512:]), _bits(b)), "q_pe part differs (bitwise)"
    if "values_preserved" in cid:  # vLLM's own check: the raw int16 patterns
        assert torch.equal(out.view(torch.int16)[..., :512], torch.arange(a.numel(), dtype=torch.int16).view(a.shape))
    if Hp > H:
        if c["spec"]["zero_padding"]:
            assert torch.equal(_bits(out[:, H:]), torch.zeros_like(_bits(out[:, H:]))), "padding not zeroed"
        else:
            assert torch.equal(_bits(out[:, H:]), _bits(before[:, H:])), "padded heads were touched"


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--worker":
    _worker(sys.argv[2], sys.argv[3])
