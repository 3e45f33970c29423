"""What the GPU benchmarks record beside their timings: provenance columns, a CSV sink, and an NVML sampler.

- :func:`bench_provenance` — the provenance columns of a benchmark row (GPU, driver, CUDA, torch, triton, the
  FlashMLA provider, commit, date).
- :class:`CsvSink` — rows appended to a CSV as they are measured (fixed columns, provenance on every row), so a
  benchmark cut short by its deadline keeps what it had (the package's one sink: the layer runs use it too).
- :class:`NvmlSampler` — a background thread reading the SM clock (MHz), board power (W), temperature and the
  clock-event reasons every ``period`` s; :meth:`NvmlSampler.window` gives medians over a timed window.

Used by :mod:`.layer_runs`, ``mla_lab/measure/experiments/engines.py``, ``mla_lab/measure/experiments/decode_layer.py`` and ``mla_lab/measure/experiments/tp_block.py``.
"""

from __future__ import annotations

import csv
import datetime as _dt
import os
import statistics
import threading
import time
from pathlib import Path

from ..provenance import provenance

__all__ = ["bench_provenance", "CsvSink", "NvmlSampler"]


def bench_provenance(kern_info: dict) -> dict:
    """Provenance columns of a benchmark CSV row: ``source``, ``gpu``, ``sm``, ``driver`` (NVML when
    :func:`mla_lab.provenance.provenance` has none), ``cuda``, ``torch``, ``triton``, ``flash_mla``
    (``provider==version`` from ``kern_info``, :func:`mla_lab.kernels.flash_mla_info`), ``git_commit`` (env
    ``MLA_LAB_COMMIT`` first) and ``date_utc``."""
    import torch

    p = provenance("measured")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    sm = "sm%d%d" % torch.cuda.get_device_capability() if torch.cuda.is_available() else "none"
    driver = p.get("driver", "none")
    if driver in ("none", None):
        try:
            import pynvml

            pynvml.nvmlInit()
            driver = pynvml.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else driver
        except Exception:
            driver = "none"
    try:
        import triton

        tv = triton.__version__
    except Exception:
        tv = "none"
    fm = (f"{kern_info.get('provider')}=={kern_info.get('version')}" if kern_info.get("available")
          else f"none ({kern_info.get('reason')})")
    return {"source": "measured", "gpu": gpu, "sm": sm, "driver": driver, "cuda": str(torch.version.cuda),
            "torch": torch.__version__, "triton": tv, "flash_mla": fm,
            "git_commit": os.environ.get("MLA_LAB_COMMIT") or p.get("git_commit", "unknown"),
            "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


class CsvSink:
    """Append rows to a CSV as they come: fixed columns, then the provenance columns not among them, provenance
    values on every row; a column a row leaves out is written empty. The one sink of the package (the layer runs,
    ``benchmarks/*.py``).

    The file is created (header only) at construction, replacing an older one (callers check that they wrote it:
    ``mla_lab/measure/experiments/tp_block.py`` writes to ``.partial`` files first); ``n`` counts rows written.

    Args:
        path: the CSV file; columns: its measurement columns, in order; provenance: ``{column: value}`` added to
            every row (:func:`bench_provenance`, :func:`mla_lab.provenance.provenance`).

    Raises:
        ValueError: (``write``) a row with a column that is not in the file's header (names them).
    """

    def __init__(self, path: str | Path, columns, provenance: dict):
        self.path, self.provenance, self.n = Path(path), dict(provenance), 0
        self.columns = list(columns) + [c for c in self.provenance if c not in columns]
        with open(self.path, "w", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns).writeheader()

    def write(self, row: dict) -> None:
        bad = set(row) - set(self.columns)
        if bad:
            raise ValueError(f"row has columns {sorted(bad)} not in {self.path.name}'s header; allowed: "
                             f"{self.columns}")
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns).writerow({**row, **self.provenance})
        self.n += 1


class NvmlSampler:
    """Background thread reading SM clock (MHz), board power (W), temperature and clock-event reasons every
    ``period`` s. ``window(t0, t1)`` gives medians over the samples taken between two perf_counter times."""

    def __init__(self, period=0.02):
        self.ok, self.samples, self.power_kind, self.why = False, [], "none", ""
        self.period, self._stop = period, threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            idx = 0
            vis = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            if vis and vis.split(",")[0].isdigit():
                idx = int(vis.split(",")[0])
            self.h = pynvml.nvmlDeviceGetHandleByIndex(idx)
            self._power = self._probe_power()
            self._reasons = self._probe_reasons()
            self.ok = True
        except Exception as e:
            self.why = f"{type(e).__name__}: {e}"
            return
        self.th = threading.Thread(target=self._loop, daemon=True)
        self.th.start()

    def _probe_power(self):
        nv, h = self.nv, self.h
        fid = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
        if fid is not None:
            try:
                v = nv.nvmlDeviceGetFieldValues(h, [fid])[0]
                if getattr(v, "nvmlReturn", 0) == 0 and v.value.uiVal > 0:
                    self.power_kind = "instant (NVML_FI_DEV_POWER_INSTANT)"

                    def f():
                        r = nv.nvmlDeviceGetFieldValues(h, [fid])[0]
                        return r.value.uiVal / 1000.0 if getattr(r, "nvmlReturn", 0) == 0 else float("nan")
                    return f
            except Exception:
                pass
        self.power_kind = "nvmlDeviceGetPowerUsage (may be a ~1 s average)"
        return lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0

    def _probe_reasons(self):
        nv, h = self.nv, self.h
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(nv, name, None)
            if fn is not None:
                try:
                    fn(h)
                    return lambda fn=fn: int(fn(h))
                except Exception:
                    continue
        return lambda: -1

    def _loop(self):
        nv, h = self.nv, self.h
        while not self._stop.is_set():
            t = time.perf_counter()
            try:
                clk = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
                pw = self._power()
                tmp = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
                rs = self._reasons()
                self.samples.append((t, clk, pw, tmp, rs))
            except Exception:
                pass
            self._stop.wait(self.period)

    def window(self, t0, t1, reasons: bool = True):
        """Medians of the samples taken between perf_counter times ``t0`` and ``t1``: ``sm_clock_mhz``,
        ``power_w``, ``temp_c``, ``n_samples`` and (``reasons``) the most frequent ``clock_event_reasons``."""
        s = [x for x in self.samples[-4000:] if t0 <= x[0] <= t1]
        if not s:
            out = {"sm_clock_mhz": "", "power_w": "", "temp_c": "", "n_samples": 0}
            return {**out, "clock_event_reasons": ""} if reasons else out
        out = {"sm_clock_mhz": statistics.median(x[1] for x in s),
               "power_w": round(statistics.median(x[2] for x in s), 1),
               "temp_c": statistics.median(x[3] for x in s), "n_samples": len(s)}
        if reasons:
            rs = [x[4] for x in s]
            mode = max(set(rs), key=rs.count)
            out["clock_event_reasons"] = hex(mode) if mode >= 0 else ""
        return out

    def now(self):
        return self.samples[-1] if self.samples else None

    def stop(self):
        self._stop.set()
