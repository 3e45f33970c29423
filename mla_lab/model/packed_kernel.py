"""The packed sparse-MLA prefill (strategy ``packed``) priced by union size: the fit on the H200 kernel rows
(:func:`fit_packed`), a step's union sizes (:func:`step_union`) and the pack-or-fallback dispatch
(:func:`packed_plan`). The formulas and their assumptions: docs/packed.md, "Pricing". :data:`DISPATCH_MARGIN` and
:data:`PROGRAMS_PER_SM` repeat :mod:`mla_lab.kernels` (importing it loads torch; tests/test_packed_pricing.py checks).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..arch import GPUArch, get_arch
from ..engines import BACKENDS
from ..paths import REPO_ROOT, calibration_dir, command_output
from ..rank import RankView
from ..union_layout import union_buffer_bytes
from ..workload import Step, schedule, sum_topk_lengths

#: The GPU the fit's rows ran on, and the rows (``mla-lab measure --experiments packed_kernels``).
FIT_GPU = "h200"
ROWS_CSV = f"data/measured/{FIT_GPU}/between_process/packed_kernels.csv"
#: The calibration file :func:`fit_packed_file` makes (``data/calibration``).
PACKED_CSV = "h200_packed.csv"
#: The assumed pairwise overlap of neighbouring tokens' top-k sets past the top-k (strategy ``packed``).
PACKED_OVERLAP_DEFAULT = 0.44
PACKED_OVERLAP_SOURCE = ("NVIDIA TensorRT-LLM tech blog 21 (GVR top-k): about 44 % raw overlap between consecutive "
                         "DeepSeek-V3.2 decode steps' top-2048 in layers 20-60 (data/overlap/published.json, "
                         "trtllm_blog21_ablation); taken for neighbouring prefill tokens: an assumption")
#: How the one-line summary names the kernel.
PACKED_LABEL_SHORT = "packed (mla_lab kernel)"
#: Packed only where predicted below this x the padded kernel (:data:`mla_lab.kernels.packed.DISPATCH_MARGIN`).
DISPATCH_MARGIN = 0.98
#: Union builder programs per SM (:data:`mla_lab.kernels.union.DEFAULT_PROGRAMS_PER_SM`).
PROGRAMS_PER_SM = 2
#: The measured shapes' seed prompt length and tokens per group (8 heads, 64-row tile; the packed_kernels rows).
SEED_PROMPT_LEN = 1024
MEASURED_G = 8
#: Row kernels the fit reads.
KERNEL_ROWS = {"kernel": "packed_kernel", "triton": "packed_triton", "build": "union_build",
               "padded": "flashmla_ts_pad64_zeros", "padded_stale": "flashmla_ts_pad64", "path": "packed"}
#: Coefficients (ns) and what each multiplies.
TERMS = {"flash_tile": "hybrid: shared key-tiles", "rest_tile": "hybrid: rest key-tiles",
         "rest_group": "hybrid: groups with rest keys", "triton_tile": "Triton only: union key-tiles",
         "triton_group": "Triton only: groups", "build_read": "union build: [T, topk] entries read",
         "build_entry": "union build: valid entries, sum(topk_length)",
         "build_key": "union build: union keys written, sum(U)", "padded_tile": "padded kernel: sum(topk_length)",
         "padded_token": "padded kernel: tokens"}


def _fa3_runs(arch: GPUArch) -> bool:
    """FA3 sparse (FLASH_ATTN_MLA_SPARSE) runs on ``arch`` (:data:`mla_lab.engines.BACKENDS`)."""
    return arch.capability[0] in BACKENDS["FLASH_ATTN_MLA_SPARSE"][0]


def packed_group_size(num_heads: int, tile_rows: int = 64) -> int | None:
    """Tokens per tile, ``tile_rows // num_heads`` (:func:`mla_lab.kernels.packed.packed_group_size`), or None where
    the heads cannot be packed (not 8, 16 or 32)."""
    return tile_rows // num_heads if num_heads in (8, 16, 32) and tile_rows in (64, 128) else None


@dataclass(frozen=True)
class PackedFit:
    """The fitted terms (ns; :data:`TERMS`), where they come from, and the per-shape errors (list of dicts)."""

    flash_tile: float
    rest_tile: float
    rest_group: float
    triton_tile: float
    triton_group: float
    build_read: float
    build_entry: float
    build_key: float
    padded_tile: float
    padded_token: float
    source: str
    source_commit: str = ""
    errors: tuple = ()

    def kernel_ns(self, shared: float, rest: float, groups_with_rest: float, groups: float) -> tuple[str, float]:
        """``(mode, ns)``: the faster packed kernel (``hybrid`` / ``triton``) for one call's 64-row key-tile counts."""
        hybrid = self.flash_tile * shared + self.rest_tile * rest + self.rest_group * groups_with_rest
        triton = self.triton_tile * (shared + rest) + self.triton_group * groups
        return ("hybrid", hybrid) if hybrid <= triton else ("triton", triton)

    def build_ns(self, read: float, entries: float, union_keys: float) -> float:
        """The union build in ns (``[T, topk]`` entries read, valid entries, union keys written)."""
        return self.build_read * read + self.build_entry * entries + self.build_key * union_keys

    def padded_ns(self, sum_topk_length: float, tokens: float) -> float:
        """Padded FlashMLA in ns."""
        return self.padded_tile * sum_topk_length + self.padded_token * tokens


#: The dispatch's fit (:data:`mla_lab.kernels.packed.H200_PACKED_COST`: one lease of 2026-12-04, in-sample, rows not
#: committed; build term per ``T x topk`` entry read), used only while data/calibration/h200_packed.csv is absent.
HAND_FIT = PackedFit(0.328, 0.738, 0.0, 0.687, 15.6, 0.0098, 0.0, 0.0, 0.213, 34.9,
                     source="the dispatch's fit of one H200 lease's rows (mla_lab.kernels.packed.H200_PACKED_COST; "
                            "in-sample, rows not committed)")


def _shape_terms(shape: str, T: int, topk: int, U: float, S: float) -> dict:
    """The fit's regressors of one measured shape (U, S: mean per group over topk)."""
    G = -(-T // MEASURED_G)
    st = (T // SEED_PROMPT_LEN) * sum_topk_lengths(0, SEED_PROMPT_LEN, topk) if shape == "seed" else T * topk
    rest = max(0.0, U - S)
    keys = G * U * topk
    return {"shared": G * S * topk, "rest": G * rest * topk, "groups_with_rest": float(G) if rest > 0 else 0.0,
            "union": G * U * topk, "groups": float(G),
            "read": float(T * topk), "entries": float(st), "union_keys": keys, "sum_topk": float(st), "T": float(T)}


def _medians(rows) -> tuple[dict, dict]:
    """``({(shape, kernel): ms}, {shape: (T, topk, U, S)})``: median over processes of each process's median."""
    per: dict = {}
    geo: dict = {}
    for r in rows:
        if r.get("experiment") != "packed_kernels" or r["kernel"] not in KERNEL_ROWS.values():
            continue
        per.setdefault((r["shape"], r["kernel"], r["process"]), []).append(float(r["ms"]))
        geo.setdefault(r["shape"], (int(float(r["T"])), int(float(r["topk"])), float(r["U"]), float(r["S"])))
    by: dict = {}
    for (shape, kernel, _p), xs in per.items():
        by.setdefault((shape, kernel), []).append(float(np.median(xs)))
    return {k: float(np.median(v)) for k, v in by.items()}, geo


def _lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares on relative errors: minimises ``sum(((X c - y) / y)^2)``."""
    return np.linalg.lstsq(X / y[:, None], np.ones_like(y), rcond=None)[0]


def _fit_block(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, list, list]:
    """``(coef, in-sample, leave-one-shape-out)`` predictions (LOSO None where fewer shapes than terms remain)."""
    coef = _lstsq(X, y)
    loso = []
    for i in range(len(y)):
        keep = [j for j in range(len(y)) if j != i]
        loso.append(float(X[i] @ _lstsq(X[keep], y[keep])) if len(keep) >= X.shape[1] else None)
    return coef, list(X @ coef), loso


#: block -> (regressors, row kernel); the coefficients in :data:`TERMS` order.
BLOCKS = {"kernel": (("shared", "rest", "groups_with_rest"), "packed_kernel"),
          "triton": (("union", "groups"), "packed_triton"),
          "build": (("read", "entries", "union_keys"), "union_build"),
          "padded": (("sum_topk", "T"), "flashmla_ts_pad64_zeros")}


def fit_packed(rows_csv: str | Path | None = None, rows=None, source_commit: str | None = None) -> PackedFit:
    """Fit :data:`BLOCKS` on ``rows_csv`` (default :data:`ROWS_CSV`) or ``rows`` (dicts with its columns).
    Raises ValueError: a block with fewer shapes than terms."""
    path = Path(rows_csv) if rows_csv is not None else REPO_ROOT / ROWS_CSV
    if rows is None:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    med, geo = _medians(rows)
    t = {s: _shape_terms(s, *geo[s]) for s in geo}
    coef, errors = {}, []
    for block, (cols, kernel) in BLOCKS.items():
        if block == "padded" and not any(k == kernel for _, k in med):
            kernel = KERNEL_ROWS["padded_stale"]  # files before the zero-padded-heads rows
        shapes = sorted(s for s in geo if (s, kernel) in med)
        if len(shapes) < len(cols):
            raise ValueError(f"{path}: {len(shapes)} shapes have {kernel} rows; allowed: >= {len(cols)} (the "
                             f"{block} block has {len(cols)} terms)")
        X = np.array([[t[s][c] for c in cols] for s in shapes])
        y = np.array([med[(s, kernel)] * 1e6 for s in shapes])
        coef[block], fitted, loso = _fit_block(X, y)
        errors += [_error(block, s, *geo[s][2:], yi, fi, li, 1e6) for s, yi, fi, li in zip(shapes, y, fitted, loso)]
    src = str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)
    fit = PackedFit(*coef["kernel"], *coef["triton"], *coef["build"], *coef["padded"], source=src,
                    source_commit=source_commit if source_commit is not None else (command_output(
                        "git", "-C", str(REPO_ROOT), "log", "-1", "--format=%H", "--", str(path)) or "uncommitted"))
    for s in sorted(geo):  # the packed rows (build + kernel in one graph): not fitted, a check of the sum
        if (s, KERNEL_ROWS["path"]) in med:
            y = med[(s, KERNEL_ROWS["path"])]
            f = (fit.kernel_ns(t[s]["shared"], t[s]["rest"], t[s]["groups_with_rest"], t[s]["groups"])[1]
                 + fit.build_ns(t[s]["read"], t[s]["entries"], t[s]["union_keys"])) / 1e6
            errors.append(_error("path_check", s, *geo[s][2:], y, f))
    return PackedFit(**{**fit.__dict__, "errors": tuple(errors)})


def _error(block: str, shape: str, U: float, S: float, y: float, f: float, lo: float | None = None,
           per_ms: float = 1.0) -> dict:
    """One error row: measured ``y``, fitted ``f``, leave-one-shape-out ``lo`` (None: not fitted) in ``1 / per_ms``
    ms."""
    return {"block": block, "shape": shape, "U": U, "S": S, "measured_ms": y / per_ms, "fitted_ms": f / per_ms,
            "in_sample_pct": 100.0 * (f - y) / y, "loso_ms": None if lo is None else lo / per_ms,
            "loso_pct": None if lo is None else 100.0 * (lo - y) / y}


CSV_COLUMNS = ["kind", "name", "block", "shape", "value", "unit", "U", "S", "measured_ms", "fitted_ms",
               "in_sample_pct", "loso_ms", "loso_pct", "meaning", "source", "source_commit"]


def fit_packed_file(measured: Path) -> dict:
    """``{PACKED_CSV: rows}`` (:data:`CSV_COLUMNS`): :func:`fit_packed` of ``measured``'s packed_kernels rows, the
    coefficients then the per-shape errors (the ``mla_lab.fits`` entry ``packed``). Raises ValueError: as the fit."""
    fit = fit_packed(measured / FIT_GPU / "between_process" / "packed_kernels.csv")
    rows = [{"kind": "coefficient", "name": n, "value": getattr(fit, n), "unit": "ns", "meaning": m}
            for n, m in TERMS.items()] + [{"kind": "error", "name": e["block"], **e} for e in fit.errors]
    prov = {"source": fit.source, "source_commit": fit.source_commit}
    return {PACKED_CSV: [{k: "" if r.get(k) is None else r.get(k, "") for k in CSV_COLUMNS} | prov for r in rows]}


def read_packed_csv(path: str | Path) -> PackedFit:
    """The :class:`PackedFit` of a file :func:`fit_packed_file` made."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    c = {r["name"]: float(r["value"]) for r in rows if r["kind"] == "coefficient"}
    first = rows[0]
    errors = tuple({**r} for r in rows if r["kind"] == "error")
    return PackedFit(**{n: c[n] for n in TERMS}, source=first["source"], source_commit=first["source_commit"],
                     errors=errors)


@lru_cache(maxsize=1)
def load_packed_fit() -> PackedFit:
    """The committed fit (``data/calibration/h200_packed.csv``), else :data:`HAND_FIT` (its ``source`` says so)."""
    p = calibration_dir() / PACKED_CSV
    return read_packed_csv(p) if p.exists() else HAND_FIT


def causal_group_union(first: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(S, U) = (first + 1, last + 1)``: a group of ONE prompt's tokens, all positions (0-based) ``< topk``."""
    return np.asarray(first) + 1.0, np.asarray(last) + 1.0


def _overlap_union(last: np.ndarray, n: np.ndarray, topk: int, overlap: float) -> tuple[np.ndarray, np.ndarray]:
    """``(S, U)`` in the common-core model of groups of ``n`` tokens selecting ``topk`` of ``c = last + 1`` keys."""
    c = np.asarray(last, dtype=float) + 1.0
    k = float(topk)
    o = np.maximum(overlap, k / c)
    m = np.where(c > k, k * (o * c - k) / np.maximum(c - 2 * k + o * k, 1e-12), c)
    m = np.clip(m, 0.0, np.minimum(k, c))
    rest = c - m
    p = np.where(rest > 0, (k - m) / np.where(rest > 0, rest, 1.0), 0.0)
    U = m + rest * (1.0 - (1.0 - p) ** n)
    S = m + rest * p ** n
    return S, U


def _segment_union(first, last, n, topk, overlap):
    """``(S, U)`` of single-prompt segments: exact where the last position is below topk, else the overlap model."""
    Sc, Uc = causal_group_union(first, last)
    So, Uo = _overlap_union(last, n, topk, overlap)
    exact = np.asarray(last) + 1 <= topk
    return np.where(exact, Sc, So), np.where(exact, Uc, Uo)


@dataclass(frozen=True)
class UnionStats:
    """One step's union sizes summed over its ``ceil(T / g)`` groups, in key-tiles: ``shared`` sum S, ``rest``
    sum U - S, ``entries`` = ``sum_topk`` = sum(topk_length), ``read`` T x topk, ``overlap`` (assumed)."""

    T: int
    groups: int
    shared: float
    rest: float
    groups_with_rest: float
    entries: float
    sum_topk: float
    g: int
    overlap: float
    read: float = 0.0

    @property
    def union(self) -> float:
        return self.shared + self.rest


def _positions(chunks) -> tuple[np.ndarray, np.ndarray]:
    pos = [np.arange(s, s + n, dtype=np.int64) for _, s, n in chunks]
    req = [np.full(n, i, dtype=np.int64) for i, (_, _, n) in enumerate(chunks)]
    return (np.concatenate(pos), np.concatenate(req)) if pos else (np.zeros(0, np.int64), np.zeros(0, np.int64))


def step_union(chunks, topk: int, g: int, overlap: float) -> UnionStats:
    """The union sizes of a step of chunks ``(req, start, n)`` laid end to end, ``g`` tokens per group."""
    pos, req = _positions(chunks)
    T = len(pos)
    G = -(-T // g) if T else 0
    pad = G * g - T
    P = np.concatenate([pos, np.full(pad, -1)]).reshape(G, g)
    R = np.concatenate([req, np.full(pad, -1)]).reshape(G, g)
    n = (R >= 0).sum(1)
    last_i = n - 1
    same = R[np.arange(G), last_i] == R[:, 0] if G else np.zeros(0, bool)
    S, U = _segment_union(P[:, 0], P[np.arange(G), last_i], n, topk, overlap)
    S, U = np.where(same, S, 0.0), np.where(same, U, 0.0)
    for q in np.nonzero(~same)[0]:  # crossing groups: disjoint keys per prompt, nothing shared
        tot = 0.0
        for r in np.unique(R[q][R[q] >= 0]):
            seg = P[q][R[q] == r]
            tot += float(_segment_union(seg[:1], seg[-1:], np.array([len(seg)]), topk, overlap)[1][0])
        U[q] = tot
    rest = U - S
    st = float(np.minimum(pos + 1, topk).sum())
    return UnionStats(T, G, float(S.sum()), float(rest.sum()), float((rest > 0.5).sum()), st, st, g, overlap,
                      float(T * topk))


@dataclass(frozen=True)
class PackedPlan:
    """What a step runs under ``packed``: ``path`` ``packed`` / ``fallback`` (FA3 sparse), ``mode`` (None: heads not
    packable), ``packed_ms`` (kernel + build) and ``padded_ms`` per layer call."""

    path: str
    mode: str | None
    packed_ms: float | None
    padded_ms: float | None
    stats: UnionStats | None
    tile_rows: int
    reason: str
    source: str


def _predict(rank: RankView, stats: UnionStats, fit: PackedFit, rows: int) -> tuple[str, float, float]:
    """``(mode, packed ms, padded ms)`` of one step's union sizes."""
    scale = rows / 64.0  # the fit's unit is a 64-row key-tile
    mode, kern = fit.kernel_ns(stats.shared * scale, stats.rest * scale, stats.groups_with_rest, stats.groups)
    build = fit.build_ns(stats.read, stats.entries, stats.union)
    padded = fit.padded_ns(stats.sum_topk, stats.T) * max(1.0, rank.padded_num_heads / 64.0)
    return mode, (kern + build) / 1e6, padded / 1e6


def packed_plan(rank: RankView, step: Step | int, overlap: float | None = None,
                fit: PackedFit | None = None) -> PackedPlan:
    """The dispatch for one step on one rank (an int T: one fresh prompt of T tokens; None: the default overlap;
    :func:`load_packed_fit`, cached)."""
    o = PACKED_OVERLAP_DEFAULT if overlap is None else overlap
    chunks = tuple(tuple(c) for c in step.chunks) if isinstance(step, Step) else ((0, 0, step),) if step else ()
    return _plan_cached(rank, chunks, o) if fit is None else _plan(rank, chunks, o, fit)


@lru_cache(maxsize=4096)
def _plan_cached(rank: RankView, chunks: tuple, o: float) -> PackedPlan:
    return _plan(rank, chunks, o, load_packed_fit())


def _plan(rank: RankView, chunks: tuple, o: float, fit: PackedFit) -> PackedPlan:
    rows = rank.arch.prefill_padding
    g = packed_group_size(rank.num_heads, rows)
    if g is None:
        return PackedPlan("fallback", None, None, None, None, rows, f"{rank.num_heads} heads per rank cannot be "
                          "packed (8, 16 or 32 can): FA3 sparse", fit.source)
    stats = step_union(chunks, rank.model.topk, g, o)
    mode, pk, pd = _predict(rank, stats, fit, rows)
    if stats.T == 0 or pk < DISPATCH_MARGIN * pd:
        return PackedPlan("packed", mode, pk, pd, stats, rows, f"packed ({mode}): predicted {pk:.3f} ms < "
                          f"{DISPATCH_MARGIN} x padded {pd:.3f} ms", fit.source)
    return PackedPlan("fallback", mode, pk, pd, stats, rows, f"fallback to FA3 sparse: packed ({mode}) predicted "
                      f"{pk:.3f} ms >= {DISPATCH_MARGIN} x padded {pd:.3f} ms (U "
                      f"{stats.union / max(stats.groups, 1):.0f} keys per group)", fit.source)


def packed_strategy(overlap: float | None) -> str:
    """``packed`` (None or the default overlap) or ``packed:<overlap>``. Raises ValueError: not a number in [0, 1]."""
    if overlap is None:
        return "packed"
    if isinstance(overlap, bool) or not isinstance(overlap, (int, float)) or not 0.0 <= overlap <= 1.0:
        raise ValueError(f"packed_overlap={overlap!r} must be a number in [0, 1] (the assumed pairwise overlap of "
                         f"neighbouring tokens' top-k sets past the top-k; default {PACKED_OVERLAP_DEFAULT})")
    return "packed" if overlap == PACKED_OVERLAP_DEFAULT else f"packed:{overlap:g}"


#: The fallback and decode kernel on sm100, where FA3 sparse does not run (mla_lab/engines/presets/vllm_0_33_0.py).
SM100_REAL_HEAD = "vLLM 0.33.0's sm100 real-head kernel, FA4 or FlashInfer sparse, priced with FA3 sparse's model"


def _summary_terms(rank: RankView, source: str) -> tuple[str, str, str]:
    """``(tile, scope, real)`` of :func:`packed_summary`'s line: packing, measured or extrapolated, real-head kernel."""
    arch, rows = rank.arch, rank.arch.prefill_padding
    g = packed_group_size(rank.num_heads, rows)
    tile = (f"{g} tokens x {rank.num_heads} heads per {rows}-row tile" if g else
            f"{rank.num_heads} heads per rank: not packed")
    real = "FA3 sparse" if _fa3_runs(arch) else SM100_REAL_HEAD
    if g is None:
        return tile, "the packed kernel unused (every step on the fallback), modelled step", real
    if arch.sm != get_arch(FIT_GPU).sm:
        fam = arch.family.capitalize()
        return tile, (f"modelled (no {fam} measurement): the {FIT_GPU.upper()} fit at a {rows}-row tile scaled by "
                      f"the lab's {fam} rule"), real
    if g != MEASURED_G:
        return tile, (f"modelled kernel (the 8-head rows' per-tile fit applied at g = {g}, an extrapolation: nothing "
                      f"measured at {rank.num_heads} heads per rank; {source}), modelled step"), real
    return tile, f"measured kernel ({source}), modelled step", real


def packed_summary(deployment, strategy: str = "packed") -> dict:
    """How ``strategy`` (``packed[:<overlap>]``) prices ``deployment``'s prefill steps, counted; ``line``: one
    sentence."""
    from_name = strategy.partition(":")[2]
    o = float(from_name) if from_name else PACKED_OVERLAP_DEFAULT
    rank = deployment.rank
    plans = [packed_plan(rank, st, o) for st in schedule(deployment.workload, deployment.max_num_batched_tokens)]
    fb = [p for p in plans if p.path == "fallback"]
    arch = rank.arch
    tile, scope, real = _summary_terms(rank, plans[0].source if plans else "")
    line = (f"{PACKED_LABEL_SHORT}, {tile}: {scope}; overlap past the top-k {o:g} (assumed"
            + (f": {PACKED_OVERLAP_SOURCE}" if o == PACKED_OVERLAP_DEFAULT else ", packed_overlap")
            + ("; unused here: no prompt is longer than the top-k"
               if deployment.workload.prompt_len <= rank.model.topk else "") + "); "
            f"{len(plans) - len(fb)} of {len(plans)} prefill steps packed"
            + (f", {len(fb)} priced on the fallback ({real}): {fb[0].reason}" if fb else "")
            + f"; decode per token: {real}; prefill always sparse (no dense-MHA route)")
    if not _fa3_runs(arch):
        line = line.replace("fallback to FA3 sparse:", "fallback:")
    return {"strategy": strategy, "overlap": o, "overlap_assumed": True, "overlap_source": PACKED_OVERLAP_SOURCE,
            "steps": len(plans), "steps_packed": len(plans) - len(fb), "steps_fallback": len(fb),
            "fallback_reason": fb[0].reason if fb else "", "calibration": plans[0].source if plans else "",
            "scope": scope, "line": line}


def union_key_space(rank: RankView, prompt_len: int | None) -> int:
    """``s_kv`` of the union builder's scratch: ``max(max_num_batched_tokens, prompt_len)`` gathered keys (the lab's
    assumption, as vLLM's ``cp_gather_indexer_k_quant_cache`` gathers them; no engine runs it)."""
    return max(rank.max_num_batched_tokens, prompt_len or 0)


#: Groups the CUDA union builder takes (:mod:`mla_lab.kernels.union_cuda`; table in shared memory, no scratch).
CUDA_BUILDER_GROUPS = (1, 2, 4, 8)


def packed_union_bytes(rank: RankView, prompt_len: int | None) -> int:
    """Union-builder bytes (:func:`mla_lab.union_layout.union_buffer_bytes`): outputs, plus the Triton builder's
    scratch (:data:`PROGRAMS_PER_SM` x SMs) where it runs (g = 16); 0 where the heads cannot be packed."""
    g = packed_group_size(rank.num_heads, rank.arch.prefill_padding)
    if g is None:
        return 0
    progs = PROGRAMS_PER_SM * rank.arch.sm_count
    b = union_buffer_bytes(rank.max_num_batched_tokens, rank.model.topk, g, union_key_space(rank, prompt_len), progs)
    return b["outputs"] if g in CUDA_BUILDER_GROUPS else b["total"]
