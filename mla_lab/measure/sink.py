"""Where measured rows go: the one CSV :class:`Sink` (with :func:`mla_lab.provenance.provenance` columns), the one
:class:`NvmlSampler`, the one :func:`log`."""

from __future__ import annotations

import csv
import os
import statistics
import threading
import time
from pathlib import Path

from ..provenance import PROVENANCE_COLUMNS, provenance


def log(*parts) -> None:
    """One progress line on stdout, ``[measure HH:MM:SS] ...``, flushed (a killed process keeps what it said)."""
    print(f"[measure {time.strftime('%H:%M:%S')}]", *parts, flush=True)


class Sink:
    """Rows appended to ``out/<file>`` as measured (a kill keeps them). Columns: ``process`` (this fresh process's
    index, when given), ``outputs[file]``, then :data:`~mla_lab.provenance.PROVENANCE_COLUMNS` (``prov``, default
    ``provenance("measured")`` taken once); missing cells empty; an existing file must have that header.

    Raises:
        ValueError: (``write``) a file not in ``outputs``, a row column not in its header, or an existing file with
            another header (each names the file and what is allowed).
    """

    def __init__(self, out: str | Path, outputs: dict[str, list[str]], process: int | None = None,
                 prov: dict | None = None):
        self.out, self.outputs, self.process = Path(out), dict(outputs), process
        self.prov = dict(prov if prov is not None else provenance("measured"))
        self.rows: dict[str, int] = {}
        self.out.mkdir(parents=True, exist_ok=True)

    def columns(self, name: str) -> list[str]:
        if name not in self.outputs:
            raise ValueError(f"file={name!r} is not one of this experiment's outputs; allowed: {list(self.outputs)}")
        head = ["process"] if self.process is not None else []
        cols = [c for c in self.outputs[name] if c != "process" and c not in PROVENANCE_COLUMNS]
        return head + cols + list(PROVENANCE_COLUMNS)

    def write(self, name: str, row: dict) -> None:
        cols, path = self.columns(name), self.out / name
        bad = sorted(set(row) - set(cols))
        if bad:
            raise ValueError(f"row has columns {bad} not in {name}'s header; allowed: {cols}")
        if name not in self.rows:
            if path.exists():
                with open(path, newline="") as f:
                    have = next(csv.reader(f), [])
                if have != cols:
                    raise ValueError(f"{path} exists with another header {have[:6]}...; allowed: a new --out folder")
            else:
                with open(path, "w", newline="") as f:
                    csv.writer(f).writerow(cols)
            self.rows[name] = 0
        full = {**row, **self.prov, **({"process": self.process} if self.process is not None else {})}
        with open(path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=cols).writerow(full)
        self.rows[name] += 1

    @property
    def n(self) -> int:
        """Rows written, all files."""
        return sum(self.rows.values())


class NvmlSampler:
    """SM clock (MHz), power (W), temperature (C) and clock-event reasons of the first visible GPU, read every
    ``period`` s by a daemon thread; :meth:`window` gives medians between two ``time.perf_counter`` times. Without
    NVML ``ok`` is False and ``why`` says why. Power: ``NVML_FI_DEV_POWER_INSTANT`` where the driver has it, else
    ``nvmlDeviceGetPowerUsage`` (may be a ~1 s average): ``power_kind``. A context manager."""

    def __init__(self, period: float = 0.02):
        self.ok, self.samples, self.power_kind, self.why = False, [], "none", ""
        self.period, self._stop = period, threading.Event()
        try:
            import pynvml as nv

            nv.nvmlInit()
            vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0]
            self.nv, self.h = nv, nv.nvmlDeviceGetHandleByIndex(int(vis) if vis.isdigit() else 0)
            self._power = self._probe_power()
            reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nv.nvmlDeviceGetCurrentClocksThrottleReasons
            self._reasons = lambda: int(reasons(self.h))
            self._reasons()
        except Exception as e:  # noqa: BLE001 - no NVML: rows say so (empty NVML columns)
            self.why = f"{type(e).__name__}: {e}"
            return
        self.ok = True
        threading.Thread(target=self._loop, daemon=True).start()

    def _probe_power(self):
        nv, h, fid = self.nv, self.h, getattr(self.nv, "NVML_FI_DEV_POWER_INSTANT", None)
        try:
            if fid is not None and nv.nvmlDeviceGetFieldValues(h, [fid])[0].value.uiVal > 0:
                self.power_kind = "instant (NVML_FI_DEV_POWER_INSTANT)"
                return lambda: nv.nvmlDeviceGetFieldValues(h, [fid])[0].value.uiVal / 1000.0
        except Exception:  # noqa: BLE001 - the field is not there: the averaged reading
            pass
        self.power_kind = "nvmlDeviceGetPowerUsage (may be a ~1 s average)"
        return lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0

    def _loop(self) -> None:
        nv, h = self.nv, self.h
        while not self._stop.is_set():
            try:
                self.samples.append((time.perf_counter(), nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                                     self._power(), nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                                     self._reasons()))
            except Exception:  # noqa: BLE001 - a missed sample; the window says how many it has
                pass
            self._stop.wait(self.period)

    def window(self, t0: float, t1: float, reasons: bool = True) -> dict:
        """Medians between ``t0`` and ``t1``: ``sm_clock_mhz``, ``power_w``, ``temp_c``, ``n_samples``, (``reasons``)
        the most frequent ``clock_event_reasons`` (hex); "" where none."""
        s = [x for x in self.samples[-4000:] if t0 <= x[0] <= t1]
        out = {"sm_clock_mhz": "", "power_w": "", "temp_c": "", "n_samples": len(s)}
        if s:
            out.update(sm_clock_mhz=statistics.median(x[1] for x in s),
                       power_w=round(statistics.median(x[2] for x in s), 1),
                       temp_c=statistics.median(x[3] for x in s))
        if reasons:
            rs = [x[4] for x in s]
            out["clock_event_reasons"] = hex(max(set(rs), key=rs.count)) if rs else ""
        return out

    def stop(self) -> None:
        self._stop.set()

    def __enter__(self) -> NvmlSampler:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
