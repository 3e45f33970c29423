"""The engines' own compiled kernels: packed from their release wheels (:func:`pack`) into a folder that travels to
a GPU machine, loaded there through a minimal ``vllm`` stub (:func:`load`; vLLM 0.33.0's libraries use only torch's
stable ABI, so they load on the lent H200's torch 2.11.0+cu130), called as vLLM calls them (:func:`engine_calls`:
a new wrapper is one :class:`_Calls` method).

From ``vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl`` (2026-11-01): ``vllm_flash_attn/_vllm_fa3_C.abi3.so`` +
``flash_attn_interface.py`` (FA3 ``flash_attn_varlen_func``, the Hopper default ``FLASH_ATTN_MLA_SPARSE``),
``_C_stable_libtorch.abi3.so`` (``torch.ops._C_cache_ops.concat_mla_q``, the CUDA concat of PR #53878),
``_flashmla_C.abi3.so`` + ``third_party/flashmla/flash_mla_interface.py`` (bundled FlashMLA ``flash_mla_sparse_fwd``:
"SM90 supports 8, 16, 32, 64 or 128 heads"); from ``sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl``
(2026-10-30) ``sglang/kernels/ops/attention/dsa/triton_sparse_mla_prefill.py`` (heads padded to a 16-row tile).
The concat library (92.6 MB) is pruned to its sm_90 / sm_90a fatbin entries (:func:`prune_fatbin`; the kept code,
``ConcatMLAQKernel<bf16, 512>`` among it, byte-identical to the wheel's); ``SOURCES.json`` records the sha256s.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import lzma
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import NamedTuple

import torch

from . import flash_mla_info, make_concat_launcher

__all__ = ["VLLM_FILES", "SGLANG_FILE", "pack", "load", "prune_fatbin", "EngineKernels", "engine_inputs", "engine_calls",
           "backend_names", "gather_kernel", "TOPK"]

VLLM_VERSION = "0.33.0"
SGLANG_VERSION = "0.5.23"
#: GLM-5 / DeepSeek-V3.2 geometry (config.json): kv_lora_rank 512, qk_rope_head_dim 64, index_topk 2048; 576 = head_size.
KV_LORA, ROPE, TOPK, D_QK = 512, 64, 2048, 576
#: (path in the vLLM wheel, compress with xz) for every file the stub needs.
VLLM_FILES = (
    ("vllm/vllm_flash_attn/__init__.py", False),
    ("vllm/vllm_flash_attn/flash_attn_interface.py", False),
    ("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", True),
    ("vllm/_C_stable_libtorch.abi3.so", True),
    ("vllm/_flashmla_C.abi3.so", True),
    ("vllm/third_party/__init__.py", False),
    ("vllm/third_party/flashmla/__init__.py", False),
    ("vllm/third_party/flashmla/flash_mla_interface.py", False),
)
SGLANG_FILE = "sglang/kernels/ops/attention/dsa/triton_sparse_mla_prefill.py"
_CONCAT_FILE = "vllm/_C_stable_libtorch.abi3.so"
_PRUNE = {_CONCAT_FILE}
_FATBIN_MAGIC = 0xBA55ED50


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prune_fatbin(data: bytes, keep_arch: int = 90) -> tuple[bytes, int, int]:
    """Drop the fatbin entries of every arch but ``keep_arch`` (90: sm_90 and sm_90a) from an ELF shared library's
    bytes (kept entries move to the front of their fatbin, ``fatSize`` shrinks): ``(new bytes of the same length,
    entries kept, entries dropped)``.

    Raises:
        ValueError: the file has no ``.nv_fatbin`` section.
    """
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(data)
        f.flush()
        sections = subprocess.run(["readelf", "-S", "--wide", f.name], capture_output=True, text=True).stdout
    off = size = None
    for line in sections.splitlines():
        if ".nv_fatbin" in line:
            parts = line.split("]")[1].split()
            off, size = int(parts[3], 16), int(parts[4], 16)
    if off is None:
        raise ValueError("data has no .nv_fatbin section: not a CUDA library")
    buf = bytearray(data)
    p, end, kept, dropped = off, off + size, 0, 0
    while p < end:
        magic, _ver, hsz, fsz = struct.unpack_from("<IHHQ", buf, p)
        if magic != _FATBIN_MAGIC:
            p += 8
            continue
        q, fend, entries = p + hsz, p + hsz + fsz, []
        while q < fend:
            _kind, _v, ehs, psize = struct.unpack_from("<HHIQ", buf, q)
            if ehs == 0:
                break
            arch = struct.unpack_from("<I", buf, q + 28)[0]
            if arch == keep_arch:
                entries.append(bytes(buf[q:q + ehs + psize]))
                kept += 1
            else:
                dropped += 1
            q += ehs + psize
        new = b"".join(entries)
        buf[p + hsz:fend] = new + bytes(fsz - len(new))
        struct.pack_into("<Q", buf, p + 8, len(new))
        p = fend
    return bytes(buf), kept, dropped


def pack(vllm_wheel: str | Path, sglang_wheel: str | Path, out: str | Path) -> dict:
    """Pack the engines' kernels from their release wheels into a new folder ``out``; returns the ``SOURCES.json``
    dict (wheel names and sha256s, each file's original sha256, what was pruned).

    Raises:
        FileExistsError: ``out`` exists; KeyError: a file is missing from a wheel.
    """
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"out={out} exists: pack writes a new folder only")
    out.mkdir(parents=True)
    src = {"vllm_wheel": Path(vllm_wheel).name, "vllm_wheel_sha256": _sha256(Path(vllm_wheel).read_bytes()),
           "sglang_wheel": Path(sglang_wheel).name, "sglang_wheel_sha256": _sha256(Path(sglang_wheel).read_bytes()),
           "files": {}}
    (out / "vllm").mkdir()
    (out / "vllm" / "__init__.py").write_text('"""Stub: only the kernels mla_lab times (mla_lab.kernels.engine_libs)."""\n')
    with zipfile.ZipFile(vllm_wheel) as z:
        for name, compress in VLLM_FILES:
            data = z.read(name)
            rec = {"sha256": _sha256(data), "bytes": len(data)}
            if name in _PRUNE:
                data, kept, dropped = prune_fatbin(data)
                rec.update(pruned_to="sm_90/sm_90a", fatbin_entries_kept=kept, fatbin_entries_dropped=dropped,
                           pruned_sha256=_sha256(data))
            dst = out / (name + ".xz" if compress else name)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(lzma.compress(data, preset=6) if compress else data)
            src["files"][name] = rec
    with zipfile.ZipFile(sglang_wheel) as z:
        data = z.read(SGLANG_FILE)
        (out / "sglang_triton_sparse_mla_prefill.py").write_bytes(data)
        src["files"][SGLANG_FILE] = {"sha256": _sha256(data), "bytes": len(data)}
    (out / "SOURCES.json").write_text(json.dumps(src, indent=1))
    return src


class EngineKernels(NamedTuple):
    """Handles to the loaded engine kernels (:func:`load`): ``fa3_varlen`` (``flash_attn_varlen_func``, called with
    ``fa_version=3``), ``concat_mla_q`` (``(ql_nope [T,H,512], q_pe [T,H,64], q_out [T,H,576])``; None when not
    loaded), ``flashmla_sparse_fwd`` (``(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, out)`` -> ``(out
    [s_q,h_q,512] bf16, max_logits, lse)``), ``sglang_sparse_mla_prefill`` (``(q, kv, indices, sm_scale, d_v, *,
    topk_length=None, out=None)`` or None), ``sources`` (``SOURCES.json``), ``versions``."""

    fa3_varlen: object
    concat_mla_q: object
    flashmla_sparse_fwd: object
    sglang_sparse_mla_prefill: object
    sources: dict
    versions: dict = {"vllm": VLLM_VERSION, "sglang": SGLANG_VERSION}


def _import(what: str, module: str):
    try:
        return importlib.import_module(module)
    except Exception as e:
        raise RuntimeError(f"{what} failed to load: {type(e).__name__}: {e}") from e


def _concat_op(root: Path, need_concat: bool):
    """``torch.ops._C_cache_ops.concat_mla_q`` from the packed library, or None when it is not needed and not
    there."""
    lib = root / _CONCAT_FILE
    if not (need_concat or lib.exists()):
        return None
    try:
        torch.ops.load_library(str(lib))
        return torch.ops._C_cache_ops.concat_mla_q
    except Exception as e:
        raise RuntimeError(f"vLLM _C_stable_libtorch (concat_mla_q) failed to load: {type(e).__name__}: {e}") from e


def load(root: str | Path, need_concat: bool = True) -> EngineKernels:
    """Load the packed kernels of ``root`` (a :func:`pack` folder; ``*.xz`` unpacked beside themselves, ``root`` first
    on ``sys.path`` for the ``vllm`` stub). ``need_concat=False``: a folder without the concat library (16 of the 29
    MB a device call carries) loads with ``concat_mla_q = None``.

    Raises:
        FileNotFoundError: ``root`` lacks a packed file; RuntimeError: a library failed to load (its name and why).
    """
    root = Path(root).resolve()
    for name, compress in VLLM_FILES:
        if (need_concat or name != _CONCAT_FILE) and not (root / (name + (".xz" if compress else ""))).exists() \
                and not (root / name).exists():
            raise FileNotFoundError(f"root={root} lacks {name}: pack it with mla_lab.kernels.engine_libs.pack")
    for xz in root.rglob("*.xz"):
        if not xz.with_suffix("").exists():
            xz.with_suffix("").write_bytes(lzma.decompress(xz.read_bytes()))
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    for mod in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[mod]
    fa = _import("vLLM FA3 library", "vllm.vllm_flash_attn.flash_attn_interface")
    if not getattr(fa, "FA3_AVAILABLE", False):
        raise RuntimeError(f"vLLM FA3 library failed to load: {getattr(fa, 'FA3_UNAVAILABLE_REASON', '?')}")
    concat = _concat_op(root, need_concat)
    fm = _import("vLLM _flashmla_C", "vllm.third_party.flashmla.flash_mla_interface")
    sources = json.loads((root / "SOURCES.json").read_text()) if (root / "SOURCES.json").exists() else {}
    sg, path = None, root / "sglang_triton_sparse_mla_prefill.py"  # SGLang's Triton sparse_mla_prefill, if packed
    if path.exists():
        spec = importlib.util.spec_from_file_location("sglang_triton_sparse_mla_prefill", path)
        spec.loader.exec_module(mod := importlib.util.module_from_spec(spec))
        sg = mod.sparse_mla_prefill
    return EngineKernels(fa.flash_attn_varlen_func, concat, fm.flash_mla_sparse_fwd, sg, sources)


def backend_names(ek: EngineKernels) -> dict:
    """Kernel family -> the library and version that runs it (the ``kernel_backend`` column)."""
    v, s = ek.versions["vllm"], ek.versions["sglang"]
    fi = flash_mla_info()
    ts = f"{fi.get('provider')}=={fi.get('version')}" if fi.get("available") else "none"
    return {"fa3": f"vllm-{v} _vllm_fa3_C (FA3)", "flashmla_vllm": f"vllm-{v} _flashmla_C (FlashMLA)",
            "flashmla_ts": f"{ts} (FlashMLA)", "sglang": f"sglang-{s} triton_sparse_mla_prefill",
            "concat_vllm": f"vllm-{v} _C_stable_libtorch concat_mla_q (CUDA)", "lab": "mla_lab triton",
            "torch": "torch copy_"}


def gather_kernel():
    """A Triton gather floor: each token's valid top-k rows streamed through registers, fp32 adds only (no MMA)."""
    import triton
    import triton.language as tl

    @triton.jit
    def gather_sum(kv, idx, tlen, out, topk, REPS: tl.constexpr, BN: tl.constexpr):
        # one program per (token, rep): stream the token's valid top-k rows (512 + 64 bf16 each) through registers,
        # elementwise fp32 adds only (no reduction inside the loop, no MMA), one [576] row written at the end
        pid = tl.program_id(0)
        t = pid // REPS
        n = tl.load(tlen + t)
        ca = tl.arange(0, 512)
        cb = tl.arange(0, 64)
        acc_a = tl.zeros([BN, 512], dtype=tl.float32)
        acc_b = tl.zeros([BN, 64], dtype=tl.float32)
        for k0 in range(0, n, BN):
            r = k0 + tl.arange(0, BN)
            m = r < n
            i = tl.load(idx + t.to(tl.int64) * topk + r, mask=m, other=0).to(tl.int64)
            acc_a += tl.load(kv + i[:, None] * 576 + ca[None, :], mask=m[:, None], other=0.0).to(tl.float32)
            acc_b += tl.load(kv + i[:, None] * 576 + 512 + cb[None, :], mask=m[:, None], other=0.0).to(tl.float32)
        o = out + pid.to(tl.int64) * 576
        tl.store(o + ca, tl.sum(acc_a, axis=0))
        tl.store(o + 512 + cb, tl.sum(acc_b, axis=0))

    return gather_sum


def engine_inputs(T: int, H: int, kind: str, seed: int, ctx_len: int | None = None):
    """``(ql_nope [T,H,512] head-major strides, q_pe [T,H,64] strided, kv [s_kv,1,576], idx [T,topk] int32, tl [T]
    int32)`` bf16 on CUDA for ``kind`` ``seed`` (1024-token causal prompts, request r's keys at r * 1024), ``full_topk``
    (2048 random keys each) or ``decode`` (one token per request of ``ctx_len`` keys)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    ql_nope = torch.randn(H, T, KV_LORA, device=dev, dtype=torch.bfloat16, generator=g).transpose(0, 1)
    q_pe = torch.randn(T, H, 192 + ROPE, device=dev, dtype=torch.bfloat16, generator=g)[..., 192:]
    if kind == "seed":
        n_prompts, L = T // 1024, 1024
        s_kv = max(n_prompts * L, TOPK)
        pos = torch.arange(T, device=dev) % L
        base = (torch.arange(T, device=dev) // L) * L
        visible = pos + 1
        r = torch.rand(T, TOPK, device=dev, generator=g)
        idx = base[:, None] + (r * visible[:, None]).long()
        tlen = torch.clamp(visible, max=TOPK)
    elif kind == "full_topk":
        s_kv = T
        idx = torch.randint(0, s_kv, (T, TOPK), device=dev, generator=g)
        tlen = torch.full((T,), TOPK, device=dev)
    else:  # decode: T = B tokens, request j owns keys [j*ctx_len, (j+1)*ctx_len)
        s_kv = T * ctx_len
        n = min(ctx_len, TOPK)
        base = torch.arange(T, device=dev)[:, None] * ctx_len
        idx = base + torch.stack([torch.randperm(ctx_len, device=dev, generator=g)[:TOPK] for _ in range(T)])
        if n < TOPK:
            idx = torch.cat([idx, torch.full((T, TOPK - n), -1, device=dev, dtype=idx.dtype)], 1)
        tlen = torch.full((T,), n, device=dev)
    kv = torch.randn(s_kv, 1, D_QK, device=dev, dtype=torch.bfloat16, generator=g)
    return ql_nope, q_pe, kv, idx.to(torch.int32).contiguous(), tlen.to(torch.int32)


class _Calls:
    """One set of inputs and the tensors the engines' calls share; one method per kernel family, each adding
    ``{kernel name: (callable, h_q, num_splits, bytes or None)}`` entries (a new wrapper: one method here)."""

    def __init__(self, ek, ts_fwd, ql_nope, q_pe, kv, idx, tlen, H, sm_scale, q):
        T = ql_nope.shape[0]
        self.ek, self.ts_fwd, self.ql_nope, self.q_pe, self.kv, self.idx, self.tlen, self.H, self.sm = (
            ek, ts_fwd, ql_nope, q_pe, kv, idx, tlen, H, sm_scale)
        self.T, self.out = T, {}
        if q is None:
            q = torch.empty(T, H, D_QK, device="cuda", dtype=torch.bfloat16)
            ek.concat_mla_q(ql_nope, q_pe, q)
        self.q, self.idx3 = q, idx.view(T, 1, TOPK)
        self.q64 = torch.zeros(T, 64, D_QK, device="cuda", dtype=torch.bfloat16)
        self.q64[:, :H] = q
        if H < 64:  # stale, as vLLM 0.33.0's shared workspace
            self.q64[:, H:] = torch.randn_like(self.q64[:, H:])

    def fa3(self, num_splits) -> None:
        """vLLM's FA3 call (``flashattn_mla_sparse.py:215-259``): the latent cache as page-size-1 blocks, the top-k
        indices as the block table; ``num_splits`` 0 (the kernel's heuristic) or 1 (split-KV off)."""
        rows, q_rope, q_nope = self.kv.view(-1, D_QK), self.q[..., KV_LORA:], self.q[..., :KV_LORA]
        k_cache, v_cache = rows[:, KV_LORA:].unsqueeze(1).unsqueeze(1), rows[:, :KV_LORA].unsqueeze(1).unsqueeze(1)
        cu = torch.arange(self.T + 1, device="cuda", dtype=torch.int32)
        for ns in num_splits:
            self.out[f"fa3_sparse@{ns}"] = (lambda ns=ns: self.ek.fa3_varlen(
                q=q_rope, k=k_cache, v=v_cache, q_v=q_nope, max_seqlen_q=1, cu_seqlens_q=cu,
                max_seqlen_k=TOPK, seqused_k=self.tlen, block_table=self.idx, softmax_scale=self.sm, causal=True,
                num_splits=ns, fa_version=3), self.H, ns, None)

    def _flashmla(self, name, fwd, q, h_q, ts: bool) -> None:
        call = ((lambda: fwd(q, self.kv, self.idx3, self.sm, 512, topk_length=self.tlen)) if ts
                else (lambda: fwd(q, self.kv, self.idx3, self.sm, 512, None, self.tlen)))
        self.out[name] = (call, h_q, None, None)

    def flashmla_vllm(self, num_splits) -> None:
        """vLLM's bundled FlashMLA on Q padded to 64 heads (``prefill_padding``) and, below 64, at ``h_q = H``."""
        self._flashmla("flashmla_vllm_pad64", self.ek.flashmla_sparse_fwd, self.q64, 64, False)
        if self.H < 64:
            self._flashmla("flashmla_vllm_native", self.ek.flashmla_sparse_fwd, self.q, self.H, False)

    def content(self, num_splits) -> None:
        """The padded FlashMLA kernels with zeros in the padded heads (the PR's never-written workspace)."""
        if self.H >= 64:
            return
        q64z = torch.zeros_like(self.q64)
        q64z[:, :self.H] = self.q
        self._flashmla("flashmla_vllm_pad64_zeros", self.ek.flashmla_sparse_fwd, q64z, 64, False)
        if self.ts_fwd is not None:
            self._flashmla("flashmla_ts_pad64_zeros", self.ts_fwd, q64z, 64, True)

    def flashmla_ts(self, num_splits) -> None:
        """tokenspeed-flashmla (the lab's FlashMLA build) at 64 padded heads, and at 128 (two CTAs per token)."""
        if self.ts_fwd is None:
            return
        self._flashmla("flashmla_ts_pad64", self.ts_fwd, self.q64, 64, True)
        if self.H == 64:
            self._flashmla("flashmla_ts_h128", self.ts_fwd, torch.cat([self.q64, self.q64], 1), 128, True)

    def sglang(self, num_splits) -> None:
        """SGLang's Triton ``sparse_mla_prefill`` (heads padded to a 16-row tile inside)."""
        fwd = self.ek.sglang_sparse_mla_prefill
        if fwd is not None:
            self.out["sglang_triton"] = (lambda: fwd(self.q, self.kv, self.idx, self.sm, 512, topk_length=self.tlen),
                                         self.H, None, None)

    def gather(self, num_splits) -> None:
        """The gather floor (:func:`gather_kernel`): one and two programs per token (h_q 64 and 128)."""
        gk, rows = gather_kernel(), self.kv.view(-1, D_QK)
        for reps, name in ((1, "gather_only"), (2, "gather_only_x2")):
            g_out = torch.empty(self.T * reps, D_QK, device="cuda", dtype=torch.float32)
            self.out[name] = (lambda reps=reps, g_out=g_out: gk[(self.T * reps,)](
                rows, self.idx, self.tlen, g_out, TOPK, REPS=reps, BN=16, num_warps=4), 64 * reps, None, None)

    def concat(self, num_splits, with_path: bool = False) -> None:
        """vLLM's CUDA ``concat_mla_q`` into the padded workspace and into ``[T, H, 576]``, the lab's Triton concat,
        a copy of the same bytes; ``with_path``: the PR's concat + FlashMLA pad64 (``path_pr53878``)."""
        T, H, ek, ql, pe = self.T, self.H, self.ek, self.ql_nope, self.q_pe
        ws = torch.zeros(T, 64, D_QK, device="cuda", dtype=torch.bfloat16)  # the PR's workspace: never written
        un = torch.empty(T, H, D_QK, device="cuda", dtype=torch.bfloat16)
        nbytes = 2 * T * H * D_QK * 2
        src = torch.empty(nbytes // 4, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        self.out.update({"concat_vllm_padded": (lambda: ek.concat_mla_q(ql, pe, ws[:, :H]), 64, None, nbytes),
                         "concat_vllm_unpadded": (lambda: ek.concat_mla_q(ql, pe, un), H, None, nbytes),
                         "concat_lab_padded": (make_concat_launcher(ql, pe, ws[:, :H]), 64, None, nbytes),
                         "copy_same_bytes": (lambda: dst.copy_(src), H, None, nbytes)})
        if with_path:
            def pr_path():
                ek.concat_mla_q(ql, pe, ws[:, :H])
                return ek.flashmla_sparse_fwd(ws, self.kv, self.idx3, self.sm, 512, None, self.tlen)
            self.out["path_pr53878"] = (pr_path, 64, None, None)


#: The kernel families of :func:`engine_calls`, in the order their calls are listed (and timed).
FAMILIES = ("fa3", "flashmla_vllm", "content", "flashmla_ts", "sglang", "gather", "concat")


def engine_calls(ek: EngineKernels, ts_fwd, ql_nope, q_pe, kv, idx, tlen, H: int, sm_scale: float, which,
                 num_splits=(0,), q=None):
    """The engines' kernels as argument-free calls on one set of inputs (:func:`engine_inputs`): ``({kernel name:
    (callable, h_q, num_splits, bytes or None)}, q [T,H,576])`` for the families in ``which`` (:data:`FAMILIES`;
    ``ts_fwd``: tokenspeed's ``flash_mla_sparse_fwd`` or None); ``q`` given: used as it is (no concat)."""
    calls = _Calls(ek, ts_fwd, ql_nope, q_pe, kv, idx, tlen, H, sm_scale, q)
    for family in (f for f in FAMILIES if f in which):
        getattr(calls, family)(num_splits, **({"with_path": "flashmla_vllm" in which} if family == "concat" else {}))
    return calls.out, calls.q


def main(argv=None) -> int:
    """``python -m mla_lab.kernels.engine_libs pack VLLM_WHEEL SGLANG_WHEEL OUT`` (what travels to the GPU)."""
    ap = argparse.ArgumentParser(prog="python -m mla_lab.kernels.engine_libs")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="pack the engines' kernels from their wheels into a new folder")
    for name in ("vllm_wheel", "sglang_wheel", "out"):
        p.add_argument(name)
    a = ap.parse_args(argv)
    for arg in ("vllm_wheel", "sglang_wheel"):
        if not Path(getattr(a, arg)).is_file():
            ap.error(f"{arg}={getattr(a, arg)} is not a file: give the release wheel (pip download --no-deps)")
    try:
        src = pack(a.vllm_wheel, a.sglang_wheel, a.out)
    except FileExistsError as e:
        ap.error(str(e))
    size = sum(f.stat().st_size for f in Path(a.out).rglob("*") if f.is_file())
    print(f"packed {len(src['files'])} files into {a.out} ({size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
