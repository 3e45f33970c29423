"""concat_mla_q (torch backend, and the API's validation) against a plain torch.cat reference.

Every output is poisoned (NaN, plus a bit-pattern check) before the call, so an unwritten real element or a touched
padded element is caught; comparisons are bitwise (a copy must be exact).
"""

from __future__ import annotations

import pytest
import torch

from mla_lab.kernels import concat_mla_q, last_backend

DTYPES = [torch.bfloat16, torch.float16]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _poisoned(shape, dtype, device="cpu") -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _check(ql_nope, q_pe, out, before, zero_padding=False):
    H = ql_nope.shape[1]
    expect = torch.cat([ql_nope, q_pe], dim=-1)
    assert torch.equal(_bits(out[:, :H]), _bits(expect)), "real heads differ from torch.cat"
    assert not out[:, :H].isnan().any(), "a real element was not written"
    if zero_padding:
        assert torch.equal(_bits(out[:, H:]), torch.zeros_like(_bits(out[:, H:]))), "padded heads not zeroed"
    else:
        assert torch.equal(_bits(out[:, H:]), _bits(before[:, H:])), "padded heads were touched"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [0, 1, 7, 33])
@pytest.mark.parametrize("H,Hp", [(1, 1), (3, 3), (8, 64), (16, 64), (5, 8), (64, 64), (2, 128)])
@pytest.mark.parametrize("zero_padding", [False, True])
def test_concat_torch_grid(dtype, T, H, Hp, zero_padding):
    g = torch.Generator().manual_seed(T * 1000 + H * 10 + Hp)
    a = torch.randn(T, H, 512, generator=g).to(dtype)
    b = torch.randn(T, H, 64, generator=g).to(dtype)
    out = _poisoned((T, Hp, 576), dtype)
    before = out.clone()
    res = concat_mla_q(a, b, out, zero_padding=zero_padding, backend="torch")
    assert res is out
    assert last_backend("concat_mla_q") == "torch"
    _check(a, b, out, before, zero_padding)


@pytest.mark.parametrize("dtype", DTYPES)
def test_concat_auto_on_cpu_is_torch(dtype):
    a = torch.randn(4, 2, 512).to(dtype)
    b = torch.randn(4, 2, 64).to(dtype)
    out = _poisoned((4, 8, 576), dtype)
    before = out.clone()
    concat_mla_q(a, b, out)
    assert last_backend("concat_mla_q") == "torch"
    _check(a, b, out, before)


def _strided_cases(dtype, T=6, H=4):
    """(name, ql_nope, q_pe, out) with strided inputs/outputs: slices of bigger tensors and transposed views."""
    g = torch.Generator().manual_seed(7)
    big = torch.randn(2 * T + 1, H + 2, 576 + 64, generator=g).to(dtype)
    # Slices: the NoPE and RoPE parts of one bigger tensor (token stride 2x, head stride 640).
    yield "slices_of_one_tensor", big[:T * 2:2, 1:H + 1, :512], big[1:T + 1, :H, 576:640], (T, H + 4)
    # Transposed: stored head-major [H, T, d], viewed [T, H, d] (token stride d, head stride T*d).
    hm_n = torch.randn(H, T, 512, generator=g).to(dtype)
    hm_p = torch.randn(H, T, 64, generator=g).to(dtype)
    yield "head_major_transposed", hm_n.transpose(0, 1), hm_p.transpose(0, 1), (T, H + 4)
    # Odd strides (not multiples of 8 elements): a stride that breaks 16-byte alignment of rows.
    odd = torch.randn(T, H, 512 + 64 + 3, generator=g).to(dtype)
    yield "odd_row_stride", odd[:, :, :512], odd[:, :, 515:579], (T, H)
    # Every other head of a 2H-head tensor (head stride 2 rows).
    wide_n = torch.randn(T, 2 * H, 512, generator=g).to(dtype)
    wide_p = torch.randn(T, 2 * H, 64, generator=g).to(dtype)
    yield "every_other_head", wide_n[:, ::2], wide_p[:, 1::2], (T, 64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("out_kind", ["contiguous", "slice_of_workspace", "transposed"])
def test_concat_strided(dtype, out_kind):
    for name, a, b, (T, Hp) in _strided_cases(dtype):
        assert a.stride(-1) == 1 and b.stride(-1) == 1
        if out_kind == "contiguous":
            out = _poisoned((T, Hp, 576), dtype)
        elif out_kind == "slice_of_workspace":  # workspace[:T] of a bigger buffer, plus a head offset
            out = _poisoned((T + 5, Hp + 2, 576), dtype)[:T, 2:]
        else:  # head-major storage
            out = _poisoned((Hp, T, 576), dtype).transpose(0, 1)
        before = out.clone()
        concat_mla_q(a, b, out, backend="torch")
        _check(a, b, out, before)
        assert not (a.is_contiguous() and b.is_contiguous()), f"case {name} is meant to be strided"


def test_concat_zero_T_is_noop():
    a = torch.empty(0, 8, 512, dtype=torch.bfloat16)
    b = torch.empty(0, 8, 64, dtype=torch.bfloat16)
    out = torch.empty(0, 64, 576, dtype=torch.bfloat16)
    assert concat_mla_q(a, b, out, zero_padding=True) is out


def test_concat_workspace_view():
    """The lab's QConcatWorkspace hands out [:T] views; concat into one leaves the padded heads as they were."""
    from mla_lab.buffers import QConcatWorkspace

    ws = QConcatWorkspace(32, 8, arch="hopper", dtype=torch.bfloat16)
    ws.buffer.fill_(float("nan"))
    a = torch.randn(20, 8, 512).to(torch.bfloat16)
    b = torch.randn(20, 8, 64).to(torch.bfloat16)
    out = ws.view(20)
    before = out.clone()
    concat_mla_q(a, b, out)
    assert out.shape == (20, 64, 576)
    _check(a, b, out, before)
    assert ws.buffer[20:].isnan().all()


# ----------------------------------------------------------------------------------------------------- errors

def _ok(T=3, H=2, Hp=4, dtype=torch.bfloat16):
    return (torch.randn(T, H, 512).to(dtype), torch.randn(T, H, 64).to(dtype), torch.empty(T, Hp, 576, dtype=dtype))


ERROR_CASES = [
    # (name, mutate(a, b, out) -> (a, b, out) or kwargs, expected message fragments)
    ("nope_rank", lambda a, b, o: (a[0], b, o), ["ql_nope must be 3-D", "(2, 512)"]),
    ("pe_rank", lambda a, b, o: (a, b.unsqueeze(0), o), ["q_pe must be 3-D", "(1, 3, 2, 64)"]),
    ("out_rank", lambda a, b, o: (a, b, o.reshape(3, -1)), ["out must be 3-D"]),
    ("nope_width", lambda a, b, o: (a[..., :256], b, o), ["ql_nope.shape[-1] must be 512", "(3, 2, 256)"]),
    ("pe_width", lambda a, b, o: (a, torch.cat([b, b], -1), o), ["q_pe.shape[-1] must be 64", "(3, 2, 128)"]),
    ("out_width", lambda a, b, o: (a, b, o[..., :512]), ["out.shape[-1] must be 576", "(3, 4, 512)"]),
    ("T_mismatch_inputs", lambda a, b, o: (a, b[:2], o), ["q_pe.shape[:2] must equal", "(3, 2)", "(2, 2, 64)"]),
    ("H_mismatch_inputs", lambda a, b, o: (a, b[:, :1], o), ["q_pe.shape[:2] must equal", "(3, 1, 64)"]),
    ("T_mismatch_out", lambda a, b, o: (a, b, o[:2]), ["out.shape[0] must equal T=3", "(2, 4, 576)"]),
    ("out_too_few_heads", lambda a, b, o: (a, b, o[:, :1]), ["out.shape[1] (padded heads) must be >= H=2",
                                                             "(3, 1, 576)"]),
    ("fp32", lambda a, b, o: (a.float(), b.float(), o.float()), ["ql_nope.dtype must be one of", "torch.float32"]),
    ("mixed_dtype", lambda a, b, o: (a, b.half(), o), ["share one dtype", "q_pe.dtype=torch.float16"]),
    ("nope_last_dim_strided", lambda a, b, o: (torch.randn(3, 2, 1024).to(a.dtype)[..., ::2], b, o),
     ["ql_nope's last dim must be contiguous", "stride()"]),
    ("out_last_dim_strided", lambda a, b, o: (a, b, torch.empty(3, 4, 1152, dtype=o.dtype)[..., ::2]),
     ["out's last dim must be contiguous"]),
    ("pe_last_dim_strided", lambda a, b, o: (a, torch.randn(3, 2, 128).to(a.dtype)[..., ::2], o),
     ["q_pe's last dim must be contiguous"]),
    ("meta_device", lambda a, b, o: (a, b, torch.empty(3, 4, 576, dtype=o.dtype, device="meta")),
     ["must be on one device", "out.device=meta"]),
    ("not_tensor", lambda a, b, o: (a.tolist(), b, o), ["ql_nope must be a torch.Tensor", "list"]),
]


@pytest.mark.parametrize("name,mutate,fragments", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_concat_errors(name, mutate, fragments):
    a, b, o = mutate(*_ok())
    with pytest.raises(ValueError) as ei:
        concat_mla_q(a, b, o, backend="torch")
    for f in fragments:
        assert f in str(ei.value), (f, str(ei.value))


def test_concat_unknown_backend():
    with pytest.raises(ValueError, match=r"backend='cuda' is not known; allowed: \['auto', 'torch', 'triton'\]"):
        concat_mla_q(*_ok(), backend="cuda")


def test_concat_triton_on_cpu_without_interpreter_raises():
    from mla_lab.kernels.triton_concat import triton_available, triton_interpreting

    if not triton_available()[0]:
        pytest.skip("triton not importable here; the CPU-tensor rule is checked only when triton imports")
    if triton_interpreting():
        pytest.skip("TRITON_INTERPRET=1 in this process: CPU tensors are then allowed on the triton backend")
    with pytest.raises(ValueError, match=r"backend='triton' needs CUDA tensors .* got device=cpu"):
        concat_mla_q(*_ok(), backend="triton")


def test_last_backend_errors():
    with pytest.raises(ValueError, match="op='nope' is not known"):
        last_backend("nope")


# ---------------------------------------------------------------------------------- the launcher (API level)

@pytest.mark.parametrize("name,mutate,fragments", ERROR_CASES[:6] + ERROR_CASES[10:12],
                         ids=[c[0] for c in ERROR_CASES[:6] + ERROR_CASES[10:12]])
def test_make_concat_launcher_checks_at_the_door(name, mutate, fragments):
    from mla_lab.kernels import make_concat_launcher

    a, b, o = mutate(*_ok())
    with pytest.raises(ValueError) as ei:
        make_concat_launcher(a, b, o, backend="torch")
    for f in fragments:
        assert f in str(ei.value), (f, str(ei.value))


@pytest.mark.parametrize("zero_padding", [False, True])
def test_make_concat_launcher_torch_backend_relaunches(zero_padding):
    """On CPU (auto -> torch) the launcher is the checked op bound to its tensors: it writes once when made and
    again, with the inputs' current values, on every call."""
    from mla_lab.kernels import make_concat_launcher

    a, b = torch.randn(5, 3, 512).to(torch.bfloat16), torch.randn(5, 3, 64).to(torch.bfloat16)
    out = _poisoned((5, 8, 576), torch.bfloat16)
    before = out.clone()
    launch = make_concat_launcher(a, b, out, zero_padding=zero_padding)
    assert last_backend("concat_mla_q") == "torch"
    _check(a, b, out, before, zero_padding)
    out.fill_(float("nan"))
    a.neg_()
    b.mul_(2)
    assert launch() is out
    _check(a, b, out, before, zero_padding)


def test_triton_block_rows_must_be_a_power_of_two():
    from mla_lab.kernels.triton_concat import concat_mla_q_triton, triton_available

    if not triton_available()[0]:
        pytest.skip("triton not importable here")
    for bad in (3, 0, 2.0, True):
        with pytest.raises(ValueError, match=f"block_rows must be a power of two >= 1; got block_rows={bad!r}"):
            concat_mla_q_triton(*_ok(), block_rows=bad)


# ------------------------------------------------------------------------------------------------------ GPU

_CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("T,H,Hp,zp", [(1, 8, 64, False), (37, 8, 64, False), (37, 8, 64, True), (300, 16, 64, False),
                                       (64, 128, 128, False), (5, 5, 8, True), (4099, 8, 64, False),
                                       (16385, 16, 64, False)])
@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="torch.cuda.is_available() is False: no CUDA GPU")
def test_gpu_kernel_and_launcher(T, H, Hp, zp):
    """On the GPU: the kernel through the API, and the launcher's compiled path, eager and captured in a CUDA graph
    replayed after the inputs changed, bitwise against torch.cat with poisoned padded heads."""
    from mla_lab.kernels import make_concat_launcher

    dt = torch.bfloat16
    a = torch.randn(H, T, 512, device="cuda").to(dt).transpose(0, 1)  # vLLM's bmm-then-transpose layout
    b = torch.randn(T, H, 192, device="cuda").to(dt)[..., 128:]  # a split of q
    out = _poisoned((T, Hp, 576), dt, "cuda")
    before = out.clone()
    concat_mla_q(a, b, out, zero_padding=zp, backend="triton")
    _check(a.cpu(), b.cpu(), out.cpu(), before.cpu(), zp)
    out.fill_(float("nan"))
    launch = make_concat_launcher(a, b, out, zero_padding=zp, backend="triton")
    assert launch.path == "compiled", launch
    out.fill_(float("nan"))
    a.neg_()
    launch()
    torch.cuda.synchronize()
    _check(a.cpu(), b.cpu(), out.cpu(), before.cpu(), zp)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch()
    b.mul_(-2)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    _check(a.cpu(), b.cpu(), out.cpu(), before.cpu(), zp)


# ------------------------------------------------------------------------------ PTX for sm90, compiled on CPU

def _ptx_global_ops(T, H, Hp, zero_padding=False):
    """Compile the kernel for sm90 exactly as ``concat_mla_q_triton`` would launch it (same constexprs from
    ``_plan``; strides and pointers specialised as Triton does for 16-divisible values) and count the global
    load/store instructions in the PTX, by vector width."""
    import re
    from collections import Counter

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mla_lab.kernels.triton_concat import _plan

    a, b = torch.empty(T, H, 512, dtype=torch.bfloat16), torch.empty(T, H, 64, dtype=torch.bfloat16)
    out = torch.empty(T, Hp, 576, dtype=torch.bfloat16)
    kernel, _grid, args, cx, nw = _plan(a, b, out, zero_padding)
    names = kernel.arg_names
    sig, attrs = {}, {}
    for i, (n, v) in enumerate(zip(names, list(args) + list(cx.values()))):
        if n in cx:
            sig[n] = "constexpr"
        elif isinstance(v, torch.Tensor):
            sig[n], attrs[(i,)] = "*bf16", [["tt.divisibility", 16]]
        else:
            sig[n] = "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(k),): v for k, v in cx.items()}, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": nw}).asm["ptx"]
    return Counter(re.findall(r"(ld|st)\.global(?:\.[a-z_]+)*\.(v\d)\.b32", ptx))


@pytest.mark.slow
def test_ptx_vector_widths_sm90():
    """v2 2 x 1 uses 16-byte vectors (v4.b32) for the 512-wide part and 8-byte ones (v2.b32) for the [2, 64] tile
    (8 B per thread)."""
    from mla_lab.kernels.triton_concat import triton_available, triton_interpreting

    if not triton_available()[0]:
        pytest.skip("triton not importable here")
    if triton_interpreting():
        pytest.skip("TRITON_INTERPRET=1 in this process: kernels are interpreted, not compiled")
    v2 = _ptx_global_ops(4096, 8, 64)
    assert v2 == {("ld", "v4"): 4, ("st", "v4"): 4, ("ld", "v2"): 1, ("st", "v2"): 1}, v2
