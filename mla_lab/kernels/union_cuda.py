"""Union builder as a CUDA C++ kernel with the membership table in shared memory: the contract and sets of
:func:`.union.build_union_ref` (:mod:`.union`), lists in warp order.

**The kernel** (``CUDA_SOURCE``, built on first use by ``torch.utils.cpp_extension.load_inline``): a persistent grid
(SMs x resident CTAs of :data:`THREADS` threads) over *super-groups* of 8 tokens (``8 / g`` groups), one at a time
per CTA. The ``8 x topk`` entries sit in registers (``int4`` loads, 32 per thread when topk <= 2048; the next
super-group's are prefetched unchecked and ``topk_length`` two ahead goes through a shared-memory ring); a larger
topk is processed in chunks re-read per phase. Invalid entries become ``-1``. The table holds one byte per key (bit
``j`` = token ``j``; group ``s`` owns bits ``s g .. s g + g - 1``) over ``window`` keys (default ``min(s_kv,
196608)``: 192 KiB); when ``s_kv > window`` the super-group's key range is processed window by window. Per window:
(1) ``atomicOr`` bit ``j`` per valid entry; barrier. (2) an entry whose token is its group's lowest set bit clears
the group's bits with ``atomicAnd`` and keeps the key iff they were non-zero (one keeper per key; duplicates drop);
the old bits are the mask (shared iff all present tokens and none empty); positions from a warp prefix sum and one
shared ``atomicAdd`` per warp and slot; the table is left zeroed. Then lengths and ``-1`` padding to a multiple of 64.

``g = 16`` is refused (use :func:`.union.build_union`). Rows not 16-byte aligned with a multiple of 128 entries are
first copied into a ``-1`` padded ``[T, ceil(topk / 128) * 128]`` tensor (topk 2048 needs none). Build: ``nvcc -O3
-gencode=arch=compute_90a,code=sm_90a``, :data:`EXTENSION_NAME`, cached under ``TORCH_EXTENSIONS_DIR``; a fresh
cache compiles for tens of seconds.
"""

from __future__ import annotations

import functools

import torch

from .union import UnionSets, _validate, output_sets

__all__ = ["build_union_cuda", "union_mismatch", "CUDA_SOURCE", "EXTENSION_NAME", "THREADS", "MAX_WINDOW"]

#: Threads per CTA; entries per thread and chunk: ``NV x 4`` = 32 (``CUDA_SOURCE``): 16384 = 8 tokens x topk 2048.
THREADS = 512
#: Keys (bytes) of the shared-memory table: 192 KiB; sm90 allows 227 KiB of dynamic shared memory per block (CUDA C++
#: Programming Guide, compute capability 9.0 table).
MAX_WINDOW = 196608
#: Entries per row the kernel reads without a copy: a multiple of a warp's 32 int4 loads.
ROW_MULTIPLE = 128
EXTENSION_NAME = "mla_lab_union_cuda_v3"

CUDA_SOURCE = r"""
#include <cuda_runtime.h>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace {
// NV int4 slots per thread; CHUNK4 int4 per chunk; SG tokens per super-group (one table bit each)
constexpr int THREADS = 512, NV = 8, CHUNK4 = THREADS * NV, SG = 8;
constexpr unsigned FULL = 0xffffffffu;

struct Args {
  const int4* idx; const int* lens; int* sh_idx; int* sh_len; int* rs_idx; unsigned char* rs_mask; int* rs_len;
  int* un_len; long long stride4; int T, topk4, s_kv, G, g, log_g, window, cap_s, cap_r;
};

__device__ __forceinline__ int elem(const int4& x, int e) { return e == 0 ? x.x : e == 1 ? x.y : e == 2 ? x.z : x.w; }

// Entries of token t of super-group sg to consider (FlashMLA's rule): min(topk, topk_length[t]); 0 when absent.
__device__ __forceinline__ int token_limit(const Args& a, int sg, int t, int raw_len) {
  const long long tok = (long long)sg * SG + t;
  if (sg >= (a.T + SG - 1) / SG || tok >= a.T) return 0;
  return a.lens ? min(4 * a.topk4, raw_len) : 4 * a.topk4;
}

// Chunk c of super-group sg into k, unchecked (no wait on the data: the next super-group's prefetch); int4 slots past
// a token's limit are not read (-1). lim: the super-group's token limits. Returns each slot's token (0..7), 4 bits.
// Rows are multiples of 32 int4, so the 32 lanes of a warp hold one token's entries in each slot.
__device__ __forceinline__ unsigned load_raw(const Args& a, int sg, int c, const int* lim, int4 (&k)[NV]) {
  unsigned jp = 0;
#pragma unroll
  for (int v = 0; v < NV; ++v) {
    const int q = c * CHUNK4 + v * THREADS + (int)threadIdx.x, j = min(q / a.topk4, SG - 1), i4 = q - j * a.topk4;
    k[v] = make_int4(-1, -1, -1, -1);
    if (4 * i4 < lim[j]) k[v] = __ldg(a.idx + ((long long)sg * SG + j) * a.stride4 + i4);
    jp |= (unsigned)j << (4 * v);
  }
  return jp;
}

// Entries past the token's limit, < 0 or >= s_kv -> -1.
__device__ __forceinline__ void sanitize(const Args& a, int c, const int* lim, unsigned jp, int4 (&k)[NV]) {
  const unsigned s = (unsigned)a.s_kv;
#pragma unroll
  for (int v = 0; v < NV; ++v) {
    const int q = c * CHUNK4 + v * THREADS + (int)threadIdx.x, j = (jp >> (4 * v)) & 15u;
    const int n = lim[j] - 4 * (q - j * a.topk4);  // valid positions left in this int4
    k[v].x = (n > 0 && (unsigned)k[v].x < s) ? k[v].x : -1;
    k[v].y = (n > 1 && (unsigned)k[v].y < s) ? k[v].y : -1;
    k[v].z = (n > 2 && (unsigned)k[v].z < s) ? k[v].z : -1;
    k[v].w = (n > 3 && (unsigned)k[v].w < s) ? k[v].w : -1;
  }
}

// Phase 2 for one register slot of token j (warp-uniform): the byte's bits of j's group (g bits from s g); claim
// (clear them) if j is the group's lowest token; emit the kept keys at positions from a warp prefix sum.
__device__ __forceinline__ void emit_slot(const Args& a, const int4& x, unsigned j, int w0, unsigned wlen,
                                          unsigned flags, int n_tok, unsigned* tab, unsigned long long* cnt, int sg) {
  const volatile unsigned char* tab8 = reinterpret_cast<const volatile unsigned char*>(tab);
  const unsigned s = j >> a.log_g, sb = s * a.g, gm = (1u << a.g) - 1u;
  const unsigned present = (1u << max(0, min(a.g, n_tok - (int)sb))) - 1u;
  const unsigned full = ((flags >> sb) & present) == present ? present : 0x100u;  // 0x100 matches no mask
  unsigned ksh = 0, krs = 0, masks = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const unsigned off = (unsigned)(elem(x, e) - w0);
    unsigned b = 0;
    if (off < wlen) {
      const unsigned m = (tab8[off] >> sb) & gm;
      if (m != 0u && (unsigned)(__ffs(m) - 1) == j - sb) {  // lowest token of the group; 0: claimed already
        const unsigned sh = (off & 3u) * 8u + sb;
        b = (atomicAnd(tab + (off >> 2), ~(gm << sh)) >> sh) & gm;
      }
    }
    if (b) { if (b == full) ksh |= 1u << e; else krs |= 1u << e; }
    masks |= b << (8 * e);
  }
  const unsigned c = __popc(ksh) | (__popc(krs) << 16);
  if (!__any_sync(FULL, c)) return;
  const unsigned lane = threadIdx.x & 31u;
  unsigned inc = c;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const unsigned y = __shfl_up_sync(FULL, inc, d);
    if (lane >= (unsigned)d) inc += y;
  }
  unsigned long long base = 0;
  if (lane == 31u) base = atomicAdd(cnt + s, ((unsigned long long)(inc >> 16) << 32) | (inc & 0xffffu));
  base = __shfl_sync(FULL, base, 31);
  const unsigned ex = inc - c;
  const long long grp = (long long)sg * (SG >> a.log_g) + s;
  long long ps = grp * a.cap_s + (long long)(unsigned)base + (ex & 0xffffu);
  long long pr = grp * a.cap_r + (long long)(base >> 32) + (ex >> 16);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if ((ksh >> e) & 1u) a.sh_idx[ps++] = elem(x, e);
    if ((krs >> e) & 1u) { a.rs_idx[pr] = elem(x, e); a.rs_mask[pr] = (unsigned char)(masks >> (8 * e)); ++pr; }
  }
}

// Lengths of the super-group's groups and the -1 (mask 0) padding up to the next multiple of 64.
__device__ __forceinline__ void finish(const Args& a, int sg, const unsigned long long* cnt) {
  const int nsub = SG >> a.log_g, r = threadIdx.x & 127;
  for (int s = threadIdx.x >> 7; s < nsub && (long long)sg * nsub + s < a.G; s += THREADS / 128) {
    const long long grp = (long long)sg * nsub + s;
    const int nsh = (int)(unsigned)cnt[s], nrs = (int)(cnt[s] >> 32);
    if (r < 64) {
      if (nsh + r < ((nsh + 63) & ~63)) a.sh_idx[grp * a.cap_s + nsh + r] = -1;
    } else if (nrs + r - 64 < ((nrs + 63) & ~63)) {
      a.rs_idx[grp * a.cap_r + nrs + r - 64] = -1; a.rs_mask[grp * a.cap_r + nrs + r - 64] = 0;
    }
    if (r == 0) { a.sh_len[grp] = nsh; a.rs_len[grp] = nrs; a.un_len[grp] = nsh + nrs; }
  }
}

// After a super-group's first barrier: reset the other buffer (last used by the previous super-group) and store the
// token limits of the super-group two ahead (loaded at the top of this one) into the ring.
__device__ __forceinline__ void rotate(const Args& a, int b, int slot2, int sg2, int raw_len,
                                       unsigned long long (*s_cnt)[SG], unsigned* s_flags, int* s_lo, int* s_hi,
                                       int (*s_lim)[SG]) {
  const int tid = threadIdx.x;
  if (tid < SG) { s_cnt[b ^ 1][tid] = 0; s_lim[slot2][tid] = token_limit(a, sg2, tid, raw_len); }
  if (tid == 0) { s_flags[b ^ 1] = 0; s_lo[b ^ 1] = INT_MAX; s_hi[b ^ 1] = -1; }
}

__global__ void __launch_bounds__(THREADS, 1) union_kernel(Args a) {
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned* tab = reinterpret_cast<unsigned*>(smem);
  __shared__ unsigned long long s_cnt[2][SG];  // per buffer and group: shared count (low 32 bits), rest (high 32)
  __shared__ unsigned s_flags[2];              // bit j: token j has a valid key
  __shared__ int s_lo[2], s_hi[2];
  __shared__ int s_lim[3][SG];                 // token limits of this super-group and the next two (ring)
  const int tid = threadIdx.x, lane = tid & 31, nsg = (a.T + SG - 1) / SG, step = gridDim.x;
  for (int w = tid; w < a.window / 16; w += THREADS) reinterpret_cast<int4*>(smem)[w] = make_int4(0, 0, 0, 0);
  if (tid < 2 * SG) {
    s_cnt[tid / SG][tid % SG] = 0;
    const int sg = blockIdx.x + (tid / SG) * step, t = sg * SG + tid % SG;
    s_lim[tid / SG][tid % SG] = token_limit(a, sg, tid % SG, (a.lens && sg < nsg && t < a.T) ? a.lens[t] : 0);
  }
  if (tid < 2) { s_flags[tid] = 0; s_lo[tid] = INT_MAX; s_hi[tid] = -1; }
  __syncthreads();
  const int nchunks = (SG * a.topk4 + CHUNK4 - 1) / CHUNK4;
  const bool resident = nchunks == 1, windowed = a.s_kv > a.window;
  int4 cur[NV], nxt[NV];
  unsigned jc = 0, jn = 0;
  if (resident && (int)blockIdx.x < nsg) jc = load_raw(a, blockIdx.x, 0, s_lim[0], cur);
  int it = 0;
  for (int sg = blockIdx.x; sg < nsg; sg += step, ++it) {
    const int b = it & 1, n_tok = min(SG, a.T - sg * SG), sg2 = sg + 2 * step;
    const int* lim = s_lim[it % 3];
    int raw_len = 0;  // topk_length of token tid of the super-group two ahead, stored after the first barrier
    if (tid < SG && a.lens && sg2 < nsg && sg2 * SG + tid < a.T) raw_len = __ldg(a.lens + sg2 * SG + tid);
    if (resident) {
      if (sg + step < nsg) jn = load_raw(a, sg + step, 0, s_lim[(it + 1) % 3], nxt);
      sanitize(a, 0, lim, jc, cur);
    }
    bool first = true;
    int lo = 0, hi = a.s_kv - 1;
    if (windowed) {  // the super-group's key range and non-empty tokens
      int mn = INT_MAX, mx = -1;
      unsigned fl = 0;
      for (int c = 0; c < nchunks; ++c) {
        if (!resident) { jc = load_raw(a, sg, c, lim, cur); sanitize(a, c, lim, jc, cur); }
#pragma unroll
        for (int v = 0; v < NV; ++v)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int k = elem(cur[v], e);
            if (k >= 0) { mn = min(mn, k); mx = max(mx, k); fl |= 1u << ((jc >> (4 * v)) & 15u); }
          }
      }
      mn = __reduce_min_sync(FULL, mn); mx = __reduce_max_sync(FULL, mx); fl = __reduce_or_sync(FULL, fl);
      if (lane == 0) { atomicMin(&s_lo[b], mn); atomicMax(&s_hi[b], mx); if (fl) atomicOr(&s_flags[b], fl); }
      __syncthreads();
      rotate(a, b, (it + 2) % 3, sg2, raw_len, s_cnt, s_flags, s_lo, s_hi, s_lim);
      first = false;
      lo = s_lo[b]; hi = s_hi[b];
      if (hi < lo) __syncthreads();  // no valid key: a second barrier before the next super-group
    }
    const int nwin = hi >= lo ? (hi - lo) / a.window + 1 : 0;
    for (int w = 0; w < nwin; ++w) {
      const int w0 = lo + w * a.window;
      const unsigned wlen = (unsigned)min(a.window, hi - w0 + 1);
      unsigned fl = 0;
      for (int c = 0; c < nchunks; ++c) {  // phase 1: membership bits
        if (!resident) { jc = load_raw(a, sg, c, lim, cur); sanitize(a, c, lim, jc, cur); }
#pragma unroll
        for (int v = 0; v < NV; ++v)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int k = elem(cur[v], e);
            const unsigned off = (unsigned)(k - w0), j = (jc >> (4 * v)) & 15u;
            if (off < wlen) atomicOr(tab + (off >> 2), (1u << j) << ((off & 3u) * 8u));
            if (k >= 0) fl |= 1u << j;
          }
      }
      if (!windowed) { fl = __reduce_or_sync(FULL, fl); if (lane == 0 && fl) atomicOr(&s_flags[b], fl); }
      __syncthreads();
      if (first) rotate(a, b, (it + 2) % 3, sg2, raw_len, s_cnt, s_flags, s_lo, s_hi, s_lim);
      first = false;
      const unsigned flags = s_flags[b];
      for (int c = 0; c < nchunks; ++c) {  // phase 2: claim, classify, emit
        if (!resident) { jc = load_raw(a, sg, c, lim, cur); sanitize(a, c, lim, jc, cur); }
#pragma unroll
        for (int v = 0; v < NV; ++v)
          emit_slot(a, cur[v], (jc >> (4 * v)) & 15u, w0, wlen, flags, n_tok, tab, s_cnt[b], sg);
      }
      __syncthreads();
    }
    finish(a, sg, s_cnt[b]);
    if (resident) {
#pragma unroll
      for (int v = 0; v < NV; ++v) cur[v] = nxt[v];
      jc = jn;
    }
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("union_build: ") + what + ": " + cudaGetErrorString(e));
}
}  // namespace

void union_build(int64_t idx, int64_t lens, int64_t sh_idx, int64_t sh_len, int64_t rs_idx, int64_t rs_mask,
                 int64_t rs_len, int64_t un_len, int64_t stride4, int64_t T, int64_t topk4, int64_t s_kv, int64_t G,
                 int64_t g, int64_t window, int64_t cap_s, int64_t cap_r, int64_t stream) {
  int log_g = 0;
  while ((1 << log_g) < g) ++log_g;
  Args a{reinterpret_cast<const int4*>(idx), reinterpret_cast<const int*>(lens), reinterpret_cast<int*>(sh_idx),
         reinterpret_cast<int*>(sh_len), reinterpret_cast<int*>(rs_idx), reinterpret_cast<unsigned char*>(rs_mask),
         reinterpret_cast<int*>(rs_len), reinterpret_cast<int*>(un_len), (long long)stride4, (int)T, (int)topk4,
         (int)s_kv, (int)G, (int)g, log_g, (int)window, (int)cap_s, (int)cap_r};
  int dev = 0, sms = 0, per_sm = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "multiProcessorCount");
  check(cudaFuncSetAttribute(union_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)window),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, union_kernel, THREADS, (size_t)window), "occupancy");
  if (per_sm < 1) throw std::runtime_error("union_build: the kernel does not fit on an SM with window=" +
                                           std::to_string(window) + " bytes of shared memory");
  const int64_t nsg = (T + SG - 1) / SG;
  const int grid = (int)std::min<int64_t>(nsg, (int64_t)sms * per_sm);
  union_kernel<<<grid, THREADS, (size_t)window, reinterpret_cast<cudaStream_t>(stream)>>>(a);
  check(cudaGetLastError(), "launch");
}
"""

CPP_DECL = ("#include <torch/extension.h>\n"  # for the pybind wrapper load_inline generates
            "void union_build(int64_t idx, int64_t lens, int64_t sh_idx, int64_t sh_len, int64_t rs_idx, "
            "int64_t rs_mask, int64_t rs_len, int64_t un_len, int64_t stride4, int64_t T, int64_t topk4, "
            "int64_t s_kv, int64_t G, int64_t g, int64_t window, int64_t cap_s, int64_t cap_r, int64_t stream);")


@functools.cache
def _extension():
    """The compiled extension (``load_inline``; cached on disk under ``TORCH_EXTENSIONS_DIR`` and in this process)."""
    import inspect

    from torch.utils.cpp_extension import load_inline

    # the .cu needs no torch header: leave out the ones load_inline would prepend (torch >= 2.7), a faster nvcc step
    kw = {"no_implicit_headers": True} if "no_implicit_headers" in inspect.signature(load_inline).parameters else {}
    return load_inline(name=EXTENSION_NAME, cpp_sources=CPP_DECL, cuda_sources=CUDA_SOURCE, functions=["union_build"],
                       extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"], verbose=False, **kw)


def _vector_rows(indices: torch.Tensor) -> torch.Tensor:
    """``indices`` if its rows are 16-byte aligned with a multiple of 128 entries, else a ``-1`` padded
    ``[T, ceil(topk / 128) * 128]`` copy (the kernel's warps read 32 int4 of one row)."""
    T, topk = indices.shape
    if (topk % ROW_MULTIPLE == 0 and indices.stride(1) == 1 and indices.stride(0) % 4 == 0
            and indices.data_ptr() % 16 == 0):
        return indices
    padded = torch.full((T, -(-topk // ROW_MULTIPLE) * ROW_MULTIPLE), -1, dtype=torch.int32, device=indices.device)
    padded[:, :topk] = indices
    return padded


def _check_cuda_args(indices, g, s_kv, window) -> int:
    """The rules :func:`build_union_cuda` adds to :func:`.union.build_union_ref`'s; returns the window (keys)."""
    if g > 8:
        raise ValueError(f"g must be <= 8 for build_union_cuda (one byte per key); got g={g}: use "
                         f"mla_lab.kernels.union.build_union (Triton) for g = 16")
    win = min(MAX_WINDOW, -(-s_kv // 16) * 16) if window is None else window
    if isinstance(win, bool) or not isinstance(win, int) or win < 16 or win > MAX_WINDOW or win % 16:
        raise ValueError(f"window must be None or an int multiple of 16 in [16, {MAX_WINDOW}]; got window={window!r}")
    dev = indices.device
    if dev.type != "cuda":
        raise ValueError(f"indices must be a CUDA tensor for build_union_cuda; got device={dev} (on CPU use "
                         f"mla_lab.kernels.union.build_union_ref)")
    if torch.cuda.get_device_capability(dev) != (9, 0):
        raise ValueError(f"build_union_cuda is compiled for sm_90a (H100/H200); got compute capability "
                         f"{torch.cuda.get_device_capability(dev)} on {dev}: use mla_lab.kernels.union.build_union")
    return win


def build_union_cuda(indices: torch.Tensor, topk_length: torch.Tensor | None, g: int, s_kv: int, *,
                     out: UnionSets | None = None, window: int | None = None) -> UnionSets:
    """The union lists by the CUDA shared-memory kernel (module docstring), lists in arbitrary order.

    Args:
        indices: ``[T, topk]`` int32 CUDA tensor, any strides; topk_length: ``[T]`` int32 or None; g: 1, 2, 4 or 8;
            s_kv: keys in the kv cache (int >= 1); out: as :func:`.union.build_union`.
        window: keys of the table, a multiple of 16 in ``[16, MAX_WINDOW]`` (default ``min(MAX_WINDOW, s_kv rounded
            up to 16)``); a smaller one forces the windowed path (tests).

    Raises:
        ValueError: every rule of :func:`.union.build_union_ref`; g = 16; CPU tensors; a GPU other than sm90;
            ``out`` or ``window`` not as stated.
        RuntimeError: the extension fails to build or to launch (the compiler's or CUDA's message).
    """
    _validate(indices, topk_length, g, s_kv)
    s_kv_k = min(s_kv, 2**31 - 1)  # keys are int32: every non-negative key is below it
    win = _check_cuda_args(indices, g, s_kv_k, window)
    dev = indices.device
    out = output_sets(indices, g, out)
    T, topk = indices.shape
    G = out.num_groups
    if G == 0 or topk == 0:
        for t in (out.shared_len, out.rest_len, out.union_len):
            t.zero_()
        return out
    idx = _vector_rows(indices)
    lens = None if topk_length is None else topk_length.contiguous()  # kept alive until the launch is queued
    with torch.cuda.device(dev):
        _extension().union_build(
            idx.data_ptr(), 0 if lens is None else lens.data_ptr(), out.shared_idx.data_ptr(),
            out.shared_len.data_ptr(), out.rest_idx.data_ptr(), out.rest_mask.data_ptr(), out.rest_len.data_ptr(),
            out.union_len.data_ptr(), idx.stride(0) // 4, T, idx.shape[1] // 4, s_kv_k, G, g, win, out.shared_idx.shape[1], out.rest_idx.shape[1],
            torch.cuda.current_stream(dev).cuda_stream)
    return out


def union_mismatch(got: UnionSets, ref: UnionSets) -> str | None:
    """None when ``got`` and ``ref`` hold the same sets (lengths; each list sorted, with its masks; ``got``'s ``-1`` /
    mask-0 padding to the next multiple of 64), else one line saying what differs first."""
    for name in ("shared_len", "rest_len", "union_len"):
        a, b = getattr(got, name), getattr(ref, name)
        if not torch.equal(a.cpu(), b.cpu()):
            q = int((a.cpu() != b.cpu()).nonzero()[0, 0])
            return f"{name} differs first at group {q}: {int(a[q])} vs {int(b[q])}"
    big = torch.iinfo(torch.int64).max
    for name, ln, mask in (("shared", got.shared_len, None), ("rest", got.rest_len, "rest_mask")):
        rows = []
        for s in (got, ref):
            key = getattr(s, f"{name}_idx").long()
            code = key * 256 + getattr(s, mask).long() if mask else key
            col = torch.arange(key.shape[1], device=key.device)[None, :]
            rows.append(torch.where(col < ln.to(key.device).long()[:, None], code, big).sort(dim=1).values)
        if not torch.equal(rows[0].cpu(), rows[1].cpu()):
            q = int((rows[0] != rows[1]).any(1).nonzero()[0, 0])
            return f"{name} list (keys{' and masks' if mask else ''}) of group {q} differs from the reference"
        col = torch.arange(getattr(got, f"{name}_idx").shape[1], device=ln.device)[None, :]
        pad = (col >= ln.long()[:, None]) & (col < ((ln.long() + 63) // 64 * 64)[:, None])
        bad_pad = bool((getattr(got, f"{name}_idx")[pad] != -1).any())
        if mask:
            bad_pad |= bool((got.rest_mask[pad] != 0).any())
        if bad_pad:
            return f"{name} padding: an entry between the length and the next multiple of 64 is not -1 (mask 0)"
    return None
