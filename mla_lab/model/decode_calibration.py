"""The decode calibration (``data/calibration/h200_decode.csv``, ``python -m mla_lab.fits decode``): what the layer
model lacks at decode batch sizes, used by :class:`mla_lab.serving.step_pricer.CostModelPricer` on top of the prefill
:class:`~mla_lab.model.calibration.Calibration`: graph-replay overheads, the decode indexer, top-k and sparse kernel,
a per-layer cost, the eager launch model, the fp8 MoE decode fit (``h200_moe_decode.csv``) and a small all-reduce
latency (:data:`DECODE_ALLREDUCE_LATENCY_US`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..arch import GPUArch
from ..paths import calibration_dir
from .calibration import Calibration, ClassEff, csv_rows, load_file, write_calibration_csv

#: The decode calibration's and the fp8 MoE decode fit's file names (in :func:`mla_lab.paths.calibration_dir`).
DECODE_CSV, MOE_DECODE_CSV = "h200_decode.csv", "h200_moe_decode.csv"

#: Fixed cost (us) of one small all-reduce over 8 Hopper GPUs, assumption (cited): NCCL's tuning-model time for a
#: 4-8 KiB all-reduce on H100 (25.87 / 26.55 us in the NCCL_DEBUG log of github.com/NVIDIA/nccl/issues/1453).
DECODE_ALLREDUCE_LATENCY_US = 26.0
#: All-reduces below this size (B) pay it: the smallest the TP=2 fit prices (48 MiB measured / COMM_FIT_RANGE_FACTOR).
DECODE_ALLREDUCE_MAX_BYTES = 24 * 2**20
DECODE_ALLREDUCE_SOURCE = ("assumption (cited): +26 us per all-reduce below 24 MiB, NCCL tuning-model time for "
                           "4-8 KiB on H100, github.com/NVIDIA/nccl/issues/1453")


@dataclass(frozen=True)
class KernelDecode:
    """The sparse kernel on decode tokens: ``a_us + (lat^p + flop^p + kv^p)^(1/p)`` us; ``us_per_key``: one CTA's
    time per key (us), ``eff_bytes``: the KV-row reads' fraction of HBM bandwidth."""

    a_us: float
    us_per_key: float
    eff_bytes: float
    p: float

    def ms(self, flop_ms: float, max_keys: int, sum_keys: int, row_bytes: int, arch: GPUArch) -> float:
        """Kernel time (ms) for decode tokens with ``max_keys`` / ``sum_keys`` keys and the flop roofline ``flop_ms``."""
        if sum_keys <= 0:
            return flop_ms
        lat = self.us_per_key * max_keys
        kv = sum_keys * row_bytes / (arch.hbm_gbps * 1e9 * self.eff_bytes) * 1e6
        fl = flop_ms * 1e3
        return (self.a_us + (lat ** self.p + fl ** self.p + kv ** self.p) ** (1.0 / self.p)) * 1e-3


@dataclass(frozen=True)
class DecodeCalibration:
    """What the layer model lacks at decode batch sizes (module docstring); times in us. ``graph_floors``:
    ``{op_class: (overhead_us, mode)}`` in a CUDA graph (fp8 classes borrow their bf16 twin's); ``attn_floor_us``:
    per attention byte-op kernel; ``topk_decode``: ``(f_us, us_per_key_row, us_per_key_batch)``; ``eager_form``:
    ``max``, ``add`` or ``max+add`` (the fit's choice); ``fit``: its MAPEs; ``moe_fp8``: :func:`load_moe_decode_fit`
    or None; ``allreduce_latency_us``: below :data:`DECODE_ALLREDUCE_MAX_BYTES` with no measured fit.
    """

    graph_floors: dict
    attn_floor_us: dict
    idx_decode: ClassEff
    topk_decode: tuple
    kernel_decode: KernelDecode
    layer_fixed_us: float = 0.0
    host_us_per_op: float = 0.0
    eager_gap_us: float = 0.0
    eager_form: str = "max+add"
    name: str = "uncalibrated"
    fit: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    moe_fp8: dict | None = None
    allreduce_latency_us: float = DECODE_ALLREDUCE_LATENCY_US

    def graph_calibration(self, cal: Calibration) -> Calibration:
        """``cal`` with every roofline class's overhead replaced by its graph-replay overhead."""
        classes = dict(cal.classes)
        twins = {"gemm_fp8": "gemm", "moe_gemm_fp8": "moe_gemm"}
        for cls in set(classes) | set(self.graph_floors) | set(twins):
            src = cls if cls in self.graph_floors else twins.get(cls)
            if src not in self.graph_floors:
                continue
            base = classes.get(cls) or cal.eff(cls)
            fl, mode = self.graph_floors[src]
            classes[cls] = replace(base, floor_us=float(fl), mode=mode)
        if self.moe_fp8 is not None:  # measured-fit: a per MoE block over its two grouped GEMMs
            base = classes.get("moe_gemm_fp8") or cal.eff("moe_gemm_fp8")
            classes["moe_gemm_fp8"] = replace(base, eff_bytes=float(self.moe_fp8["eff_bytes"]),
                                              floor_us=float(self.moe_fp8["a_us"]) / 2.0, mode="add")
        out = replace(cal, classes=classes, name=f"{cal.name} + graph overheads ({self.name})")
        if self.allreduce_latency_us > 0:
            out = out.with_small_comm_latency(self.allreduce_latency_us, DECODE_ALLREDUCE_MAX_BYTES,
                                              DECODE_ALLREDUCE_SOURCE)
        return out

    def topk_ms(self, max_ctx: int, sum_ctx: int) -> float:
        """Decode top-k time (ms) of a batch whose longest context is ``max_ctx`` and whose contexts sum to
        ``sum_ctx``."""
        if sum_ctx <= 0:
            return 0.0
        f, a, b = self.topk_decode
        return (f + a * max_ctx + b * sum_ctx) * 1e-3


_PARAMS = ("graph_floor", "attn_floor", "idx_decode", "topk_decode", "kernel_decode", "layer", "launch", "fit")


def decode_calibration_rows(dcal: DecodeCalibration, provenance: dict | None = None) -> list[dict]:
    """``dcal`` as one row per parameter (``group, key, value, mode, unit, meaning``) with the ``provenance``
    columns (default ``dcal.provenance``) on every row: the rows of ``h200_decode.csv``."""
    prov = dict(provenance if provenance is not None else dcal.provenance)
    rows = []

    def add(group, key, value, unit, meaning, mode=""):
        rows.append({"group": group, "key": key, "value": repr(float(value)), "mode": mode, "unit": unit,
                     "meaning": meaning})

    for cls, (fl, mode) in sorted(dcal.graph_floors.items()):
        add("graph_floor", cls, fl, "us", "per-op overhead of the class replayed in a CUDA graph", mode)
    for op, us in sorted(dcal.attn_floor_us.items()):
        add("attn_floor", op, us, "us", "fixed cost per kernel of the attention-path byte op")
    e = dcal.idx_decode
    add("idx_decode", "eff_flops", e.eff_flops, "fraction", "indexer logits of decode tokens: of dense bf16 TFLOP/s")
    add("idx_decode", "eff_bytes", e.eff_bytes, "fraction", "indexer logits of decode tokens: of HBM GB/s")
    add("idx_decode", "floor_us", e.floor_us, "us", "indexer logits of decode tokens: overhead", e.mode)
    for k, v, u in zip(("f_us", "us_per_key_row", "us_per_key_batch"), dcal.topk_decode, ("us", "us/key", "us/key")):
        add("topk_decode", k, v, u, "decode top-k: f + a * max(c) + b * sum(c)")
    for k, u in (("a_us", "us"), ("us_per_key", "us/key"), ("eff_bytes", "fraction"), ("p", "1")):
        add("kernel_decode", k, getattr(dcal.kernel_decode, k), u, "sparse kernel on decode tokens (KernelDecode)")
    add("layer", "layer_fixed_us", dcal.layer_fixed_us, "us", "fixed GPU cost per layer")
    add("launch", "host_us_per_op", dcal.host_us_per_op, "us", "eager: host launch cost per op", dcal.eager_form)
    add("launch", "eager_gap_us", dcal.eager_gap_us, "us", "eager: idle GPU gap per op", dcal.eager_form)
    for k, v in sorted(dcal.fit.items()):
        add("fit", k, v, "%", "validation MAPE (decode_validation.csv)")
    return [{**r, **{k: v for k, v in prov.items() if k not in r}} for r in rows]


def write_decode_calibration(dcal: DecodeCalibration, path: str | Path, provenance: dict | None = None) -> Path:
    """Write :func:`decode_calibration_rows` to ``path`` (its folder created). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = decode_calibration_rows(dcal, provenance)
    write_calibration_csv(rows, path, {}, columns=list(rows[0]))
    return path


def _read_decode(p: Path) -> DecodeCalibration:
    rows = csv_rows(p)
    vals: dict = {}
    modes: dict = {}
    try:
        for r in rows:
            if r["group"] not in _PARAMS:
                raise ValueError(f"group={r['group']!r} not one of {list(_PARAMS)}")
            v = float(r["value"])
            if not math.isfinite(v):
                raise ValueError(f"value {r['value']!r} is not finite")
            vals[(r["group"], r["key"])] = v
            modes[(r["group"], r["key"])] = r.get("mode") or ""
        prov = {c: v for c, v in (rows[0] if rows else {}).items() if c not in ("group", "key", "value", "mode",
                                                                               "unit", "meaning")}
        return DecodeCalibration(
            {k: (v, modes[(g, k)] or "add") for (g, k), v in vals.items() if g == "graph_floor"},
            {k: v for (g, k), v in vals.items() if g == "attn_floor"},
            ClassEff(vals[("idx_decode", "eff_flops")], vals[("idx_decode", "eff_bytes")],
                     vals[("idx_decode", "floor_us")], mode=modes[("idx_decode", "floor_us")] or "add"),
            tuple(vals[("topk_decode", k)] for k in ("f_us", "us_per_key_row", "us_per_key_batch")),
            KernelDecode(*(vals[("kernel_decode", k)] for k in ("a_us", "us_per_key", "eff_bytes", "p"))),
            vals[("layer", "layer_fixed_us")], vals[("launch", "host_us_per_op")], vals[("launch", "eager_gap_us")],
            modes[("launch", "host_us_per_op")] or "max+add",
            f"{p.name} (measured on {prov.get('device') or prov.get('gpu') or '?'})",
            {k: v for (g, k), v in vals.items() if g == "fit"}, prov,
            moe_fp8=load_moe_decode_fit(p.parent / MOE_DECODE_CSV))
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(f"{p}: not a decode calibration ({type(e).__name__}: {e})") from None


def load_decode_calibration(path: str | Path | None = None) -> DecodeCalibration:
    """The decode calibration in ``path`` (default ``data/calibration/h200_decode.csv``) through ``load_file``.
    Raises ValueError: the file does not exist (says how to make it) or a row is malformed (names it)."""
    dcal = load_file(_read_decode, DECODE_CSV, path)
    if dcal is None:
        raise ValueError(f"decode calibration path={str(path or calibration_dir() / DECODE_CSV)!r} does not exist; "
                         "run `python -m mla_lab.fits decode` to fit it from data/measured/h200/round2/decode_layer.csv")
    return dcal


def _read_moe_decode(p: Path) -> dict:
    rows = csv_rows(p)
    try:
        vals = {r["key"]: float(r["value"]) for r in rows}
        out = {k: vals[k] for k in ("a_us", "eff_bytes", "bw_gbps", "mape_in_pct", "mape_loo_pct")}
        if not all(math.isfinite(v) and v >= 0 for v in out.values()) or out["eff_bytes"] <= 0:
            raise ValueError(f"non-finite or non-positive value in {out}")
        out["n_processes"] = int(rows[0]["n_processes"])
        out["source"] = f"{rows[0]['source']} ({p.name}, {rows[0]['data_file']}, {out['n_processes']} processes)"
    except (KeyError, ValueError, TypeError, IndexError) as e:
        raise ValueError(f"{p}: not an fp8 MoE decode fit ({type(e).__name__}: {e})") from None
    return out


def load_moe_decode_fit(path: str | Path | None = None) -> dict | None:
    """The fp8 MoE decode fit in ``path`` (default ``data/calibration/h200_moe_decode.csv``): ``{"a_us",
    "eff_bytes", "bw_gbps", "mape_in_pct", "mape_loo_pct", "n_processes", "source"}`` or None (no file).
    Raises ValueError: the file is malformed (names it and what is missing)."""
    return load_file(_read_moe_decode, MOE_DECODE_CSV, path)
