"""The union builder as a CUDA C++ kernel with a shared-memory bitmap (``build_union(..., variant="cuda")``).

Why a second kernel: the Triton kernel (:mod:`.union`) keeps its per-key fields in global memory, so every entry
costs an L2 atomic and an L2 load; on the lent H200 it took 0.98 ms for 16384 x 2048 entries (the lead's GPU call
of 2026-12-04, ``H200_PACKED_COST.build_entry`` in :mod:`.packed`), about the packed attention kernel's own time.
Triton exposes no shared-memory atomics, so the on-chip version is CUDA C++, compiled at first use with NVRTC
through ``torch.cuda._compile_kernel`` (a private torch API, present in torch >= 2.9; the same wheel that runs the
lab's GPU path ships NVRTC). No CPU path: it is tested on the GPU against :func:`.union.build_union_ref`.

One CTA (``block`` threads, default 512) per group; the key range in tiles of ``tile_keys`` keys whose fields live
in shared memory (16-bit fields, two per word, for g <= 8: 32768 keys = 64 KiB; 32-bit fields for g = 16: 16384
keys = 64 KiB; so three CTAs fit an H200 SM's 227 KiB). Per group: count each present token's valid keys (a warp
per token; a token with none turns the shared list off); per tile: zero the fields, ``atomicOr`` bit ``j`` for
every valid entry of token ``j`` in the tile, barrier, re-read each entry's field, the lowest-bit token's entries
``atomicOr`` the claim bit (the first claimer keeps the key: duplicates within a token drop out), classify shared /
rest, and append with warp-aggregated ``atomicAdd`` on two shared counters; then the lengths and the ``-1`` padding
to the next multiple of 64. Order inside a list: arbitrary (the order the warps reach the counters).

Predicted (not measured): the indices are read once from HBM (134 MB at T 16384 x topk 2048: about 30 us at
4.5 TB/s) and the per-entry work is shared-memory atomics and loads, so tens of microseconds at s_kv <= 32768; each
further tile re-reads the group's entries (from L1/L2), so s_kv = 131072 costs about 4 such passes.
"""

from __future__ import annotations

import torch

__all__ = ["build_union_cuda", "CUDA_SOURCE", "DEFAULT_BLOCK", "SMEM_TILE_BYTES"]

#: Threads per CTA.
DEFAULT_BLOCK = 512
#: Shared memory per CTA for the field tile (64 KiB: three CTAs per H200 SM; sm90 allows 227 KiB per block).
SMEM_TILE_BYTES = 64 * 1024

CUDA_SOURCE = r"""
extern "C" __global__ void union_build_smem(
    const int* __restrict__ idx, const int* __restrict__ tlen, int has_len,
    int T, int topk, int stride_t, int s_kv, int g, int tile_keys, int n_tiles, int cap_s, int cap_r,
    int* __restrict__ sh_idx, int* __restrict__ sh_len, int* __restrict__ rs_idx, void* __restrict__ rs_mask,
    int mask_bytes, int* __restrict__ rs_len, int* __restrict__ un_len)
{
    extern __shared__ unsigned int fields[];
    __shared__ int cnt_sh, cnt_rs, n_empty;
    const int q = blockIdx.x;
    const int t0 = q * g;
    const int n_present = min(T - t0, g);
    const bool wide = g > 8;                       // 32-bit fields (g = 16), else 16-bit, two per word
    const unsigned int claim = 1u << g;            // the claim bit, above the g membership bits
    const unsigned int memb = claim - 1u;
    const unsigned int full_bits = (1u << n_present) - 1u;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const long long row_s = (long long)q * cap_s, row_r = (long long)q * cap_r;
    if (threadIdx.x == 0) { cnt_sh = 0; cnt_rs = 0; n_empty = 0; }
    __syncthreads();
    // a present token with no valid key turns the shared list off (a warp per token)
    for (int j = warp; j < n_present; j += n_warps) {
        const int t = t0 + j;
        const int lim = has_len ? min(topk, tlen[t]) : topk;
        const int* row = idx + (long long)t * stride_t;
        int c = 0;
        for (int i = lane; i < lim; i += 32) {
            const int k = __ldg(row + i);
            c += (k >= 0 && k < s_kv) ? 1 : 0;
        }
        for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
        if (lane == 0 && c == 0) atomicAdd(&n_empty, 1);
    }
    const int words = wide ? tile_keys : (tile_keys + 1) / 2;
    for (int tile = 0; tile < n_tiles; ++tile) {
        const int base = tile * tile_keys;
        for (int w = threadIdx.x; w < words; w += blockDim.x) fields[w] = 0u;
        __syncthreads();
        for (int j = 0; j < n_present; ++j) {          // phase 1: mark
            const int t = t0 + j;
            const int lim = has_len ? min(topk, tlen[t]) : topk;
            const int* row = idx + (long long)t * stride_t;
            for (int i = threadIdx.x; i < lim; i += blockDim.x) {
                const int k = __ldg(row + i);
                const int kl = k - base;
                if (k >= 0 && k < s_kv && kl >= 0 && kl < tile_keys) {
                    if (wide) atomicOr(&fields[kl], 1u << j);
                    else atomicOr(&fields[kl >> 1], (1u << j) << ((kl & 1) * 16));
                }
            }
        }
        __syncthreads();
        const bool no_empty = n_empty == 0;
        for (int j = 0; j < n_present; ++j) {          // phase 2: own, classify, append
            const int t = t0 + j;
            const int lim = has_len ? min(topk, tlen[t]) : topk;
            const int* row = idx + (long long)t * stride_t;
            for (int i0 = 0; i0 < lim; i0 += blockDim.x) {   // the same trip count for every thread (ballots)
                const int i = i0 + threadIdx.x;
                const int k = i < lim ? __ldg(row + i) : -1;
                const int kl = k - base;
                bool keep = false;
                unsigned int m = 0u;
                if (k >= 0 && k < s_kv && kl >= 0 && kl < tile_keys) {
                    const int sh = wide ? 0 : (kl & 1) * 16;
                    unsigned int* wp = wide ? &fields[kl] : &fields[kl >> 1];
                    m = (*((volatile unsigned int*)wp) >> sh) & memb;
                    if ((m & ((1u << j) - 1u)) == 0u) {
                        const unsigned int old = atomicOr(wp, claim << sh);
                        keep = ((old >> sh) & claim) == 0u;
                    }
                }
                const bool to_sh = keep && no_empty && m == full_bits;
                const bool to_rs = keep && !to_sh;
                const unsigned int below = (1u << lane) - 1u;
                const unsigned int b_sh = __ballot_sync(0xffffffffu, to_sh);
                const unsigned int b_rs = __ballot_sync(0xffffffffu, to_rs);
                int p_sh = 0, p_rs = 0;
                if (lane == 0) {
                    if (b_sh) p_sh = atomicAdd(&cnt_sh, __popc(b_sh));
                    if (b_rs) p_rs = atomicAdd(&cnt_rs, __popc(b_rs));
                }
                p_sh = __shfl_sync(0xffffffffu, p_sh, 0) + __popc(b_sh & below);
                p_rs = __shfl_sync(0xffffffffu, p_rs, 0) + __popc(b_rs & below);
                if (to_sh) sh_idx[row_s + p_sh] = k;
                if (to_rs) {
                    rs_idx[row_r + p_rs] = k;
                    if (mask_bytes == 1) ((unsigned char*)rs_mask)[row_r + p_rs] = (unsigned char)m;
                    else ((int*)rs_mask)[row_r + p_rs] = (int)m;
                }
            }
        }
        __syncthreads();
    }
    const int ns = cnt_sh, nr = cnt_rs;
    if (threadIdx.x == 0) { sh_len[q] = ns; rs_len[q] = nr; un_len[q] = ns + nr; }
    const int es = min(((ns + 63) / 64) * 64, cap_s), er = min(((nr + 63) / 64) * 64, cap_r);
    for (int p = ns + threadIdx.x; p < es; p += blockDim.x) sh_idx[row_s + p] = -1;
    for (int p = nr + threadIdx.x; p < er; p += blockDim.x) {
        rs_idx[row_r + p] = -1;
        if (mask_bytes == 1) ((unsigned char*)rs_mask)[row_r + p] = 0;
        else ((int*)rs_mask)[row_r + p] = 0;
    }
}
"""

_KERNELS: dict = {}


def _kernel(device: torch.device):
    """The compiled kernel for ``device``'s compute capability (NVRTC, once per process and capability)."""
    cap = torch.cuda.get_device_capability(device)
    if cap not in _KERNELS:
        compile_kernel = getattr(torch.cuda, "_compile_kernel", None)
        if compile_kernel is None:
            raise ValueError(f"variant='cuda' needs torch.cuda._compile_kernel (torch >= 2.9); this is torch "
                             f"{torch.__version__}")
        with torch.cuda.device(device):
            _KERNELS[cap] = compile_kernel(CUDA_SOURCE, "union_build_smem")
    return _KERNELS[cap]


def tile_keys_for(s_kv: int, g: int, smem_bytes: int = SMEM_TILE_BYTES) -> int:
    """Keys per shared-memory tile: all of ``s_kv`` when it fits ``smem_bytes`` (2 bytes per key for g <= 8, 4 for
    g = 16), else the most that fit."""
    per_key = 2 if g <= 8 else 4
    return max(2, min(s_kv + (s_kv & 1), smem_bytes // per_key))


def build_union_cuda(indices, topk_length, g: int, s_kv: int, out, *, block: int = DEFAULT_BLOCK,
                     smem_bytes: int = SMEM_TILE_BYTES):
    """Launch the CUDA kernel into ``out`` (a :class:`.union.UnionSets` of the right shapes; the caller,
    :func:`.union.build_union`, validates everything). Returns ``out``.

    Raises:
        ValueError: ``block`` not a multiple of 32 in [32, 1024]; ``smem_bytes`` outside [1024, 227 KiB]; no
            ``torch.cuda._compile_kernel``.
    """
    if isinstance(block, bool) or not isinstance(block, int) or block % 32 or not 32 <= block <= 1024:
        raise ValueError(f"block must be a multiple of 32 in [32, 1024]; got block={block!r}")
    if isinstance(smem_bytes, bool) or not isinstance(smem_bytes, int) or not 1024 <= smem_bytes <= 227 * 1024:
        raise ValueError(f"smem_bytes must be an int in [1024, {227 * 1024}]; got smem_bytes={smem_bytes!r}")
    T, topk = indices.shape
    G = out.num_groups
    if G == 0:
        return out
    tk = tile_keys_for(s_kv, g, smem_bytes)
    n_tiles = -(-s_kv // tk)
    words = tk if g > 8 else (tk + 1) // 2
    kern = _kernel(indices.device)
    if words * 4 > getattr(kern, "_max_shared_mem_bytes", 0):  # once per size (cuFuncSetAttribute)
        kern.set_shared_memory_config(words * 4)
    lens = topk_length.contiguous() if topk_length is not None else out.shared_len
    cap_s, cap_r = out.shared_idx.shape[1], out.rest_idx.shape[1]
    kern(grid=(G, 1, 1), block=(block, 1, 1), shared_mem=words * 4,
         args=[indices, lens, int(topk_length is not None), T, topk, indices.stride(0), s_kv, g, tk, n_tiles, cap_s,
               cap_r, out.shared_idx, out.shared_len, out.rest_idx, out.rest_mask, out.rest_mask.element_size(),
               out.rest_len, out.union_len])
    return out
