"""engine_kernels with two additions for the June-2026 FlashMLA build (issue 37): ERA=1 drops the h_q = H call that
build refuses ("Unsupported h_q: 8"); every root gets ``flashmla_vllm_path_june``: vLLM 0.24.0's FLASHMLA_SPARSE bf16
forward_mqa as written (flashmla_sparse.py:857-868, 821-855 in the 0.24.0 wheel): concat_mla_q into the Q buffer,
``new_empty((T, 64, 576))`` + copy of the real heads, flash_mla_sparse_fwd, slice of the real heads."""
import os
import sys

import torch

import mla_lab.measure.engine_kernels as E

_orig = E._kernels


def _patched(ek, ts_fwd, ql_nope, q_pe, kv, idx, tlen, H, sm_scale, which, num_splits=(0,), q=None):
    out, q2 = _orig(ek, ts_fwd, ql_nope, q_pe, kv, idx, tlen, H, sm_scale, which, num_splits, q)
    if os.environ.get("ERA") == "1":
        out.pop("flashmla_vllm_native", None)
    if "flashmla_vllm" in which and "fa3" in which and H < 64 and ek.concat_mla_q is not None:
        T = ql_nope.shape[0]
        buf = torch.empty(T, H, E.D_QK, device="cuda", dtype=torch.bfloat16)
        idx3 = idx.view(T, 1, E.TOPK)

        def june_path():
            ek.concat_mla_q(ql_nope, q_pe, buf)
            qp = buf.new_empty((T, 64, E.D_QK))
            qp[:, :H, :] = buf
            return ek.flashmla_sparse_fwd(qp, kv, idx3, sm_scale, 512, None, tlen)[0][:, :H, :]

        out["flashmla_vllm_path_june"] = (june_path, 64, None, None)
    return out, q2


E._kernels = _patched
if __name__ == "__main__":
    sys.exit(E.main())
