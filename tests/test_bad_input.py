"""Bad input gives a clear error (issue 6): one table of cases, each asserting the exception type and a message that
names the argument, the value and what is allowed; every case also checks that nothing already computed is lost.

Invariants checked for *every* case (see :func:`test_bad_input`):

- the message matches the case's regex and carries no traceback;
- a completed sweep (store + CSV, built once per module) is byte-for-byte unchanged: a bad call or a refused CLI run
  never touches finished work;
- for concat cases, the ``out`` buffer (filled with random values first) is unchanged: validation happens before
  any write.

Documented non-error behaviour (NaN/inf inputs of the sparse prefill) is asserted in the tests after the table.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mla_lab.arch import get_arch
from mla_lab.buffers import QConcatWorkspace, memory_account, padded_num_heads
from mla_lab.model.ops import attention_path_ops
from mla_lab.model.timing import attention_path_ms
from mla_lab.kernels import concat_mla_q, sparse_mla_prefill
from mla_lab.kernels.flashmla import validate_sparse_prefill_inputs
from mla_lab.models import load_model, models_dir, normalize_kv_cache_dtype
from mla_lab.strategies import make_strategy
from mla_lab.sweep import run_sweep, validate_params
from mla_lab.model.ttft import predict_ttft
from mla_lab.workload import Workload, schedule

REPO = Path(__file__).resolve().parent.parent
BF16 = torch.bfloat16
SM90, SM100 = (9, 0), (10, 0)


class CLIFailed(Exception):
    """Raised by the CLI cases' callables: the command exited non-zero (message = exit code + stderr)."""


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


def _cli(ctx, yaml_text=None, pairs=()):
    """``python -m mla_lab.cli sweep`` in a subprocess against the completed sweep's store; raises CLIFailed with the
    exit code and stderr when it exits non-zero (and fails the test if it exits 0)."""
    args = [sys.executable, "-m", "mla_lab.cli", "sweep"]
    if yaml_text is not None:
        f = ctx.tmp / "params.yaml"
        f.write_text(yaml_text)
        args += ["-f", str(f)]
    for k in ("store_dir", "data_file", "report_dir"):
        args += ["-p", k, ctx.done.params[k]]
    for k, v in pairs:
        args += ["-p", k, v]
    r = subprocess.run(args, cwd=ctx.tmp, capture_output=True, text=True, timeout=300)
    if r.returncode == 0:
        pytest.fail(f"CLI accepted bad parameters: {r.stdout[-500:]}")
    raise CLIFailed(f"exit {r.returncode}: {r.stderr.strip()}")


def _strategy_too_many_tokens():
    s = make_strategy("fused", num_heads=8, max_num_batched_tokens=4)
    T = 5
    return s(torch.zeros(T, 8, 512, dtype=BF16), torch.zeros(T, 8, 64, dtype=BF16),
             torch.zeros(16, 1, 576, dtype=BF16), torch.zeros(T, 1, 128, dtype=torch.int32), 0.1)


ARCHS = r"allowed: \[.*'b200'.*'h200'.*'hopper'.*\]"
KV_ALLOWED = r"allowed: \['auto', 'bf16', 'bfloat16', 'fp8', 'fp8_ds_mla', 'fp8_e4m3'\]"
GLM = load_model("glm-5")
H200 = get_arch("h200")
t_ = torch.zeros

# ---------------------------------------------------------------------------------------------------- the table
# (id, callable(ctx), exception type, message regex). The regex covers the argument, the value and what is allowed.

CASES = [
    # --- model / arch names, TP, heads
    ("model_unknown", lambda c: load_model("gpt-2"), ValueError,
     r"model='gpt-2' is not known \(no .*gpt-2/config.json\); allowed: \['deepseek-v3.2', 'glm-5'\]"),
    ("model_not_str", lambda c: load_model(["glm-5"]), ValueError,
     r"model=\['glm-5'\] must be a non-empty str; allowed: \['deepseek-v3.2', 'glm-5'\]"),
    ("arch_unknown", lambda c: get_arch("v100"), ValueError,
     r"arch='v100' is not a known GPU architecture; " + ARCHS),
    ("arch_not_str", lambda c: get_arch(90), ValueError, r"arch must be a str, got int 90; " + ARCHS),
    ("arch_padding_int", lambda c: padded_num_heads(8, 96), ValueError, r"prefill_padding=96 must be 64 or 128"),
    ("tp_not_dividing_heads", lambda c: GLM.heads_per_rank(3), ValueError,
     r"tp=3 does not divide num_attention_heads=64 of model 'glm-5'; allowed tp: \[1, 2, 4, 8, 16, 32, 64\]"),
    ("tp_not_dividing_deepseek_ttft",
     lambda c: predict_ttft("deepseek-v3.2", 6, "h200", Workload(1024), 16384, "fused"), ValueError,
     r"tp=6 does not divide num_attention_heads=128 of model 'deepseek-v3.2'; allowed tp: \[1, 2, 4, 8, 16, 32, "
     r"64, 128\]"),
    ("tp_zero", lambda c: GLM.heads_per_rank(0), ValueError, r"tp=0 must be a positive int"),
    ("tp_negative", lambda c: GLM.heads_per_rank(-8), ValueError, r"tp=-8 must be a positive int"),
    ("tp_float", lambda c: GLM.heads_per_rank(8.0), ValueError, r"tp=8\.0 must be a positive int"),
    ("heads_zero", lambda c: padded_num_heads(0, "hopper"), ValueError, r"num_heads=0 must be a positive int"),
    ("heads_negative_workspace", lambda c: QConcatWorkspace(16, -1), ValueError,
     r"num_heads=-1 must be a positive int"),
    ("heads_zero_memory_account", lambda c: memory_account("fused", 0, 16384), ValueError,
     r"num_heads=0 must be a positive int"),
    ("strategy_input_heads_mismatch",
     lambda c: make_strategy("fused", num_heads=8, max_num_batched_tokens=4)(
         torch.randn(4, 4, 512).bfloat16(), torch.randn(4, 4, 64).bfloat16(), None, None, 1.0), ValueError,
     r"ql_nope.shape=\(4, 4, 512\) must be \[T, num_heads=8, 512\]"),
    ("costmodel_negative_step", lambda c: attention_path_ms(GLM, 8, H200, "fused", -1), ValueError,
     r"step=-1 must be a non-negative int"),
    ("costmodel_float_step", lambda c: attention_path_ms(GLM, 8, H200, "fused", 1.7), ValueError,
     r"step=1.7 must be a non-negative int"),
    ("costmodel_sum_topk_too_big", lambda c: attention_path_ops(GLM, 8, H200, "fused", 4, 4 * 2048 + 1),
     ValueError, r"sum_topk=8193 exceeds num_tokens \* index_topk = 8192"),
    ("heads_zero_strategy", lambda c: make_strategy("fused", num_heads=0, max_num_batched_tokens=4), ValueError,
     r"num_heads=0 must be a positive int"),
    # --- max_num_batched_tokens and T
    ("mbt_zero_memory_account", lambda c: memory_account("fused", 8, 0), ValueError,
     r"max_num_batched_tokens=0 must be a positive int"),
    ("mbt_negative_workspace", lambda c: QConcatWorkspace(-16, 8), ValueError,
     r"max_num_batched_tokens=-16 must be a positive int"),
    ("mbt_zero_schedule", lambda c: schedule(Workload(1024), 0), ValueError,
     r"max_num_batched_tokens=0 must be a positive int"),
    ("T_over_workspace", lambda c: QConcatWorkspace(16, 8).view(17), ValueError,
     r"num_tokens=17 exceeds the workspace's max_num_batched_tokens=16; allowed: 0\.\.16"),
    ("T_negative_workspace", lambda c: QConcatWorkspace(16, 8).view(-1), ValueError,
     r"num_tokens=-1 must be a non-negative int"),
    ("T_over_memory_account", lambda c: memory_account("unfused", 8, 16, num_tokens=17), ValueError,
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
    ("kv_dtype_memory_account", lambda c: memory_account("fused", 8, 16, kv_cache_dtype="fp16"), ValueError,
     r"kv_cache_dtype='fp16' is not supported; " + KV_ALLOWED),
    ("workspace_dtype_fp32", lambda c: QConcatWorkspace(16, 8, dtype=torch.float32), ValueError,
     r"dtype=torch.float32 is not supported; allowed: torch.bfloat16, torch.float16"),
    ("strategy_unknown", lambda c: memory_account("padded", 8, 16), ValueError,
     r"strategy='padded' is not known; allowed: \['unfused', 'fused', 'kernel_native'\]"),
    ("strategy_not_runnable", lambda c: make_strategy("kernel_native", num_heads=8, max_num_batched_tokens=4),
     ValueError, r"strategy='kernel_native' cannot be run on tensors; allowed: \['unfused', 'fused'\]"),
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
     r"model='gpt-2' is not known .*; allowed: \['deepseek-v3.2', 'glm-5'\]"),
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
     r"^exit 1: mla-lab: error: -f .*params.yaml: not valid YAML: "),
]


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """A completed 2-point sweep (store + CSV) that no bad call may touch."""
    d = tmp_path_factory.mktemp("done")
    params = dict(models=["glm-5"], tp_sizes=[8], archs=["h200", "b200"], max_num_batched_tokens=[16384],
                  prompt_lens=[1024], device="cpu", store_dir=str(d / "st"), data_file=str(d / "sweep.csv"),
                  report_dir=str(d / "rep"))
    df = run_sweep(params, progress=False)
    assert len(df) == 6 and (df["status"] == "ok").all()
    return SimpleNamespace(params=params, dir=d, n_rows=len(df))


def test_table_is_large_and_ids_unique():
    ids = [c[0] for c in CASES]
    assert len(ids) >= 30 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("case_id,fn,exc,pattern", CASES, ids=[c[0] for c in CASES])
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
