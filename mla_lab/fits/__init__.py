"""The calibration fits: one :class:`Fit` per file of ``data/calibration/`` (:data:`FITS`: to add a fit, one
function ``measured folder -> {file: rows}`` and one entry), beside the model's loader of the file; and the written
prediction of vLLM PR #53878's run (:mod:`.predict_pr53878`, not a fit). Bad input: one line on stderr, exit 2,
nothing written; each file is replaced whole or not at all.

    python -m mla_lab.fits NAME|all [--measured-dir data/measured] [--out-dir data/calibration] [--overwrite]
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..model.calibration import load_calibration, load_subchunk_graph_overhead, load_subchunk_overhead
from ..model.comm import load_comm_model
from ..model.content import load_content_model, load_step_content_model
from ..model.decode_calibration import load_decode_calibration, load_moe_decode_fit
from ..model.decode_kernels import fit_decode_kernels_file, load_decode_kernels
from ..model.packed_kernel import fit_packed_file, load_packed_fit
from ..paths import calibration_dir, measured_dir
from . import decode, files


@dataclass(frozen=True)
class Fit:
    """How one calibration ``file`` is made from its ``inputs`` (under ``data/measured/``) by ``fit`` (``measured
    folder -> {file: rows}``; a by-product table is a path with a ``/`` under the measured folder) and read by
    ``load``; ``volatile``: columns naming the fit's run (its commit), not its result."""

    file: str
    inputs: tuple[str, ...]
    fit: Callable[[Path], dict]
    load: Callable
    volatile: tuple[str, ...] = ("fit_commit",)


_H = "h200/between_process/"
#: name -> the fit of one calibration file. Elsewhere: ``h200_ops.csv`` (``mla_lab.measure.validate.fit_and_validate``);
#: not fitted: ``h200_reference.csv`` (do_bench medians, read by
#: :func:`~mla_lab.model.calibration.attention_from_reference`).
FITS: dict[str, Fit] = {
    "comm": Fit("h200_comm.csv", ("h200x<n>/allreduce.csv", "h200x2/tp2_attention.csv"), files.fit_comm_file,
                load_comm_model),
    "content": Fit("h200_content.csv", ("h200/round2/content.csv",), files.fit_content_file, load_content_model),
    "subchunk": Fit("h200_subchunk.csv", ("h200/round2/presets.csv",), files.fit_subchunk_file, load_subchunk_overhead),
    "subchunk_graph": Fit("h200_subchunk_graph.csv", (_H + "subgraph.csv",), files.fit_subchunk_graph_file,
                          load_subchunk_graph_overhead),
    "content_step": Fit("h200_content_step.csv", (_H + "content_loop.csv",), files.fit_content_step_file,
                        load_step_content_model),
    "decode_kernels": Fit("h200_decode_kernels.csv", (_H + "engine_kernels.csv",), fit_decode_kernels_file,
                          load_decode_kernels, ()),
    "packed": Fit("h200_packed.csv", (_H + "packed_kernels.csv",), fit_packed_file, load_packed_fit, ()),
    "moe_decode": Fit("h200_moe_decode.csv", (_H + "moe_decode.csv",), files.fit_moe_decode_file, load_moe_decode_fit),
    "routes": Fit("h200_routes.csv", ("h200/round2/content.csv", "h200/layer_ops.csv", "h200/attention_path.csv",
                                      _H + "routes.csv"), files.fit_routes_file, load_calibration),
    # the label of the prefill calibration underneath (now naming h200_routes.csv beside it): not a fitted value
    "decode": Fit("h200_decode.csv", ("h200/round2/decode_ops.csv", "h200/round2/decode_layer.csv"),
                  decode.fit_decode_file, load_decode_calibration, ("fit_commit", "calibration")),
}


def render(rows) -> str:
    """The CSV text of ``rows``: a list of dicts via :class:`csv.DictWriter`, a DataFrame via ``to_csv`` (no index)."""
    if isinstance(rows, pd.DataFrame):
        return rows.to_csv(index=False)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _refuse_target(path: Path, text: str, overwrite: bool) -> str | None:
    """Why ``path`` may not be replaced by ``text`` (None: it may)."""
    if path.is_dir():
        return f"{path} is a folder; allowed: a file path"
    if not path.exists():
        return None
    if not overwrite:
        return f"{path} exists; pass --overwrite to replace it"
    with open(path, newline="") as f:
        head = next(csv.reader(f), [])
    if head != next(csv.reader(io.StringIO(text)), []):
        return f"{path} exists and its header is not this fit's; refusing to overwrite a file the lab did not write"
    return None


def refit(name: str, measured: Path | None = None, out_dir: Path | None = None, overwrite: bool = False) -> list[Path]:
    """Fit ``FITS[name]`` on the rows under ``measured`` and write its files (calibration files into ``out_dir``).

    Raises:
        ValueError: an unknown name, a missing folder, a file that may not be replaced (nothing written then).
    """
    if name not in FITS:
        raise ValueError(f"name={name!r} is not a fit; allowed: {sorted(FITS)} or 'all'")
    measured = Path(measured) if measured is not None else measured_dir()
    out_dir = Path(out_dir) if out_dir is not None else calibration_dir()
    if not measured.is_dir():
        raise ValueError(f"--measured-dir {str(measured)!r} is not an existing folder")
    texts = {(measured if "/" in f else out_dir) / f: render(rows) for f, rows in FITS[name].fit(measured).items()}
    bad = [why for p, t in texts.items() if (why := _refuse_target(p, t, overwrite))]
    if bad:
        raise ValueError(f"{bad[0]}; nothing written")
    for p, t in texts.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
        tmp.write_bytes(t.encode())
        os.replace(tmp, p)
    return list(texts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mla_lab.fits", description=__doc__.split("\n\n")[0])
    ap.add_argument("name", help=f"one of {sorted(FITS)} or 'all'")
    ap.add_argument("--measured-dir", default=None, help="default data/measured")
    ap.add_argument("--out-dir", default=None, help="default data/calibration")
    ap.add_argument("--overwrite", action="store_true", help="replace existing files (only files a fit wrote)")
    a = ap.parse_args(argv)
    try:
        for name in sorted(FITS) if a.name == "all" else [a.name]:
            for p in refit(name, a.measured_dir, a.out_dir, a.overwrite):
                print(f"{name}: wrote {p}")
    except (ValueError, OSError) as e:
        print(f"python -m mla_lab.fits: {e}", file=sys.stderr)
        return 2
    return 0
