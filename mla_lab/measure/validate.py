"""Fit the cost model's efficiencies on a layer run's op rows (``layer_ops.csv``, ``layer_e2e.csv``,
``layer_extras.csv`` of ``mla_lab/measure/experiments/layer_calibration.py``) and validate it, in sample and leave
one model out. Writes the calibration CSV (:func:`mla_lab.model.calibration.fit_calibration` over the ``ok`` op rows,
with the measurements' provenance and ``fit_commit``) and ``layer_validation.csv`` (:data:`VALIDATION_COLUMNS`,
``source`` ``modelled``) at levels:

- ``op``: each op row against :func:`mla_lab.model.timing.predict_measured_op_ms` (``in_sample``; with more than one
  model also ``leave_model_out``);
- ``layer`` / ``layer_<mode>``: each end-to-end layer against the sum of its ops' predictions (one GPU, no comm:
  ``lm_head``, communication and ``excluded_ops`` left out);
- ``layer_delta`` / ``layer_<mode>_delta``: ``per_call_zeros`` minus ``private_workspace`` per layer (the first
  version's ``unfused`` / ``fused``: :func:`mla_lab.placement.measured_as`; APE relative to the measured difference);
- ``extra``: the sparse kernel with causal ``topk_length`` against FLOPs at the fitted kernel efficiency.

Refit door: ``python -m mla_lab.measure.validate --fit-only DIR --cal-out PATH [--validation-out PATH]
[--overwrite]`` (the folder read is never written).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

from ..arch import GPUArch, get_arch
from ..model.calibration import Calibration, csv_rows, fit_calibration, write_calibration_csv
from ..model.ops import layer_ops
from ..model.timing import op_time_ms, predict_measured_op_ms
from ..models import ModelConfig, load_model
from ..paths import is_committed
from ..placement import measured_as
from ..provenance import PROVENANCE_COLUMNS, provenance
from .layer import CALIBRATION_CSV, E2E_CSV, EXTRAS_CSV, OPS_CSV, VALIDATION_CSV
from .layer_runs import measured_rank

#: Columns of ``layer_validation.csv`` before the provenance columns.
VALIDATION_COLUMNS = ["level", "split", "model", "tp", "moe_parallel", "T", "name", "op_class", "measured_ms",
                      "predicted_ms", "ape_pct"]


def leave_one_model_out(op_rows: list[dict], arch: GPUArch) -> dict[str, Calibration]:
    """``{model: calibration fitted on the other models' op rows}``; empty with fewer than two models."""
    names = sorted({r["model"] for r in op_rows})
    if len(names) < 2:
        return {}
    return {name: fit_calibration([r for r in op_rows if r["model"] != name], arch, name=f"without {name}")[0]
            for name in names}


def _row(level, split, source, measured_ms, predicted_ms, name, op_class) -> dict:
    return {"level": level, "split": split, "model": source.get("model"), "tp": source.get("tp"),
            "moe_parallel": source.get("moe_parallel", ""), "T": source.get("T"), "name": name, "op_class": op_class,
            "measured_ms": measured_ms, "predicted_ms": predicted_ms,
            "ape_pct": abs(predicted_ms - measured_ms) / measured_ms * 100}


def validation_rows(op_rows: list[dict], e2e_rows: list[dict], extras_rows: list[dict], arch: GPUArch,
                    models_by_name: dict[str, ModelConfig], calibration: Calibration,
                    held_out: dict[str, Calibration] | None = None) -> list[dict]:
    """Measured vs predicted rows (:data:`VALIDATION_COLUMNS`) at every level of the module docstring, from the
    ``ok`` op / e2e rows and the extras (strings, as read); e2e rows of models not in ``models_by_name`` skipped;
    ``held_out``: :func:`leave_one_model_out`."""
    held_out = held_out or {}
    rows = [_row("op", "in_sample", r, float(r["ms"]), predict_measured_op_ms(r, arch, calibration), r["op"],
                 r["op_class"]) for r in op_rows]
    for name, held_calibration in held_out.items():
        rows += [_row("op", "leave_model_out", r, float(r["ms"]), predict_measured_op_ms(r, arch, held_calibration),
                      r["op"], r["op_class"]) for r in op_rows if r["model"] == name]
    by_layer: dict = {}
    rows += _layer_rows(e2e_rows, arch, models_by_name, calibration, held_out, by_layer)
    rows += _delta_rows(by_layer)
    kernel_eff = calibration.attention.get("kernel")
    for r in extras_rows:
        if r.get("experiment") == "kernel_topk_length" and r.get("ms"):
            predicted = float(r["flops"]) / (arch.bf16_tflops * 1e12 * kernel_eff) * 1e3
            rows.append(_row("extra", "in_sample", r, float(r["ms"]), predicted, r["name"], "attn_kernel"))
    return rows


def _layer_rows(e2e_rows, arch, models_by_name, calibration, held_out, by_layer: dict) -> list[dict]:
    """Per layer: the sum of its ops' predictions vs the end-to-end measurement; in-sample rows also into
    ``by_layer`` (for :func:`_delta_rows`)."""
    rows, ranks = [], {}
    for r in e2e_rows:
        model = models_by_name.get(r["model"])
        if model is None:
            continue
        excluded = (r.get("excluded_ops") or "").split(";")
        strategy = measured_as(r["strategy"])
        key = (r["model"], int(r["tp"]), r["moe_parallel"], int(r["ep"]))
        if key not in ranks:  # one view per measured point, at the door (bf16 weights: the runner's)
            ranks[key] = measured_rank(model, key[1], arch, (key[2], key[3]))
        ops = [op for op in layer_ops(ranks[key], strategy, int(r["T"]), layer_kind=r["layer_kind"],
                                      out_slice_copy=False)
               if op.impl and not op.is_comm and op.name != "lm_head" and op.name not in excluded]
        splits = [("in_sample", calibration)] + ([("leave_model_out", held_out[r["model"]])]
                                                  if r["model"] in held_out else [])
        mode = r.get("mode") or "eager"
        level = "layer" if mode == "eager" else f"layer_{mode}"
        for split, split_calibration in splits:
            predicted = sum(op_time_ms(op, arch, split_calibration) for op in ops)
            rows.append(_row(level, split, r, float(r["ms"]), predicted, f"{r['layer_kind']}_{r['strategy']}", level))
            if split == "in_sample":
                key = (rows[-1]["model"], rows[-1]["tp"], rows[-1]["moe_parallel"], rows[-1]["T"], r["layer_kind"],
                       level)
                by_layer.setdefault(key, {})[strategy] = (r["strategy"], rows[-1])
    return rows


def _delta_rows(by_layer: dict) -> list[dict]:
    """Per-call pad minus private workspace per layer: measured vs predicted (ms)."""
    rows = []
    for (model_name, tp, parallel, T, kind, level), strategies in by_layer.items():
        if "per_call_zeros" in strategies and "private_workspace" in strategies:
            (label_a, a), (label_b, b) = strategies["per_call_zeros"], strategies["private_workspace"]
            measured = a["measured_ms"] - b["measured_ms"]
            predicted = a["predicted_ms"] - b["predicted_ms"]
            rows.append({"level": level + "_delta", "split": "in_sample", "model": model_name, "tp": tp,
                         "moe_parallel": parallel, "T": T, "name": f"{kind}_{label_a}_minus_{label_b}",
                         "op_class": "delta", "measured_ms": measured, "predicted_ms": predicted,
                         "ape_pct": abs(predicted - measured) / abs(measured) * 100 if measured else float("nan")})
    return rows


def mape_summary(rows: list[dict]) -> dict[tuple[str, str, str], tuple[int, float, float]]:
    """``{(level, split, op_class): (n, MAPE %, max APE %)}`` of :func:`validation_rows`, keys sorted."""
    apes: dict = {}
    for v in rows:
        apes.setdefault((v["level"], v["split"], v["op_class"]), []).append(v["ape_pct"])
    return {k: (len(a), sum(a) / len(a), max(a)) for k, a in sorted(apes.items())}


def fit_and_validate(out_dir: str | Path, arch: GPUArch, fit_provenance: dict, models_by_name: dict[str, ModelConfig],
                     calibration_path: str | Path | None = None,
                     log: Callable[[str], None] = print,
                     validation_path: str | Path | None = None) -> Calibration | None:
    """Fit on ``out_dir``'s run, write the calibration CSV (default ``out_dir/h200_ops.csv``) and the validation CSV
    (default ``out_dir/layer_validation.csv``) and log the MAPE table and the fitted efficiencies. ``arch``: the GPU
    measured; ``fit_provenance``: the calibration rows' provenance (the validation rows': with ``source``
    ``modelled``). Returns the in-sample :class:`~mla_lab.model.calibration.Calibration`, or None (nothing
    written) without an ``ok`` op row."""
    out_dir = Path(out_dir)
    op_rows = [r for r in csv_rows(out_dir / OPS_CSV) if r.get("status") == "ok"]
    e2e_rows = [r for r in csv_rows(out_dir / E2E_CSV) if r.get("status") == "ok"]
    extras_rows = csv_rows(out_dir / EXTRAS_CSV)
    if not op_rows:
        log("no op rows to fit")
        return None
    calibration, report = fit_calibration(op_rows, arch,
                                          name=f"{CALIBRATION_CSV} (measured on {op_rows[0].get('device', '?')})")
    write_calibration_csv(report, Path(calibration_path) if calibration_path else out_dir / CALIBRATION_CSV,
                          fit_provenance)
    rows = validation_rows(op_rows, e2e_rows, extras_rows, arch, models_by_name, calibration,
                           leave_one_model_out(op_rows, arch))
    write_calibration_csv(rows, Path(validation_path) if validation_path else out_dir / VALIDATION_CSV,
                          {**fit_provenance, "source": "modelled"}, columns=list(rows[0]))
    log("MAPE per op class (level, split, class: n, MAPE %, max APE %):")
    for (level, split, op_class), (n, mape, worst) in mape_summary(rows).items():
        log(f"  {level:5s} {split:15s} {op_class:16s} n={n:3d} MAPE={mape:6.1f}% max={worst:6.1f}%")
    for fitted in report:
        log(f"  eff {fitted['kind']:9s} {fitted['op_class']:16s} flops={fitted['eff_flops']:.3f} "
            f"bytes={fitted['eff_bytes']:.3f} overhead={fitted['floor_us']}us ({fitted['overhead_mode']}) "
            f"n={fitted['n']} mape={fitted['mape_pct']:.1f}%")
    return calibration


def _outputs(ap, a) -> tuple[Path, Path]:
    """``--cal-out`` (required) and ``--validation-out`` (default beside it), checked before anything is fitted: a
    committed file is replaced only with ``--overwrite``; a folder or an unwritable path never."""
    if not a.cal_out:
        ap.error(f"--fit-only {a.fit_only} needs --cal-out PATH (the calibration CSV to write; nothing is written "
                 "into the folder read), e.g. --cal-out /tmp/h200_ops.csv")
    cal = Path(a.cal_out)
    val = Path(a.validation_out) if a.validation_out else cal.with_name(VALIDATION_CSV)
    if cal.resolve() == val.resolve():
        ap.error(f"--cal-out and --validation-out are one file ({cal}); allowed: two paths")
    for flag, p in (("--cal-out", cal), ("--validation-out", val)):
        if p.is_dir() or (p.exists() and not p.is_file()):
            ap.error(f"{flag} {p} is not a regular file; allowed: a CSV path")
        if is_committed(p) and not a.overwrite:
            ap.error(f"{flag} {p} is a committed file (tracked by git); allowed: another path, or --overwrite to "
                     "replace it")
        folder = next((q for q in [p.parent.absolute(), *p.parent.absolute().parents] if q.exists()), None)
        if folder is None or not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK) or \
                (p.exists() and not os.access(p, os.W_OK)):
            ap.error(f"{flag} {p} is not writable; allowed: a path in a writable folder")
        p.parent.mkdir(parents=True, exist_ok=True)
    return cal, val


def main(argv=None) -> int:
    """The refit door (module docstring); exit 2 (argparse) on bad paths."""
    ap = argparse.ArgumentParser(prog="python -m mla_lab.measure.validate",
                                 description="Refit the calibration and its validation from a layer run's CSVs.")
    ap.add_argument("--fit-only", required=True, metavar="DIR", help="refit from the CSVs in DIR (read only)")
    ap.add_argument("--cal-out", default=None, help="the calibration CSV to write (required)")
    ap.add_argument("--validation-out", default=None, help="the validation CSV (default beside --cal-out)")
    ap.add_argument("--overwrite", action="store_true", help="let the outputs replace a committed file")
    a = ap.parse_args(argv)
    cal, val = _outputs(ap, a)
    ops = csv_rows(Path(a.fit_only) / OPS_CSV)
    prov = {k: ops[0][k] for k in PROVENANCE_COLUMNS if k in ops[0]} if ops else provenance("modelled")
    prov["fit_commit"] = provenance("modelled")["git_commit"]
    models = {n: load_model(n) for n in ("glm-5", "deepseek-v3.2")}
    fit_and_validate(a.fit_only, get_arch("h200"), prov, models, cal, log=print, validation_path=val)
    return 0


if __name__ == "__main__":
    sys.exit(main())
