"""Synthetic (modelled) top-k index data with known overlap between neighbouring tokens, for the packed kernel's union
(docs/packed.md): seeded, torch, CPU or CUDA; every generator returns :class:`IndexData`.

**The common-core model** (:func:`overlap_indices`): every token of a group holds the same ``m`` core keys (uniform
without replacement from ``[0, s_kv)``) plus ``topk - m`` private keys (uniform without replacement from the other
``s_kv - m``, per token). By linearity of expectation (a non-core key is private to a token with probability ``(topk
- m) / (s_kv - m)``)::

    E|A n B| = m + (topk - m)^2 / (s_kv - m)
    E|U_g|   = m + (s_kv - m) * (1 - (1 - (topk - m) / (s_kv - m))^g)

``m`` is the integer whose ``E|A n B| / topk`` (increasing in ``m``, from ``topk / s_kv`` to 1) is nearest the
requested ``overlap``. For ``s_kv >> g x topk``: ``U ~ topk x (1 + (g - 1) x (1 - overlap))``, 2.4 x topk at g 8,
overlap 0.8 (issue 36).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from pathlib import Path
from typing import NamedTuple

import torch

from ..paths import data_dir
from .contract import shape_of
from .union import build_union_ref

__all__ = ["IndexData", "overlap_indices", "overlap_union_expected", "causal_indices", "structured_indices",
           "union_sizes", "UnionSizeSummary", "published_overlaps", "PUBLISHED_FILE", "union_ratio_common_core"]

#: Where :func:`published_overlaps` reads (relative to the data folder, ``mla_lab.paths.data_dir``).
PUBLISHED_FILE = "overlap/published.json"
#: Tokens per chunk when scoring or sampling row by row (bounds memory: CHUNK x s_kv floats).
CHUNK = 256


class IndexData(NamedTuple):
    """``indices [T, topk]`` int32 (``-1`` = no key), ``topk_length [T]`` int32, ``s_kv`` (keys in the cache)."""

    indices: torch.Tensor
    topk_length: torch.Tensor
    s_kv: int


def _check_int(name, v, lo) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}; got {name}={v!r}")


def _gen(seed, device) -> torch.Generator:
    _check_int("seed", seed, 0)
    return torch.Generator(device=device).manual_seed(seed)


def _sample_distinct(rows: int, n: int, N: int, gen, device) -> torch.Tensor:
    """``[rows, n]`` int64: per row ``n`` distinct values uniform from ``[0, N)`` (random keys, top-n; by chunks)."""
    out = torch.empty(rows, n, dtype=torch.int64, device=device)
    if n == 0:
        return out
    for r0 in range(0, rows, CHUNK):
        r1 = min(rows, r0 + CHUNK)
        out[r0:r1] = torch.rand(r1 - r0, N, generator=gen, device=device).topk(n, dim=1).indices
    return out


def _expected_pairwise(m: int, topk: int, s_kv: int) -> float:
    rest = s_kv - m
    return (m + ((topk - m) ** 2 / rest if rest > 0 else 0.0)) / topk


def overlap_union_expected(topk: int, s_kv: int, overlap: float, g: int) -> dict:
    """The common-core model's ``{"m", "pairwise" (E|A n B| / topk at m), "union" (E|U_g|), "union_ratio" (union / (g
    x topk)), "min_overlap" (topk / s_kv, m = 0)}`` for a requested pairwise ``overlap`` (module docstring).

    Raises:
        ValueError: topk < 1, s_kv < topk, g < 1, overlap not in [topk / s_kv, 1].
    """
    _check_int("topk", topk, 1)
    _check_int("s_kv", s_kv, topk)
    _check_int("g", g, 1)
    lo = topk / s_kv
    if isinstance(overlap, bool) or not isinstance(overlap, (int, float)) or not (lo - 1e-12 <= overlap <= 1.0):
        raise ValueError(f"overlap must be a number in [topk/s_kv = {lo:.4g}, 1] (below it is less than random "
                         f"top-k); got overlap={overlap!r}")
    # _expected_pairwise increases with m: the nearest integer by bisection
    a = min(max(bisect_right(range(topk + 1), overlap, key=lambda x: _expected_pairwise(x, topk, s_kv)) - 1, 0),
            topk - 1)
    m = min((a, a + 1), key=lambda x: abs(_expected_pairwise(x, topk, s_kv) - overlap))
    rest = s_kv - m
    p = (topk - m) / rest if rest > 0 else 0.0
    union = m + rest * (1.0 - (1.0 - p) ** g)
    return {"m": m, "pairwise": _expected_pairwise(m, topk, s_kv), "union": union, "union_ratio": union / (g * topk),
            "min_overlap": lo}


def overlap_indices(T: int, topk: int, s_kv: int, overlap: float, g: int, seed: int = 0,
                    device: str | torch.device = "cpu") -> IndexData:
    """Groups of ``g`` consecutive tokens with expected pairwise overlap ``overlap`` (the common-core model), each
    token's list shuffled; no duplicates, ``topk_length = topk``, the last group may be partial.

    Args:
        T: tokens (>= 0); topk: >= 1; s_kv: >= topk; overlap: in ``[topk / s_kv, 1]``; g: >= 1; seed: int >= 0;
            device (one seed gives the same data on one device type).

    Raises:
        ValueError: an argument out of its range (one line naming it).
    """
    _check_int("T", T, 0)
    m = overlap_union_expected(topk, s_kv, overlap, g)["m"]
    gen = _gen(seed, device)
    G = -(-T // g)
    core = _sample_distinct(G, m, s_kv, gen, device)  # [G, m]
    ranks = _sample_distinct(T, topk - m, s_kv - m, gen, device)  # ranks among the non-core keys
    core_t = core.repeat_interleave(g, dim=0)[:T]
    # rank r among the keys not in the (sorted) core -> key r + #{core_i - i <= r}
    shifted = torch.sort(core_t, dim=1).values - torch.arange(m, device=device)
    private = ranks + torch.searchsorted(shifted, ranks, right=True)
    keys = torch.cat([core_t, private], dim=1)
    perm = torch.rand(T, topk, generator=gen, device=device).argsort(dim=1)
    keys = keys.gather(1, perm)
    return IndexData(keys.to(torch.int32), torch.full((T,), topk, dtype=torch.int32, device=device), s_kv)


def causal_indices(prompt_lens, topk: int, seed: int = 0, device: str | torch.device = "cpu") -> IndexData:
    """Whole prompts, causal top-k (the seed's case): request ``r``'s keys at offset ``sum(prompt_lens[:r])``, ``s_kv =
    max(total keys, topk)`` (:func:`.engine_libs.engine_inputs`' ``seed`` layout, but an exact prefix set). Position
    ``p`` selects its whole prefix when ``p + 1 <= topk`` (``topk_length = p + 1``, the rest ``-1``), else ``topk``
    distinct keys uniform from it. ``prompt_lens``: ints >= 1; ``T = sum(prompt_lens)``.

    Raises:
        ValueError: empty prompt_lens, a length < 1, topk < 1.
    """
    lens = list(prompt_lens) if not isinstance(prompt_lens, torch.Tensor) else prompt_lens.tolist()
    if not lens:
        raise ValueError("prompt_lens must hold at least one prompt length; got []")
    for i, L in enumerate(lens):
        _check_int(f"prompt_lens[{i}]", L, 1)
    _check_int("topk", topk, 1)
    gen = _gen(seed, device)
    T = sum(lens)
    base = torch.repeat_interleave(torch.tensor([sum(lens[:r]) for r in range(len(lens))], device=device),
                                   torch.tensor(lens, device=device))
    pos = torch.cat([torch.arange(L, device=device) for L in lens])
    visible = pos + 1
    idx = torch.arange(topk, device=device)[None, :].expand(T, topk).clone()
    long_rows = torch.nonzero(visible > topk).flatten()
    for r0 in range(0, long_rows.numel(), CHUNK):
        rows = long_rows[r0:r0 + CHUNK]
        score = torch.rand(rows.numel(), int(visible[rows].max()), generator=gen, device=device)
        score[torch.arange(score.shape[1], device=device)[None, :] >= visible[rows, None]] = -1.0
        idx[rows] = score.topk(topk, dim=1).indices
    tlen = torch.clamp(visible, max=topk)
    idx = torch.where(torch.arange(topk, device=device)[None, :] < tlen[:, None], idx + base[:, None], -1)
    return IndexData(idx.to(torch.int32), tlen.to(torch.int32), max(T, topk))


def structured_indices(T: int, topk: int, s_kv: int | None = None, positions: torch.Tensor | None = None,
                       window: int = 128, toeplitz_fraction: float = 0.5, content_keys: int = 64,
                       smooth: int = 32, seed: int = 0, device: str | torch.device = "cpu") -> IndexData:
    """One request's chunk of ``T`` query tokens, causal top-k by a structured score of key ``k`` for the query at
    position ``p`` (``d = p - k >= 0``): forced in, the window ``d < window`` (first) and ``content_keys`` keys fixed
    for the chunk (key 0, the sink, then keys uniform from ``1 ..`` the smallest position); else ``sqrt(f) * toe[d] +
    sqrt(1 - f) * N(0, 1)``, ``f = toeplitz_fraction``, ``toe`` a smoothed random profile over distance (the Toeplitz
    structure of indexer scores under RoPE: NVIDIA TensorRT-LLM tech blog 21 / arXiv 2604.22312).

    Args:
        T: query tokens (>= 1); topk (>= 1); exactly one of s_kv (the chunk is positions ``s_kv - T .. s_kv - 1``)
            or positions (``[T]`` ints, ``s_kv = max + 1``); window (>= 0), toeplitz_fraction in [0, 1],
            content_keys (>= 0), smooth (>= 1 keys), seed, device.

    Raises:
        ValueError: an argument out of range, both or neither of s_kv / positions, positions not 1-D, negative, or
            not of length T.
    """
    pos = _positions(T, s_kv, positions, device)
    s = int(pos.max()) + 1
    for name, v, lo in (("topk", topk, 1), ("window", window, 0), ("content_keys", content_keys, 0),
                        ("smooth", smooth, 1)):
        _check_int(name, v, lo)
    f = toeplitz_fraction
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f <= 1.0:
        raise ValueError(f"toeplitz_fraction must be a number in [0, 1]; got toeplitz_fraction={f!r}")
    gen = _gen(seed, device)
    # [s] unit-variance random profile over distance, a moving average of `smooth` keys (offsets come in runs)
    x = torch.randn(s + smooth, generator=gen, device=device)
    c = torch.cumsum(torch.cat([torch.zeros(1, device=device), x]), 0)
    toe = (c[smooth:] - c[:-smooth])[:s] / math.sqrt(smooth)
    content = torch.zeros(s, dtype=torch.bool, device=device)
    if content_keys:  # key 0, then keys every query of the chunk sees (1 .. the smallest position)
        content[0] = True
        p_min = int(pos.min())
        content[1 + torch.randperm(p_min, generator=gen, device=device)[: content_keys - 1]] = True
    keys = torch.arange(s, device=device)
    out = torch.full((T, topk), -1, dtype=torch.int64, device=device)
    for r0 in range(0, T, CHUNK):
        p = pos[r0:r0 + CHUNK, None]
        d = p - keys[None, :]
        score = math.sqrt(f) * toe[d.clamp(min=0)] + math.sqrt(1 - f) * torch.randn(
            d.shape, generator=gen, device=device)
        score = torch.where(content[None, :], torch.full_like(score, 1e30), score)
        score = torch.where((d >= 0) & (d < window), torch.full_like(score, 2e30), score)
        score = torch.where(d < 0, torch.full_like(score, -math.inf), score)
        k = min(topk, s)
        top = score.topk(k, dim=1)
        out[r0:r0 + CHUNK, :k] = torch.where(top.values > -math.inf, top.indices, -1)
    tlen = torch.clamp(pos + 1, max=topk)
    return IndexData(out.to(torch.int32), tlen.to(torch.int32), s)


def _positions(T, s_kv, positions, device) -> torch.Tensor:
    _check_int("T", T, 1)
    if (s_kv is None) == (positions is None):
        raise ValueError(f"give exactly one of s_kv or positions; got s_kv={s_kv!r}, positions="
                         f"{'None' if positions is None else 'a tensor'}")
    if positions is None:
        _check_int("s_kv", s_kv, T)
        return torch.arange(s_kv - T, s_kv, device=device)
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.shape[0] != T:
        raise ValueError(f"positions must be a 1-D tensor [T={T}]; got positions.shape={shape_of(positions)}")
    if int(positions.min()) < 0:
        raise ValueError(f"positions must be >= 0; got min {int(positions.min())}")
    return positions.to(device=device, dtype=torch.int64)


class UnionSizeSummary(NamedTuple):
    """Union sizes of the complete groups (all when none is complete): ``mean``, ``median``, ``p90`` in keys
    (``torch.quantile``, linear), ``ratio = mean / (g x topk)`` (packed work over padded)."""

    g: int
    topk: int
    groups: int
    mean: float
    median: float
    p90: float
    ratio: float


def union_sizes(indices: torch.Tensor, topk_length: torch.Tensor | None, g: int,
                s_kv: int | None = None) -> UnionSizeSummary:
    """:class:`UnionSizeSummary` of :func:`.union.build_union_ref`'s unions (``s_kv`` None: ``max(indices) + 1``).

    Raises:
        ValueError: as :func:`.union.build_union_ref`; T = 0 (no group to summarise).
    """
    if isinstance(indices, torch.Tensor) and indices.dim() == 2 and indices.shape[0] == 0:
        raise ValueError("indices must hold at least one token to summarise; got indices.shape[0]=0")
    if s_kv is None and isinstance(indices, torch.Tensor):
        s_kv = max(1, int(indices.max()) + 1) if indices.numel() else 1
    u = build_union_ref(indices, topk_length, g, s_kv).union_len.double()
    T, topk = indices.shape
    full = T // g
    if full:
        u = u[:full]
    q = torch.quantile(u, torch.tensor([0.5, 0.9], dtype=torch.float64, device=u.device))
    mean = float(u.mean())
    return UnionSizeSummary(g, topk, u.numel(), mean, float(q[0]), float(q[1]),
                            mean / (g * topk) if topk else float("nan"))


def union_ratio_common_core(overlap: float, g: int) -> float:
    """``U / (g x topk)`` for g tokens whose neighbours share a fraction ``overlap`` of their top-k.

    ``U <= topk x (1 + (g - 1) x (1 - overlap))``: each token adds at most the keys it does not share with its
    predecessor. Equality holds in the common-core model with ``s_kv >> g x topk`` and in a drift chain whose dropped
    keys never return; keys that return make U smaller. So the mapped ratio is an upper bound on the union given the
    neighbour overlap."""
    return (1.0 + (g - 1) * (1.0 - overlap)) / g


_PUBLISHED_FIELDS = ("id", "figure", "source", "model", "layers", "context", "measures", "overlap_low",
                     "overlap_high", "mapping", "ratio_g8_low", "ratio_g8_high", "note")


def published_overlaps(path=None) -> list[dict]:
    """The published overlap figures of ``data/overlap/published.json``, each with :data:`_PUBLISHED_FIELDS`:
    ``overlap_low`` / ``_high`` (``|A n B| / topk``, null where the source gives none), ``ratio_g8_low`` / ``_high``
    (``U / (8 x topk)`` by :func:`union_ratio_common_core`), ``source`` (URL / identifier), ``mapping``, ``note``.

    Raises:
        ValueError: the file is missing, not a JSON list, or an entry lacks a field.
    """
    p = Path(path) if path is not None else data_dir() / PUBLISHED_FILE
    if not p.is_file():
        raise ValueError(f"published overlap file {p} does not exist (the repository ships {PUBLISHED_FILE})")
    rows = json.loads(p.read_text())
    if not isinstance(rows, list):
        raise ValueError(f"{p} must hold a JSON list of entries; got {type(rows).__name__}")
    for i, r in enumerate(rows):
        missing = [f for f in _PUBLISHED_FIELDS if f not in r]
        if missing:
            raise ValueError(f"{p} entry {i} ({r.get('id', '?')}) lacks {missing}")
    return rows
