"""Bad input gives a clear error (issue 6): one table of cases, each asserting the exception type and a message that
names the argument, the value and what is allowed; every case also checks that nothing already computed is lost.

Invariants checked for *every* case (see :func:`test_bad_input`):

- the message matches the case's regex and carries no traceback;
- a completed sweep (store + CSV, built once per module) is byte-for-byte unchanged: a bad call or a refused CLI run
  never touches finished work;
- for concat cases, the ``out`` buffer (filled with random values first) is unchanged: validation happens before
  any write.

Cases where the lab misbehaves today and the fix lies outside this test file are ``xfail(strict=True)`` rows whose
reason names the file and the observed behaviour: the row stays in the table, and the day the lab is fixed the
strict xfail turns into a failure that asks for the mark to be dropped.

A second table, ``ACCEPTED``, holds odd-but-valid input the lab must take and normalise or report (a model name in
capitals, numpy ints, a deployment that does not fit: ``fits_in_memory=False`` with the reason, never a negative
capacity); the same invariants hold for it.

Documented non-error behaviour (NaN/inf inputs of the sparse prefill) is asserted in the tests after the tables.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mla_lab import cli
from mla_lab.arch import get_arch
from mla_lab.buffers import QConcatWorkspace, memory_account, padded_num_heads
from mla_lab.deployment import Deployment
from mla_lab.kernels import concat_mla_q, sparse_mla_prefill
from mla_lab.kernels.flashmla import validate_sparse_prefill_inputs
from mla_lab.model.ops import attention_path_ops
from mla_lab.model.timing import attention_path_ms
from mla_lab.model.ttft import predict_ttft
from mla_lab.models import load_model, model_names, models_dir, normalize_kv_cache_dtype
from mla_lab.strategies import make_strategy
from mla_lab.sweep import expand_grid, run_sweep, validate_params
from mla_lab.sweep.params import check_tp_sizes
from mla_lab.sweep.rows import modelled_rows
from mla_lab.sweep.store import point_key
from mla_lab.workload import Workload, schedule

REPO = Path(__file__).resolve().parent.parent
BF16 = torch.bfloat16
SM90, SM100 = (9, 0), (10, 0)


class CLIFailed(Exception):
    """Raised by the CLI cases' callables: the command exited non-zero (message = exit code + stderr)."""


CUDA = torch.cuda.is_available()
no_cuda_only = pytest.mark.skipif(CUDA, reason="needs a machine without a CUDA GPU (device='cuda' is valid here)")


def misbehaves(where: str, observed: str):
    """The row's expected behaviour is what the lab should do; today it does ``observed`` (fix in ``where``)."""
    return pytest.mark.xfail(strict=True, reason=f"lab misbehaves ({where}): {observed}")


# ------------------------------------------------------------------------------------------------------- helpers


def _concat(ctx, T=4, H=8, Hp=64, dtype=BF16, nope=None, pe=None, out=None, **kw):
    """concat_mla_q on valid default tensors with some replaced; ``out`` is filled with random values and kept in
    ``ctx`` so the test can check it was not written."""
    g = torch.Generator().manual_seed(0)
    nope = torch.randn(T, H, 512, generator=g).to(dtype) if nope is None else nope
    pe = torch.randn(T, H, 64, generator=g).to(dtype) if pe is None else pe
    out = torch.empty(T, Hp, 576, dtype=dtype) if out is None else out
    if out.device.type != "meta":
        out.copy_(torch.randn(out.shape, generator=g).to(out.dtype))
        ctx.out, ctx.out_before = out, out.clone()
    return concat_mla_q(nope, pe, out, **kw)


def _prefill(T=4, h_q=64, d_qk=576, topk=128, s_kv=256, q=None, kv=None, indices=None, **kw):
    """sparse_mla_prefill (reference backend on CPU) on valid default tensors with some replaced."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(T, h_q, d_qk, generator=g).to(BF16) if q is None else q
    kv = torch.randn(s_kv, 1, d_qk, generator=g).to(BF16) if kv is None else kv
    indices = torch.randint(0, s_kv, (T, 1, topk), generator=g, dtype=torch.int32) if indices is None else indices
    kw.setdefault("sm_scale", d_qk ** -0.5)
    return sparse_mla_prefill(q, kv, indices, **kw)


def _contract(cap=SM90, T=4, h_q=64, d_qk=576, topk=128, s_kv=256, q_dtype=BF16, idx_dtype=torch.int32, d_v=512,
              topk_length=None):
    """FlashMLA's contract check (flashmla.validate_sparse_prefill_inputs) on CPU tensors for an arch capability."""
    q = torch.zeros(T, h_q, d_qk, dtype=q_dtype)
    kv = torch.zeros(s_kv, 1, d_qk, dtype=BF16)
    idx = torch.zeros(T, 1, topk, dtype=idx_dtype)
    return validate_sparse_prefill_inputs(q, kv, idx, topk_length, d_v, cap)


def _config(ctx, text=None, drop=None, **fields):
    """Write a config.json (GLM-5's, with fields replaced/dropped, or raw ``text``) and load it."""
    d = ctx.tmp / "cfg"
    d.mkdir(exist_ok=True)
    if text is None:
        raw = json.loads((models_dir() / "glm-5" / "config.json").read_text())
        raw.update(fields)
        if drop:
            raw.pop(drop)
        text = json.dumps(raw)
    (d / "config.json").write_text(text)
    return load_model("mymodel", path=d / "config.json")


def _unknown_model_dir(ctx):
    """A data dir where models/broken/ exists but holds no config.json."""
    (ctx.tmp / "data" / "models" / "broken").mkdir(parents=True)
    ctx.mp.setenv("MLA_LAB_DATA", str(ctx.tmp / "data"))
    return load_model("broken")


def _sweep(ctx, **over):
    """run_sweep over the module's completed sweep (same store and CSV) with some parameters replaced."""
    return run_sweep(dict(ctx.done.params, **over), progress=False)


def _sweep_fresh(ctx, **over):
    """run_sweep on a grid of one cheap point with a store and CSV of its own (for cases that might run points);
    when it raises, no point may have been stored."""
    params = dict(ctx.done.params, store_dir=str(ctx.tmp / "fresh_st"), data_file=str(ctx.tmp / "fresh.csv"),
                  archs=["h200"])
    params.update(over)
    try:
        return run_sweep(params, progress=False)
    except ValueError:
        assert not list((ctx.tmp / "fresh_st").glob("points/*.json")), "points were stored before the error"
        raise


def _readme_as_data_file(ctx, **over):
    """data_file = a copy of README.md: refused, and the file is left as it was."""
    readme = ctx.tmp / "README.md"
    shutil.copy(REPO / "README.md", readme)
    before = readme.read_bytes()
    try:
        _sweep_fresh(ctx, data_file=str(readme), **over)
    finally:
        assert readme.read_bytes() == before, "README.md was overwritten"


def _dir_as_data_file(ctx, path: str):
    """data_file = a directory: refused, and no ``<dir>.tmp`` is left beside it (e.g. ``/tmp.tmp``)."""
    stray = Path(path.rstrip("/") + ".tmp")
    existed = stray.exists()
    try:
        _sweep_fresh(ctx, data_file=path)
    finally:
        assert existed or not stray.exists(), f"{stray} was left behind"


def _existing_file_as_data_file(ctx, text: str):
    f = ctx.tmp / "theirs.csv"
    f.write_text(text)
    try:
        _sweep_fresh(ctx, data_file=str(f))
    finally:
        assert f.read_text() == text, f"{f} was overwritten"


def _file_under(ctx, name="afile") -> Path:
    f = ctx.tmp / name
    f.write_text("not a folder\n")
    return f


def _cli(ctx, yaml_text=None, pairs=(), fresh=False):
    """``python -m mla_lab.cli sweep`` in a subprocess against the completed sweep's store (``fresh``: a store, CSV
    and report folder of the case's own); raises CLIFailed with the exit code and stderr when it exits non-zero (and
    fails the test if it exits 0). A refusal must come before the notebook's kernel starts: when the run left an
    executed notebook under the report folder, the message says so (and no case's pattern allows it)."""
    args = [sys.executable, "-m", "mla_lab.cli", "sweep"]
    if yaml_text is not None:
        f = ctx.tmp / "params.yaml"
        f.write_text(yaml_text)
        args += ["-f", str(f)]
    paths = ({"store_dir": "fresh_st", "data_file": "fresh.csv", "report_dir": "fresh_rep"} if fresh else
             {k: ctx.done.params[k] for k in ("store_dir", "data_file", "report_dir")})
    for k, v in paths.items():
        args += ["-p", k, v]
    if fresh:
        args += ["-p", "archs", "[h200]"]
    for k, v in pairs:
        args += ["-p", k, v]
    r = subprocess.run(args, cwd=ctx.tmp, capture_output=True, text=True, timeout=300)
    if r.returncode == 0:
        pytest.fail(f"CLI accepted bad parameters: {r.stdout[-500:]}")
    err = "\n".join(ln for ln in r.stderr.strip().splitlines() if not ln.startswith("[IPKernelApp]"))
    started = sorted(p.name for p in (ctx.tmp / paths["report_dir"]).glob("runs/*.ipynb"))
    raise CLIFailed(f"exit {r.returncode}: {err}" + (f" [the kernel ran first: {started}]" if started else ""))


def _cmd(ctx, *argv):
    """``mla_lab.cli.main(argv)`` in this process (cwd = the case's folder); raises CLIFailed with the exit code and
    stderr when it returns non-zero or argparse exits, fails the test when it returns 0."""
    err = io.StringIO()
    ctx.mp.chdir(ctx.tmp)
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = cli.main(list(argv))
        except SystemExit as e:  # argparse
            rc = e.code
    if rc == 0:
        pytest.fail(f"CLI accepted {argv}")
    raise CLIFailed(f"exit {rc}: {err.getvalue().strip()}")


def _cmd_sweep(ctx, *extra):
    """``mla-lab sweep`` in-process on the completed sweep's store with ``extra`` arguments."""
    args = ["sweep"]
    for k in ("store_dir", "data_file", "report_dir"):
        args += ["-p", k, ctx.done.params[k]]
    return _cmd(ctx, *args, *extra)


def _strategy_too_many_tokens():
    s = make_strategy("fused", num_heads=8, max_num_batched_tokens=4)
    T = 5
    return s(torch.zeros(T, 8, 512, dtype=BF16), torch.zeros(T, 8, 64, dtype=BF16),
             torch.zeros(16, 1, 576, dtype=BF16), torch.zeros(T, 1, 128, dtype=torch.int32), 0.1)


MODELS = re.escape(f"allowed: {model_names()}")
STRATEGIES = r"allowed: \[.*'private_workspace'.*'subchunk:<S>'.*\], presets \[.*'vllm-53878'.*\]"
ARCHS = r"allowed: \[.*'b200'.*'h200'.*'hopper'.*\]"
KV_ALLOWED = r"allowed: \['auto', 'bf16', 'bfloat16', 'fp8', 'fp8_ds_mla', 'fp8_e4m3'\]"
GLM = load_model("glm-5")
H200 = get_arch("h200")
SEED_RANK = Deployment.seed().rank  # the cost model takes a rank view (checked at its door)
t_ = torch.zeros

# ---------------------------------------------------------------------------------------------------- the table
# (id, callable(ctx), exception type, message regex). The regex covers the argument, the value and what is allowed.

CASES = [
    # --- model / arch names, TP, heads
    ("model_unknown", lambda c: load_model("gpt-2"), ValueError,
     r"model='gpt-2' is not known \(no .*gpt-2/config.json\); " + MODELS),
    ("model_not_str", lambda c: load_model(["glm-5"]), ValueError,
     r"model=\['glm-5'\] must be a non-empty str; " + MODELS),
    ("arch_unknown", lambda c: get_arch("v100"), ValueError,
     r"arch='v100' is not a known GPU architecture; " + ARCHS),
    ("arch_not_str", lambda c: get_arch(90), ValueError, r"arch must be a str, got int 90; " + ARCHS),
    ("arch_padding_int", lambda c: padded_num_heads(8, 96), ValueError, r"prefill_padding=96 must be 64 or 128"),
    ("tp_not_dividing_heads", lambda c: GLM.heads_per_rank(3), ValueError,
     r"tp=3 does not divide num_attention_heads=64 of model 'glm-5'; allowed tp: \[1, 2, 4, 8, 16, 32, 64\]"),
    ("tp_not_dividing_deepseek_ttft",
     lambda c: Deployment.seed(model="deepseek-v3.2", tp=6), ValueError,
     r"tp=6 does not divide num_attention_heads=128 of model 'deepseek-v3.2'; allowed tp: \[1, 2, 4, 8, 16, 32, "
     r"64, 128\]"),
    ("tp_zero", lambda c: GLM.heads_per_rank(0), ValueError, r"tp=0 must be a positive int"),
    ("tp_negative", lambda c: GLM.heads_per_rank(-8), ValueError, r"tp=-8 must be a positive int"),
    ("tp_float", lambda c: GLM.heads_per_rank(8.0), ValueError, r"tp=8\.0 must be a positive int"),
    ("heads_zero", lambda c: padded_num_heads(0, "hopper"), ValueError, r"num_heads=0 must be a positive int"),
    ("heads_negative_workspace", lambda c: QConcatWorkspace(16, -1), ValueError,
     r"num_heads=-1 must be a positive int"),
    ("heads_zero_memory_account", lambda c: memory_account("private_workspace", 0, 16384), ValueError,
     r"num_heads=0 must be a positive int"),
    ("strategy_input_heads_mismatch",
     lambda c: make_strategy("fused", num_heads=8, max_num_batched_tokens=4)(
         torch.randn(4, 4, 512).bfloat16(), torch.randn(4, 4, 64).bfloat16(), None, None, 1.0), ValueError,
     r"ql_nope.shape=\(4, 4, 512\) must be \[T, num_heads=8, 512\]"),
    ("costmodel_negative_step", lambda c: attention_path_ms(SEED_RANK, "private_workspace", -1), ValueError,
     r"step=-1 must be a non-negative int"),
    ("costmodel_float_step", lambda c: attention_path_ms(SEED_RANK, "private_workspace", 1.7), ValueError,
     r"step=1.7 must be a non-negative int"),
    ("costmodel_sum_topk_too_big", lambda c: attention_path_ops(SEED_RANK, "private_workspace", 4, 4 * 2048 + 1),
     ValueError, r"sum_topk=8193 exceeds num_tokens \* index_topk = 8192"),
    ("heads_zero_strategy", lambda c: make_strategy("fused", num_heads=0, max_num_batched_tokens=4), ValueError,
     r"num_heads=0 must be a positive int"),
    # --- max_num_batched_tokens and T
    ("mbt_zero_memory_account", lambda c: memory_account("private_workspace", 8, 0), ValueError,
     r"max_num_batched_tokens=0 must be a positive int"),
    ("mbt_negative_workspace", lambda c: QConcatWorkspace(-16, 8), ValueError,
     r"max_num_batched_tokens=-16 must be a positive int"),
    ("mbt_zero_schedule", lambda c: schedule(Workload(1024), 0), ValueError,
     r"max_num_batched_tokens=0 must be a positive int"),
    ("T_over_workspace", lambda c: QConcatWorkspace(16, 8).view(17), ValueError,
     r"num_tokens=17 exceeds the workspace's max_num_batched_tokens=16; allowed: 0\.\.16"),
    ("T_negative_workspace", lambda c: QConcatWorkspace(16, 8).view(-1), ValueError,
     r"num_tokens=-1 must be a non-negative int"),
    ("T_over_memory_account", lambda c: memory_account("per_call_empty:zeros", 8, 16, num_tokens=17), ValueError,
     r"num_tokens=17 exceeds max_num_batched_tokens=16; allowed: 0\.\.16"),
    ("T_over_strategy_workspace", lambda c: _strategy_too_many_tokens(), ValueError,
     r"num_tokens=5 exceeds the workspace's max_num_batched_tokens=4; allowed: 0\.\.4"),
    ("workload_not_workload", lambda c: schedule(1024, 16), ValueError,
     r"workload=1024 must be a Workload\(prompt_len, num_prompts, concurrency\), got int"),
    ("workload_prompt_len_zero", lambda c: Workload(0), ValueError, r"prompt_len=0 must be a positive int"),
    # --- KV-cache dtype, workspace dtype, strategy names
    ("kv_dtype_int8", lambda c: normalize_kv_cache_dtype("int8"), ValueError,
     r"kv_cache_dtype='int8' is not supported; " + KV_ALLOWED),
    ("kv_dtype_padded_heads", lambda c: padded_num_heads(8, "hopper", "fp4"), ValueError,
     r"kv_cache_dtype='fp4' is not supported; " + KV_ALLOWED),
    ("kv_dtype_memory_account", lambda c: memory_account("private_workspace", 8, 16, kv_cache_dtype="fp16"), ValueError,
     r"kv_cache_dtype='fp16' is not supported; " + KV_ALLOWED),
    ("workspace_dtype_fp32", lambda c: QConcatWorkspace(16, 8, dtype=torch.float32), ValueError,
     r"dtype=torch.float32 is not supported; allowed: torch.bfloat16, torch.float16"),
    ("strategy_unknown", lambda c: memory_account("padded", 8, 16), ValueError,
     r"strategy='padded' is not known; " + STRATEGIES),
    ("strategy_not_runnable", lambda c: make_strategy("kernel_native", num_heads=8, max_num_batched_tokens=4),
     ValueError, r"strategy='kernel_native' cannot be run on tensors; allowed: \[.*'private_workspace'.*\] "
                 r"\('kernel_native'( and '[a-z_0-9]+')* (is|are) modelled only\)"),
    # --- concat_mla_q
    ("concat_rank_ql_nope", lambda c: _concat(c, nope=t_(4, 512, dtype=BF16)), ValueError,
     r"ql_nope must be 3-D \[T, heads, dim\]; got ql_nope.shape=\(4, 512\)"),
    ("concat_rank_out", lambda c: _concat(c, out=t_(4, 64, 576, 1, dtype=BF16)), ValueError,
     r"out must be 3-D \[T, heads, dim\]; got out.shape=\(4, 64, 576, 1\)"),
    ("concat_not_tensor", lambda c: _concat(c, pe=[[0.0] * 64] * 4), ValueError,
     r"q_pe must be a torch.Tensor, got list"),
    ("concat_T_mismatch", lambda c: _concat(c, pe=t_(5, 8, 64, dtype=BF16)), ValueError,
     r"q_pe.shape\[:2\] must equal ql_nope.shape\[:2\]=\(4, 8\); got q_pe.shape=\(5, 8, 64\)"),
    ("concat_H_mismatch", lambda c: _concat(c, pe=t_(4, 7, 64, dtype=BF16)), ValueError,
     r"q_pe.shape\[:2\] must equal ql_nope.shape\[:2\]=\(4, 8\); got q_pe.shape=\(4, 7, 64\)"),
    ("concat_out_T_mismatch", lambda c: _concat(c, out=torch.empty(3, 64, 576, dtype=BF16)), ValueError,
     r"out.shape\[0\] must equal T=4 \(ql_nope.shape\[0\]\); got out.shape=\(3, 64, 576\)"),
    ("concat_out_too_few_heads", lambda c: _concat(c, Hp=4), ValueError,
     r"out.shape\[1\] \(padded heads\) must be >= H=8; got out.shape=\(4, 4, 576\)"),
    ("concat_nope_dim_256", lambda c: _concat(c, nope=t_(4, 8, 256, dtype=BF16)), ValueError,
     r"ql_nope.shape\[-1\] must be 512; got ql_nope.shape=\(4, 8, 256\)"),
    ("concat_pe_dim_32", lambda c: _concat(c, pe=t_(4, 8, 32, dtype=BF16)), ValueError,
     r"q_pe.shape\[-1\] must be 64; got q_pe.shape=\(4, 8, 32\)"),
    ("concat_out_dim_512", lambda c: _concat(c, out=torch.empty(4, 64, 512, dtype=BF16)), ValueError,
     r"out.shape\[-1\] must be 576; got out.shape=\(4, 64, 512\)"),
    ("concat_dtype_fp32", lambda c: _concat(c, dtype=torch.float32), ValueError,
     r"ql_nope.dtype must be one of \[torch.float16, torch.bfloat16\]; got torch.float32"),
    ("concat_dtype_mixed", lambda c: _concat(c, pe=t_(4, 8, 64, dtype=torch.float16)), ValueError,
     r"ql_nope, q_pe and out must share one dtype; got ql_nope.dtype=torch.bfloat16, q_pe.dtype=torch.float16, "
     r"out.dtype=torch.bfloat16"),
    ("concat_noncontig_last_dim", lambda c: _concat(c, nope=t_(4, 8, 1024, dtype=BF16)[..., ::2]), ValueError,
     r"ql_nope's last dim must be contiguous \(stride 1\); got ql_nope.stride\(\)=\(8192, 1024, 2\)"),
    ("concat_noncontig_out", lambda c: _concat(c, out=torch.empty(4, 576, 64, dtype=BF16).transpose(1, 2)),
     ValueError, r"out's last dim must be contiguous \(stride 1\); got out.stride\(\)=\(36864, 1, 64\)"),
    ("concat_device_meta", lambda c: _concat(c, out=torch.empty(4, 64, 576, dtype=BF16, device="meta")), ValueError,
     r"ql_nope, q_pe and out must be on one device; got ql_nope.device=cpu, q_pe.device=cpu, out.device=meta"),
    ("concat_backend_unknown", lambda c: _concat(c, backend="cuda"), ValueError,
     r"backend='cuda' is not known; allowed: \['auto', 'torch', 'triton'\]"),
    # --- sparse_mla_prefill (checks for every backend)
    ("prefill_indices_int64",
     lambda c: _prefill(indices=torch.zeros(4, 1, 128, dtype=torch.int64)), ValueError,
     r"indices.dtype must be torch.int32; got torch.int64"),
    ("prefill_indices_tokens_mismatch",
     lambda c: _prefill(indices=torch.zeros(5, 1, 128, dtype=torch.int32)), ValueError,
     r"indices.shape\[0\] must equal s_q=4 \(q.shape\[0\]\); got indices.shape=\(5, 1, 128\)"),
    ("prefill_indices_hkv", lambda c: _prefill(indices=torch.zeros(4, 2, 128, dtype=torch.int32)), ValueError,
     r"indices.shape\[1\] must be 1 \(h_kv\); got indices.shape=\(4, 2, 128\)"),
    ("prefill_q_rank", lambda c: _prefill(q=t_(4, 576, dtype=BF16)), ValueError,
     r"q must be a 3-D tensor \[s_q, h_q, d_qk\]; got q.shape=\(4, 576\)"),
    ("prefill_kv_dqk_mismatch", lambda c: _prefill(kv=t_(256, 1, 512, dtype=BF16)), ValueError,
     r"kv.shape\[-1\] must equal q.shape\[-1\]=576; got kv.shape=\(256, 1, 512\)"),
    ("prefill_kv_dtype", lambda c: _prefill(kv=t_(256, 1, 576, dtype=torch.float16)), ValueError,
     r"kv.dtype must equal q.dtype=torch.bfloat16; got kv.dtype=torch.float16"),
    ("prefill_d_v_too_big", lambda c: _prefill(d_v=600), ValueError,
     r"d_v must be an int in \[1, d_qk=576\] \(FlashMLA: 512\); got d_v=600"),
    ("prefill_actual_heads", lambda c: _prefill(actual_num_heads=65), ValueError,
     r"actual_num_heads must be an int in \[1, h_q=64\]; got 65"),
    ("prefill_topk_length_dtype", lambda c: _prefill(topk_length=t_(4, dtype=torch.int64)), ValueError,
     r"topk_length.dtype must be torch.int32; got torch.int64"),
    ("prefill_topk_length_shape", lambda c: _prefill(topk_length=t_(5, dtype=torch.int32)), ValueError,
     r"topk_length must be a 1-D tensor \[s_q=4\]; got topk_length.shape=\(5,\)"),
    ("prefill_sm_scale", lambda c: _prefill(sm_scale="0.04"), ValueError,
     r"sm_scale must be a float; got sm_scale='0.04'"),
    ("prefill_device_meta", lambda c: _prefill(kv=torch.empty(256, 1, 576, dtype=BF16, device="meta")), ValueError,
     r"q, kv, indices and topk_length must be on one device; got \{'q': 'cpu', 'kv': 'meta', 'indices': 'cpu'\}"),
    ("prefill_backend_unknown", lambda c: _prefill(backend="cutlass"), ValueError,
     r"backend='cutlass' is not known; allowed: \['auto', 'flash_mla', 'reference'\]"),
    # --- FlashMLA contract (what flash_mla_sparse_fwd accepts), checked on CPU for a given arch capability
    ("flashmla_topk_sm90", lambda c: _contract(SM90, topk=64), ValueError,
     r"topk \(indices.shape\[-1\]\) must be a positive multiple of 128 on sm90; got indices.shape=\(4, 1, 64\)"),
    ("flashmla_topk_sm100", lambda c: _contract(SM100, topk=96), ValueError,
     r"topk \(indices.shape\[-1\]\) must be a positive multiple of 64 on sm100; got indices.shape=\(4, 1, 96\)"),
    ("flashmla_topk_zero", lambda c: _contract(SM100, topk=0), ValueError,
     r"must be a positive multiple of 64 on sm100; got indices.shape=\(4, 1, 0\)"),
    ("flashmla_h_q_8_sm90", lambda c: _contract(SM90, h_q=8), ValueError,
     r"h_q must be one of \(64, 128\) on sm90 \(pad the heads: vLLM prefill_padding\); got q.shape\[1\] \(h_q\)=8"),
    ("flashmla_h_q_192_sm100", lambda c: _contract(SM100, h_q=192), ValueError,
     r"h_q must be one of \(64, 128\) on sm100 .*; got q.shape\[1\] \(h_q\)=192"),
    ("flashmla_d_qk_256", lambda c: _contract(d_qk=256), ValueError,
     r"d_qk \(q.shape\[-1\]\) must be one of \(576, 512\); got q.shape=\(4, 64, 256\)"),
    ("flashmla_d_v_256", lambda c: _contract(d_v=256), ValueError, r"d_v must be one of \(512,\); got d_v=256"),
    ("flashmla_q_fp16", lambda c: _contract(q_dtype=torch.float16), ValueError,
     r"q must be bfloat16; got q.dtype=torch.float16"),
    ("flashmla_indices_int64", lambda c: _contract(idx_dtype=torch.int64), ValueError,
     r"indices must be int32; got indices.dtype=torch.int64"),
    ("flashmla_arch_sm80", lambda c: _contract((8, 0)), ValueError,
     r"the GPU must be sm90 \(Hopper\) or sm100 \(Blackwell\), capability major 9 or 10; "
     r"got arch_capability=\(8, 0\)"),
    # --- config.json
    ("config_missing_file", lambda c: load_model("mymodel", path=c.tmp / "nope" / "config.json"), ValueError,
     r"config.json path='.*/nope/config.json' does not exist"),
    ("config_model_dir_without_json", _unknown_model_dir, ValueError,
     r"model='broken' is not known \(no .*/models/broken/config.json\); allowed: \[\]"),
    ("config_malformed_json", lambda c: _config(c, text='{"num_attention_heads": 64,'), ValueError,
     r"config.json .*/cfg/config.json is not valid JSON: Expecting"),
    ("config_not_object", lambda c: _config(c, text="[64, 78]"), ValueError,
     r"config.json .*/cfg/config.json must hold a JSON object, got list"),
    ("config_missing_field", lambda c: _config(c, drop="kv_lora_rank"), ValueError,
     r"config.json .*/cfg/config.json is missing required field 'kv_lora_rank'"),
    ("config_field_wrong_type", lambda c: _config(c, num_attention_heads="64"), ValueError,
     r"config.json .*: field 'num_attention_heads'='64' must be a positive int"),
    ("config_heads_zero", lambda c: _config(c, num_attention_heads=0), ValueError,
     r"config.json .*: field 'num_attention_heads'=0 must be a positive int"),
    # --- sweep parameters in-process (the completed sweep's store and CSV must survive)
    ("sweep_unknown_key", lambda c: _sweep(c, tp_size=[8]), ValueError,
     r"unknown sweep parameter\(s\) \['tp_size'\]; allowed: \[.*'tp_sizes'.*\]"),
    ("sweep_empty_grid", lambda c: _sweep(c, prompt_lens=[]), ValueError,
     r"prompt_lens=\[\] gives an empty grid; give at least one value"),
    ("sweep_empty_kv_dtypes", lambda c: _sweep(c, kv_cache_dtype=[]), ValueError,
     r"kv_cache_dtype=\[\] must be 'bf16', 'fp8' or a non-empty list of them"),
    ("sweep_wrong_type", lambda c: _sweep(c, tp_sizes=["8"]), ValueError,
     r"tp_sizes holds '8' \(str\); every entry must be int"),
    ("sweep_bool_for_int", lambda c: _sweep(c, max_num_batched_tokens=[True]), ValueError,
     r"max_num_batched_tokens holds True \(bool\); every entry must be int"),
    ("sweep_unknown_model", lambda c: _sweep(c, models=["glm-5", "gpt-2"]), ValueError,
     r"model='gpt-2' is not known .*; " + MODELS),
    ("sweep_unknown_arch", lambda c: validate_params({"archs": ["h200", "mi300"]}), ValueError,
     r"arch='mi300' is not a known GPU architecture; " + ARCHS),
    # --- the CLI in a subprocess: exit code, one-line error, no traceback, nothing run
    ("cli_yaml_unknown_key", lambda c: _cli(c, "models: [glm-5]\ntp_size: [8]\n"), CLIFailed,
     r"^exit 2: mla-lab: error: unknown sweep parameter\(s\) \['tp_size'\]; allowed: \[.*'tp_sizes'.*\]$"),
    ("cli_yaml_wrong_type", lambda c: _cli(c, "num_prompts: '32'\n"), CLIFailed,
     r"^exit 2: mla-lab: error: num_prompts='32' must be a positive int$"),
    ("cli_yaml_empty_grid", lambda c: _cli(c, "models: []\n"), CLIFailed,
     r"^exit 2: mla-lab: error: models=\[\] gives an empty grid; give at least one value$"),
    ("cli_p_wrong_type", lambda c: _cli(c, pairs=[("tp_sizes", "[eight]")]), CLIFailed,
     r"^exit 2: mla-lab: error: tp_sizes holds 'eight' \(str\); every entry must be int$"),
    ("cli_yaml_malformed", lambda c: _cli(c, "models: [glm-5\n"), CLIFailed,
     r"^exit 2: mla-lab: error: -f .*params.yaml: not valid YAML: "),

    # ================================================================ issue 14 ("No stale, no clobbered, no silent")
    # --- workload and sweep values that used to be stored as given or priced as if runnable
    ("sweep_concurrency_over_prompts", lambda c: _sweep(c, concurrency=64), ValueError,
     r"^concurrency=64 exceeds num_prompts=32; allowed: 1\.\.32 or null \(= num_prompts\)$"),
    ("sweep_concurrency_over_prompts_given", lambda c: _sweep(c, num_prompts=8, concurrency=9), ValueError,
     r"^concurrency=9 exceeds num_prompts=8; allowed: 1\.\.8 or null"),
    ("sweep_concurrency_zero", lambda c: _sweep(c, concurrency=0), ValueError,
     r"^concurrency=0 must be a positive int or null$"),
    ("sweep_concurrency_bool", lambda c: _sweep(c, concurrency=True), ValueError,
     r"^concurrency=True must be a positive int or null$"),
    ("sweep_num_prompts_zero", lambda c: _sweep(c, num_prompts=0), ValueError, r"^num_prompts=0 must be a positive int$"),
    ("sweep_num_runs_negative", lambda c: _sweep(c, num_runs=-1), ValueError, r"^num_runs=-1 must be a positive int$"),
    ("sweep_tp_zero", lambda c: _sweep(c, tp_sizes=[0]), ValueError,
     r"^tp_sizes holds 0; every entry must be a positive int$"),
    ("sweep_prompt_len_negative", lambda c: _sweep(c, prompt_lens=[-1024]), ValueError,
     r"^prompt_lens holds -1024; every entry must be a positive int$"),
    ("sweep_mbt_float", lambda c: _sweep(c, max_num_batched_tokens=[16384.0]), ValueError,
     r"^max_num_batched_tokens holds 16384\.0 \(float\); every entry must be int$"),
    ("sweep_models_not_list", lambda c: _sweep(c, models={"glm-5": 1}), ValueError, r"^models=\{'glm-5': 1\} must be a list$"),
    ("sweep_model_empty_name", lambda c: _sweep(c, models=[""]), ValueError, r"^model='' must be a non-empty str; " + MODELS),
    ("sweep_arch_unknown_family", lambda c: _sweep(c, archs=["ampere"]), ValueError,
     r"^arch='ampere' is not a known GPU architecture; " + ARCHS),
    ("sweep_tp_not_dividing_heads", lambda c: check_tp_sizes(validate_params(dict(c.done.params, tp_sizes=[3]))),
     ValueError,
     r"tp=3 does not divide num_attention_heads=64 of model 'glm-5'; allowed tp: \[1, 2, 4, 8, 16, 32, 64\]"),
    ("sweep_tp_over_heads", lambda c: check_tp_sizes(validate_params(dict(c.done.params, tp_sizes=[128]))),
     ValueError,
     r"tp=128 does not divide num_attention_heads=64 of model 'glm-5'"),
    ("sweep_device_cuda_without_gpu", lambda c: _sweep_fresh(c, device="cuda"), ValueError,
     r"^device='cuda' but torch sees no CUDA GPU; allowed here: 'auto' or 'cpu'$", no_cuda_only),
    ("sweep_device_unknown", lambda c: _sweep(c, device="gpu"), ValueError,
     r"^device='gpu' is not allowed; allowed: \['auto', 'cpu', 'cuda'\]$"),
    ("sweep_weight_dtype_unknown", lambda c: _sweep(c, weight_dtype="fp16"), ValueError,
     r"^weight_dtype='fp16' is not allowed; allowed: \['fp8', 'bf16'\]$"),
    ("sweep_moe_parallel_unknown", lambda c: _sweep(c, moe_parallel="dp"), ValueError,
     r"^moe_parallel='dp' is not allowed; allowed: \['ep', 'tp'\]$"),
    ("sweep_strategy_unknown", lambda c: _sweep(c, strategies=["padded"]), ValueError,
     r"strategies holds 'padded'.*allowed: .*'private_workspace'.*'vllm-53878'"),
    ("sweep_strategy_subchunk_zero", lambda c: _sweep(c, strategies=["subchunk:0"]), ValueError,
     r"strategies holds 'subchunk:0'.*allowed: .*'subchunk:<S>'"),
    ("sweep_strategies_empty", lambda c: _sweep(c, strategies=[]), ValueError,
     r"^strategies=\[\] gives an empty grid; give at least one value$"),
    ("sweep_kv_dtype_in_list", lambda c: _sweep(c, kv_cache_dtype=["bf16", "int4"]), ValueError,
     r"^kv_cache_dtype='int4' is not supported; " + KV_ALLOWED),
    ("sweep_store_dir_empty", lambda c: _sweep(c, store_dir=""), ValueError,
     r"^store_dir='' must be a non-empty path string$"),
    ("sweep_report_dir_not_str", lambda c: _sweep(c, report_dir=5), ValueError,
     r"^report_dir=5 must be a non-empty path string$"),
    ("sweep_force_not_bool", lambda c: _sweep(c, force="yes"), ValueError, r"^force='yes' must be true or false$"),
    ("sweep_overwrite_not_bool", lambda c: _sweep(c, overwrite=1), ValueError, r"^overwrite=1 must be true or false$"),
    ("sweep_shared_workspace_negative", lambda c: _sweep(c, shared_workspace_bytes=-1), ValueError,
     r"^shared_workspace_bytes=-1 must be a non-negative int \(bytes\) or null$"),
    ("sweep_executor_unknown", lambda c: _sweep(c, executor="dask"), ValueError,
     r"^executor='dask' is not allowed; allowed: \['local', 'ray'\]$"),
    ("sweep_ray_address_without_ray", lambda c: _sweep(c, ray_address="auto"), ValueError,
     r"^ray_address='auto' is only used with executor='ray' \(executor='local'\)$"),
    # --- output paths: never clobber a file the lab did not write, never leave temp files outside the target folder
    ("data_file_readme", lambda c: _readme_as_data_file(c), ValueError,
     r"^data_file='.*/README\.md' exists and was not written by mla_lab; choose another path or pass --overwrite$"),
    ("data_file_foreign_csv", lambda c: _existing_file_as_data_file(c, "a,b\n1,2\n"), ValueError,
     r"^data_file='.*/theirs\.csv' exists and was not written by mla_lab; choose another path or pass --overwrite$"),
    ("data_file_empty_file", lambda c: _existing_file_as_data_file(c, ""), ValueError,
     r"^data_file='.*/theirs\.csv' exists and was not written by mla_lab"),
    ("data_file_is_tmp", lambda c: _dir_as_data_file(c, "/tmp"), ValueError,
     r"^data_file='/tmp' is a directory; give a file path such as '/tmp/padding_sweep\.csv'$"),
    ("data_file_is_a_folder", lambda c: _dir_as_data_file(c, str(c.tmp)), ValueError,
     r"^data_file='.*' is a directory; give a file path such as '.*/padding_sweep\.csv'$"),
    ("data_file_under_a_file", lambda c: _sweep_fresh(c, data_file=str(_file_under(c) / "rows.csv")), ValueError,
     r"^data_file='.*/afile/rows\.csv': its folder cannot be created \(.*\); choose a writable path$"),
    # --- the CLI, in this process: one line, exit code, nothing run
    ("cmd_timeout_zero", lambda c: _cmd_sweep(c, "--timeout", "0"), CLIFailed,
     r"^exit 2: mla-lab: error: argument --timeout: '0' is out of range; allowed: 1\.\.604,800 \(one week per cell\) "
     r"\(see mla-lab sweep --help\)$"),
    ("cmd_timeout_negative", lambda c: _cmd_sweep(c, "--timeout", "-5"), CLIFailed,
     r"^exit 2: mla-lab: error: argument --timeout: '-5' is out of range; allowed: 1\.\.604,800 "),
    ("cmd_timeout_not_int", lambda c: _cmd_sweep(c, "--timeout", "abc"), CLIFailed,
     r"^exit 2: mla-lab: error: argument --timeout: 'abc' is not an integer; allowed: 1\.\.604,800 \(see mla-lab "
     r"sweep --help\)$"),
    ("cmd_concurrency_over_prompts", lambda c: _cmd_sweep(c, "-p", "concurrency", "64"), CLIFailed,
     r"^exit 2: mla-lab: error: concurrency=64 exceeds num_prompts=32; allowed: 1\.\.32 or null \(= num_prompts\)$"),
    ("cmd_model_unknown", lambda c: _cmd_sweep(c, "-p", "models", "[gpt-2]"), CLIFailed,
     r"^exit 2: mla-lab: error: model='gpt-2' is not known \(no .*\); " + MODELS + "$"),
    ("cmd_p_bad_yaml", lambda c: _cmd_sweep(c, "-p", "tp_sizes", "[8"), CLIFailed,
     r"^exit 2: mla-lab: error: -p tp_sizes '\[8': not a valid YAML value: "),
    ("cmd_f_missing", lambda c: _cmd_sweep(c, "-f", "nope.yaml"), CLIFailed,
     r"^exit 2: mla-lab: error: -f nope\.yaml: no such file; allowed: a YAML file of sweep parameters$"),
    ("cmd_f_not_a_mapping", lambda c: (c.tmp / "list.yaml").write_text("- 1\n- 2\n") and _cmd_sweep(c, "-f", "list.yaml"),
     CLIFailed, r"^exit 2: mla-lab: error: -f list\.yaml: must hold a mapping of parameter names to values, got list$"),
    ("cmd_address_without_ray", lambda c: _cmd_sweep(c, "--address", "auto"), CLIFailed,
     r"^exit 2: mla-lab: error: ray_address='auto' is only used with executor='ray' \(executor='local'\)$"),
    ("cmd_dry_run_bad_tp", lambda c: _cmd_sweep(c, "--dry-run", "-p", "tp_sizes", "[0]"), CLIFailed,
     r"^exit 2: mla-lab: error: tp_sizes entry=0 is out of range; allowed: 1\.\.1,024 \(.+\)$"),
    ("cmd_index_report_dir_is_a_file", lambda c: _cmd(c, "index", "--report-dir", str(_file_under(c))), CLIFailed,
     r"^exit 2: mla-lab: error: --report-dir .*/afile: [^\n]+$"),
    ("cmd_index_report_dir_under_a_file", lambda c: _cmd(c, "index", "--report-dir", str(_file_under(c) / "rep")),
     CLIFailed, r"^exit 2: mla-lab: error: --report-dir .*/afile/rep: [^\n]+$"),
    ("cmd_check_report_missing_page", lambda c: _cmd(c, "check-report", "nope.html"), CLIFailed,
     r"^exit 2: mla-lab: error: check-report nope\.html: no such file; allowed: an HTML report [^\n]+$"),
    ("cmd_unknown_subcommand", lambda c: _cmd(c, "advice"), CLIFailed,
     r"^exit 2: mla-lab: error: argument cmd: invalid choice: 'advice' \(choose from [^\n]*\) \(see mla-lab --help\)$"),
    # --- the CLI in a subprocess, cases that reach the notebook when the CLI does not refuse them itself
    ("cli_report_dir_is_a_file", lambda c: _cli(c, pairs=[("report_dir", str(_file_under(c)))]), CLIFailed,
     r"^exit [12]: mla-lab: error: report_dir='.*/afile'[^\n]*$"),
    ("cli_report_dir_unwritable", lambda c: _cli(c, pairs=[("report_dir", "/proc/mla-lab-reports")]), CLIFailed,
     r"^exit [12]: mla-lab: error: report_dir='/proc/mla-lab-reports'[^\n]*$"),
    ("cli_data_file_readme", lambda c: shutil.copy(REPO / "README.md", c.tmp / "README.md") and _cli(
        c, pairs=[("data_file", "README.md")], fresh=True), CLIFailed,
     r"^exit 2: mla-lab: error: data_file='README\.md' exists and was not written by mla_lab; choose another path "
     r"or pass --overwrite$"),
    ("cli_data_file_is_tmp", lambda c: _cli(c, pairs=[("data_file", "/tmp")], fresh=True), CLIFailed,
     r"^exit 2: mla-lab: error: data_file='/tmp' is a directory; give a file path such as '/tmp/padding_sweep\.csv'$"),
    ("cli_device_cuda_without_gpu", lambda c: _cli(c, pairs=[("device", "cuda")], fresh=True), CLIFailed,
     r"^exit 2: mla-lab: error: device='cuda' but torch sees no CUDA GPU; allowed here: 'auto' or 'cpu'$",
     no_cuda_only),
    ("cli_every_point_failed", lambda c: _cli(c, pairs=[("tp_sizes", "[3]")], fresh=True), CLIFailed,
     r"^exit [12]: [^\n]*(failed|does not divide)[^\n]*$"),
    # --- kernels: clear errors before any torch op
    ("prefill_s_kv_zero", lambda c: _prefill(s_kv=0, indices=torch.zeros(4, 1, 128, dtype=torch.int32)), ValueError,
     r"s_kv.*(must be|>= 1|positive).*got kv\.shape=\(0, 1, 576\)"),
    ("prefill_topk_length_negative",
     lambda c: _prefill(topk_length=torch.tensor([-1, 2, 3, 4], dtype=torch.int32)), ValueError,
     r"topk_length.*\[0, topk=128\].*-1"),
    ("prefill_topk_length_over_topk",
     lambda c: _prefill(topk_length=torch.tensor([129, 2, 3, 4], dtype=torch.int32)), ValueError,
     r"topk_length.*\[0, topk=128\].*129"),
    ("heads_numpy_float", lambda c: padded_num_heads(np.float64(8.0), "hopper"), ValueError,
     r"^num_heads=np\.float64\(8\.0\) must be a positive int$"),
    ("subchunk_rows_zero_memory", lambda c: memory_account("subchunk:0", 8, 16), ValueError,
     r"subchunk rows=0 must be a positive int"),
    ("subchunk_rows_negative_strategy", lambda c: make_strategy("subchunk:-4", num_heads=8, max_num_batched_tokens=16),
     ValueError, r"subchunk rows=-4 must be a positive int"),
    ("memory_account_T_negative", lambda c: memory_account("private_workspace", 8, 16, num_tokens=-1), ValueError,
     r"^num_tokens=-1 must be a non-negative int$"),
    # --- workload and TTFT model
    ("workload_concurrency_over_prompts", lambda c: Workload(1024, 32, 64), ValueError,
     r"concurrency=64 exceeds num_prompts=32"),
    ("workload_num_prompts_zero", lambda c: Workload(1024, 0), ValueError, r"^num_prompts=0 must be a positive int$"),
    ("workload_concurrency_zero", lambda c: Workload(1024, 32, 0), ValueError, r"^concurrency=0 must be a positive int$"),
    ("workload_prompt_len_float", lambda c: Workload(1024.0), ValueError, r"^prompt_len=1024\.0 must be a positive int$"),
    ("workload_prompt_len_str", lambda c: Workload("1024"), ValueError, r"^prompt_len='1024' must be a positive int$"),
    ("ttft_weight_dtype_unknown",
     lambda c: Deployment.seed(weight_dtype="fp4"),
     ValueError, r"^weight_dtype='fp4' is not allowed; allowed: \['bf16', 'fp8'\]$"),
    ("ttft_moe_parallel_unknown",
     lambda c: Deployment.seed(moe_parallel="dp"),
     ValueError, r"^moe_parallel='dp' is not allowed; allowed: \['ep', 'tp'\]$"),
    ("ttft_mbt_zero", lambda c: Deployment.seed(max_num_batched_tokens=0), ValueError,
     r"^max_num_batched_tokens=0 must be a positive int$"),
    ("ttft_strategy_unknown", lambda c: predict_ttft(Deployment.seed(), "padded"), ValueError,
     r"^strategy='padded' is not known; " + STRATEGIES),
    # --- model configs and names
    ("model_empty_name", lambda c: load_model(""), ValueError, r"^model='' must be a non-empty str; " + MODELS),
    ("arch_empty_name", lambda c: get_arch(""), ValueError, r"^arch='' is not a known GPU architecture; " + ARCHS),
    ("config_heads_negative", lambda c: _config(c, num_attention_heads=-64), ValueError,
     r"config.json .*: field 'num_attention_heads'=-64 must be a positive int$"),
    ("config_field_float", lambda c: _config(c, kv_lora_rank=512.0), ValueError,
     r"config.json .*: field 'kv_lora_rank'=512\.0 must be a positive int$"),
    ("config_field_bool", lambda c: _config(c, num_attention_heads=True), ValueError,
     r"config.json .*: field 'num_attention_heads'=True must be a positive int$"),
    ("config_rope_dim_zero", lambda c: _config(c, qk_rope_head_dim=0), ValueError,
     r"config.json .*: field 'qk_rope_head_dim'=0 must be a positive int$"),
    ("config_empty_file", lambda c: _config(c, text=""), ValueError,
     r"config.json .*/cfg/config.json is not valid JSON: Expecting value"),
    ("config_path_is_a_folder", lambda c: load_model("mymodel", path=c.tmp), ValueError,
     r"config.json path='.*' does not exist"),
]


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """A completed 2-point sweep (store + CSV) that no bad call may touch."""
    d = tmp_path_factory.mktemp("done")
    params = dict(models=["glm-5"], tp_sizes=[8], archs=["h200", "b200"], max_num_batched_tokens=[16384],
                  prompt_lens=[1024], strategies=["vllm-53878"], device="cpu", store_dir=str(d / "st"),
                  data_file=str(d / "sweep.csv"), report_dir=str(d / "rep"))
    df = run_sweep(params, progress=False)
    assert df["point_key"].nunique() == 2 and len(df) == 4 and (df["status"] == "ok").all()  # baseline + 53878
    return SimpleNamespace(params=params, dir=d, n_rows=len(df))


def _param(case):
    marks = case[4] if len(case) > 4 else ()
    return pytest.param(*case[:4], id=case[0], marks=marks)


def test_table_is_large_and_ids_unique():
    ids = [c[0] for c in CASES] + [c[0] for c in ACCEPTED]
    assert len(CASES) > 120 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("case_id,fn,exc,pattern", [_param(c) for c in CASES])
def test_bad_input(case_id, fn, exc, pattern, done, tmp_path, monkeypatch):
    ctx = SimpleNamespace(tmp=tmp_path, done=done, mp=monkeypatch, out=None, out_before=None)
    before = _snapshot(done.dir)
    with pytest.raises(exc) as ei:
        fn(ctx)
    msg = str(ei.value)
    assert re.search(pattern, msg, flags=re.DOTALL), f"{case_id}: message {msg!r} does not match {pattern!r}"
    assert "Traceback" not in msg
    # nothing computed is lost: the completed sweep is byte-identical, no report was started
    assert _snapshot(done.dir) == before
    assert not (done.dir / "rep").exists()
    # concat validates before writing: out still holds what it held
    if ctx.out is not None:
        assert torch.equal(ctx.out, ctx.out_before), f"{case_id}: out was written before the error"


# ------------------------------------------------------------------- accepted input: normalised, or reported in rows


def _point(**over) -> dict:
    """The one grid point of a small sweep (GLM-5 TP8 H200, 1024-token prompts, vllm-53878) with ``over``."""
    raw = dict(models=["glm-5"], tp_sizes=[8], archs=["h200"], max_num_batched_tokens=[16384], prompt_lens=[1024],
               strategies=["vllm-53878"], device="cpu")
    raw.update(over)
    (pt,) = expand_grid(validate_params(raw))
    return pt


def _does_not_fit(reason_pattern: str, **over):
    """Every row of the point: fits_in_memory False with a reason matching ``reason_pattern``; capacity never
    negative; the reason one line."""

    def check(ctx):
        rows = modelled_rows(_point(**over))
        assert rows
        for r in rows:
            assert r["kv_capacity_tokens"] >= 0, (r["strategy"], r["kv_capacity_tokens"])
            assert r["fits_in_memory"] is False or r["fits_in_memory"] == False  # noqa: E712 (numpy bool)
            assert re.search(reason_pattern, r["fit_reason"]), r["fit_reason"]
            assert "\n" not in r["fit_reason"]

    return check


def _models_normalised(ctx):
    for spelling in ("GLM-5", "Glm-5", " glm-5 "):
        assert validate_params({"models": [spelling]}).models == ["glm-5"]
    assert validate_params({"models": ["GLM-5", "glm-5"]}).models == ["glm-5"]  # one model, not two
    assert point_key(_point(models=["GLM-5"])) == point_key(_point(models=["glm-5"]))  # measured rows match


def _mixed_case_model_folder(ctx):
    """A folder ``My-MLA-32`` under data/models (a temporary copy of data/) is listed, loads under any spelling and
    sweeps under its folder name."""
    data = ctx.tmp / "data"
    shutil.copytree(REPO / "data" / "models", data / "models")
    if (REPO / "data" / "calibration").is_dir():
        shutil.copytree(REPO / "data" / "calibration", data / "calibration")
    cfg = json.loads((data / "models" / "glm-5" / "config.json").read_text())
    cfg["num_attention_heads"] = 32
    (data / "models" / "My-MLA-32").mkdir()
    (data / "models" / "My-MLA-32" / "config.json").write_text(json.dumps(cfg))
    ctx.mp.setenv("MLA_LAB_DATA", str(data))
    assert "My-MLA-32" in model_names()
    for spelling in ("My-MLA-32", "my-mla-32", "MY-MLA-32"):
        assert load_model(spelling).num_attention_heads == 32
    assert validate_params({"models": ["my-mla-32", "MY-MLA-32"]}).models == ["My-MLA-32"]
    df = _sweep_fresh(ctx, models=["my-mla-32"], tp_sizes=[4])
    # GLM-5's weights at TP4 do not load on an H200: listed as does_not_fit (never priced), under the folder's name
    assert (df["status"].isin(["ok", "does_not_fit"])).all() and set(df["model"]) == {"My-MLA-32"}
    assert set(df["num_heads"]) == {8}


def _numpy_ints(ctx):
    assert QConcatWorkspace(16, np.int64(12)).q_concat_heads == 64
    assert padded_num_heads(np.int64(8), "hopper") == 64 and padded_num_heads(np.int32(8), "blackwell") == 128
    assert memory_account("private_workspace", np.int64(8), np.int64(16384)).persistent_bytes == \
        memory_account("private_workspace", 8, 16384).persistent_bytes
    assert GLM.heads_per_rank(np.int64(8)) == 8


def _overwrite_replaces_a_foreign_file(ctx):
    """data_file=README.md copy with overwrite=True: replaced, as asked (the refusal's way out works)."""
    target = ctx.tmp / "README.md"
    shutil.copy(REPO / "README.md", target)
    df = _sweep_fresh(ctx, data_file=str(target), overwrite=True)
    assert target.read_text().splitlines()[0].split(",") == list(df.columns)
    assert not list(ctx.tmp.glob(".*.tmp")) and not list(ctx.tmp.glob("*.tmp"))  # temp file beside, then moved


def _lab_csv_is_replaced_without_overwrite(ctx):
    first = _sweep_fresh(ctx)
    again = _sweep_fresh(ctx)  # the CSV the lab wrote may be replaced by the lab
    assert len(first) == len(again)


ACCEPTED = [
    ("models_in_capitals_normalised", _models_normalised),
    ("model_folder_mixed_case", _mixed_case_model_folder),
    ("numpy_int_heads_and_tokens", _numpy_ints),
    ("weight_dtype_bf16_does_not_fit", _does_not_fit(r"^weights \(\d+\.\d GiB per rank\) and activations leave no KV "
                                                     r"cache at gpu_memory_utilization 0\.9$", weight_dtype="bf16")),
    ("tp1_does_not_fit", _does_not_fit(r"^weights \(\d+\.\d GiB per rank\)", tp_sizes=[1])),
    ("deepseek_tp1_does_not_fit", _does_not_fit(r"^weights ", models=["deepseek-v3.2"], tp_sizes=[1])),
    # (one prompt: pricing 32 x 10M tokens steps through 19,532 chunks, 10 s on a 2-core CPU)
    ("prompt_len_10M_does_not_fit", _does_not_fit(r"^one prompt of 10000000 tokens exceeds the KV capacity of \d+ "
                                                  r"tokens$", prompt_lens=[10_000_000], num_prompts=1)),
    ("workload_over_kv_capacity", _does_not_fit(r"^the workload needs \d+ KV tokens in flight \(concurrency 256 x "
                                                r"131072\); capacity \d+$", prompt_lens=[131072], num_prompts=256)),
    ("data_file_overwrite_allowed", _overwrite_replaces_a_foreign_file),
    ("data_file_lab_csv_replaced", _lab_csv_is_replaced_without_overwrite),
]


@pytest.mark.parametrize("case_id,fn", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted_input(case_id, fn, done, tmp_path, monkeypatch):
    ctx = SimpleNamespace(tmp=tmp_path, done=done, mp=monkeypatch, out=None, out_before=None)
    before = _snapshot(done.dir)
    fn(ctx)
    assert _snapshot(done.dir) == before
    assert not (done.dir / "rep").exists()


# ------------------------------------------------------------------ documented behaviour of NaN/inf inputs (no error)


def _nan_inputs(T=6, h_q=64, s_kv=64, topk=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, h_q, 576, generator=g).to(BF16)
    kv = torch.randn(s_kv, 1, 576, generator=g).to(BF16)
    idx = torch.randint(1, s_kv, (T, 1, topk), generator=g, dtype=torch.int32)  # row 0 is never a valid index
    return q, kv, idx


def test_nan_in_q_poisons_only_that_token_and_head():
    """Docstring: a NaN in q[i, h] gives NaN out[i, h], lse[i, h] and max_logits[i, h]."""
    q, kv, idx = _nan_inputs()
    q[2, 5, 7] = float("nan")
    out, ml, lse = sparse_mla_prefill(q, kv, idx, 576 ** -0.5, backend="reference")
    assert torch.isnan(out[2, 5]).all() and torch.isnan(lse[2, 5]) and torch.isnan(ml[2, 5])
    mask = torch.ones(out.shape[:2], dtype=torch.bool)
    mask[2, 5] = False
    assert torch.isfinite(out.float()[mask]).all() and torch.isfinite(lse[mask]).all()


def test_nan_kv_row_poisons_tokens_that_validly_reference_it():
    """Docstring: a NaN kv row referenced by a valid index of token i gives NaN out[i, :] (all heads); other tokens
    stay finite."""
    q, kv, idx = _nan_inputs()
    idx[3, 0, 4] = 9
    others = [i for i in range(idx.shape[0]) if not (idx[i] == 9).any()]
    assert others  # some tokens do not read row 9
    kv[9, 0, 100] = float("nan")
    out, ml, lse = sparse_mla_prefill(q, kv, idx, 576 ** -0.5, backend="reference")
    assert torch.isnan(out[3]).all() and torch.isnan(lse[3]).all() and torch.isnan(ml[3]).all()
    assert torch.isfinite(out[others].float()).all() and torch.isfinite(lse[others]).all()


def test_nan_kv_row_behind_invalid_or_masked_indices_is_never_read():
    """Docstring: kv rows that only invalid indices (-1, >= s_kv) or entries past topk_length reference are never
    read, so a NaN there does not leak (tests/ref.py would gather row 0 for invalid entries)."""
    q, kv, idx = _nan_inputs()
    kv[0] = float("nan")  # what tests/ref.py gathers for invalid entries
    idx[1, 0, :5] = -1
    idx[2, 0, :5] = kv.shape[0] + 3
    kv[11] = float("nan")
    idx[idx == 11] = 12
    idx[4, 0, 10] = 11  # the only reference to row 11, past topk_length[4] = 8 below
    topk_length = torch.full((idx.shape[0],), idx.shape[-1], dtype=torch.int32)
    topk_length[4] = 8
    out, ml, lse = sparse_mla_prefill(q, kv, idx, 576 ** -0.5, topk_length=topk_length, backend="reference")
    assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all() and torch.isfinite(ml).all()


def test_inf_logit_gives_inf_lse_and_nan_out():
    """Docstring: an inf logit gives lse = inf and exp(inf - inf) = NaN in out."""
    q, kv, idx = _nan_inputs()
    kv[:, 0, 0] = 1.0  # every key positive in column 0, so q = +inf there gives +inf logits (no 0 * inf)
    q[1, 3, 0] = float("inf")
    out, ml, lse = sparse_mla_prefill(q, kv, idx, 576 ** -0.5, backend="reference")
    assert lse[1, 3] == float("inf") and ml[1, 3] == float("inf")
    assert torch.isnan(out[1, 3]).all()
    assert torch.isfinite(out[0].float()).all() and torch.isfinite(lse[0]).all()


def test_row_without_valid_index_gives_zero_out_and_inf_lse():
    """Docstring: a row with no valid index gives out = 0, lse = +inf, max_logits = -inf (not NaN)."""
    q, kv, idx = _nan_inputs()
    idx[0] = -1
    out, ml, lse = sparse_mla_prefill(q, kv, idx, 576 ** -0.5, backend="reference")
    assert (out[0] == 0).all() and (lse[0] == float("inf")).all() and (ml[0] == float("-inf")).all()
