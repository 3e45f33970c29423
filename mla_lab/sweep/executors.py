"""Where sweep points run: in this process (``local``) or as Ray tasks (``ray``; optional, imported only when used).

An executor runs the compute function it is given (``(point, mode) -> rows``) and yields each finished point; the
driver (:func:`mla_lab.sweep.run.run_sweep`) owns the store. A point's error comes back as ``"<Type>: <message>"``;
a worker whose :func:`~mla_lab.sweep.store.code_version` differs from the driver's fails its point.
"""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from ..arch import detect_arch
from .store import code_version

EXECUTORS = ("local", "ray")
RAY_INSTALL_HINT = "pip install 'mla_lab[ray]' (or: pip install 'ray>=2.9')"


@dataclass(frozen=True)
class PointTask:
    """One unit of work: a grid point, its mode (``modelled`` | ``measured``) and its store key."""

    point: dict
    mode: str
    key: str


@dataclass
class PointResult:
    """What came back for one task: ``rows`` (the point is ok) or ``error`` (``"<Type>: <message>"``: it failed)."""

    task: PointTask
    rows: list = field(default_factory=list)
    error: str | None = None
    host: str = ""
    seconds: float = 0.0


ComputeFn = Callable[[dict, str], list]


def compute_point(point: dict, mode: str, compute_fn: ComputeFn, driver_version: str | None = None) -> dict:
    """Compute one point's rows where this runs (``compute_fn`` picklable for Ray); a ``driver_version`` other
    than this code's fails the point. Never raises for a point's own error: returns ``{"rows", "error", "host",
    "seconds", "code_version"}`` (``error``: ``"<ExceptionType>: <message>"`` or None)."""
    t0 = time.perf_counter()
    version = code_version()
    out = {"rows": [], "error": None, "host": socket.gethostname(), "code_version": version}
    try:
        if driver_version is not None and version != driver_version:
            raise RuntimeError(f"worker on {out['host']} runs mla_lab code {version}, the driver {driver_version}: "
                               "install the driver's commit on every node (or pass runtime_env working_dir)")
        out["rows"] = compute_fn(point, mode)
    except Exception as e:  # recorded by the driver, not fatal
        out["rows"], out["error"] = [], f"{type(e).__name__}: {e}"
    out["seconds"] = time.perf_counter() - t0
    return out


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; ``cuda`` without one raises ValueError."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA GPU; allowed here: 'auto' or 'cpu'")
    return device


def _result(task: PointTask, out: dict) -> PointResult:
    return PointResult(task, rows=out["rows"], error=out["error"], host=out["host"], seconds=out["seconds"])


class _Closing(contextlib.AbstractContextManager):
    """A context manager (``with`` gives the executor) calling :meth:`close` on exit."""

    def close(self) -> None:
        pass

    def __exit__(self, *exc):
        self.close()


class LocalExecutor(_Closing):
    """Points in this process, one after the other, in the order given (the default)."""

    name = "local"
    resolve_device = staticmethod(resolve_device)
    detect_gpu = staticmethod(detect_arch)

    def run(self, tasks: Iterable[PointTask], compute_fn: ComputeFn, driver_version: str | None = None
            ) -> Iterator[PointResult]:
        # driver_version is not checked: this process is the driver, its code is the driver's by definition
        for t in tasks:
            yield _result(t, compute_point(t.point, t.mode, compute_fn))

    def describe(self) -> str:
        return "local (in-process)"


def ray_available() -> bool:
    """ray can be imported here (checked without importing it)."""
    import importlib.util

    return importlib.util.find_spec("ray") is not None


class RayExecutor(_Closing):
    """Points as Ray tasks. ``address``: None starts (or reuses) a local instance, ``"auto"`` / ``"host:6379"`` /
    ``"ray://host:10001"`` joins a cluster; ``gpus_per_measured``, ``cpus_per_task``: each task's; ``max_in_flight``:
    tasks not collected (None: 2 x CPUs + GPUs, >= 4); ``max_retries``: re-runs of a task whose worker died;
    ``runtime_env``, ``init_kwargs``: ``ray.init``'s. :meth:`close` shuts down only a Ray this executor started.
    """

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None, gpus_per_measured: float = 1,
                 cpus_per_task: float = 1, max_in_flight: int | None = None, max_retries: int = 1,
                 runtime_env: dict | None = None, **init_kwargs):
        try:
            import ray
        except ImportError as e:
            raise ImportError(f"executor='ray' needs the optional ray package, which is not installed here ({e}); "
                              f"install it with {RAY_INSTALL_HINT}") from None
        self.ray = ray
        if gpus_per_measured <= 0:
            raise ValueError(f"gpus_per_measured={gpus_per_measured!r} must be > 0 (a measured point needs a GPU)")
        self.address, self.num_cpus, self.runtime_env = address, num_cpus, runtime_env
        self.gpus_per_measured, self.cpus_per_task = gpus_per_measured, cpus_per_task
        self.max_in_flight, self.max_retries = max_in_flight, max_retries
        self.init_kwargs = {"include_dashboard": False, "logging_level": "warning", **init_kwargs}
        self._started, self._fns = False, None

    def _ensure_init(self):
        ray = self.ray
        if not ray.is_initialized():
            kw = dict(self.init_kwargs)
            if self.runtime_env is not None:
                kw["runtime_env"] = self.runtime_env
            if self.address is None and self.num_cpus is not None:
                kw["num_cpus"] = self.num_cpus
            ray.init(address=self.address, **kw)
            self._started = True
        if self._fns is None:
            self._fns = {
                "modelled": ray.remote(num_cpus=self.cpus_per_task, num_gpus=0,
                                       max_retries=self.max_retries)(compute_point),
                # num_gpus > 0: Ray runs each in a fresh worker (max_calls=1), explicit here
                "measured": ray.remote(num_cpus=self.cpus_per_task, num_gpus=self.gpus_per_measured, max_calls=1,
                                       max_retries=self.max_retries)(compute_point),
            }
        return ray

    def close(self) -> None:
        if self._started and self.ray.is_initialized():
            self.ray.shutdown()
        self._started, self._fns = False, None

    def resources(self) -> dict:
        """The cluster's total resources (``CPU``, ``GPU``, ...)."""
        return dict(self._ensure_init().cluster_resources())

    def describe(self) -> str:
        if self._local_not_started():
            return "ray (a local instance, started when a point is to be computed)"
        r = self.resources()
        return f"ray ({self.address or 'local'}: {r.get('CPU', 0):g} CPU, {r.get('GPU', 0):g} GPU)"

    def _local_not_started(self) -> bool:
        """A local Ray instance not started yet: this machine is the cluster, asked without starting it."""
        return self.address is None and not self.ray.is_initialized()

    def resolve_device(self, device: str) -> str:
        """``auto`` -> ``cuda`` when the cluster has GPUs, else ``cpu``; ``cuda`` on a GPU-less cluster raises. A
        local instance not started yet is this machine: asked here (:func:`resolve_device`), Ray is not started."""
        if self._local_not_started():
            return resolve_device(device)
        gpus = self.resources().get("GPU", 0)
        if device == "auto":
            return "cuda" if gpus > 0 else "cpu"
        if device == "cuda" and gpus <= 0:
            raise ValueError("device='cuda' but the Ray cluster has no GPU resources; use device='auto' or 'cpu'")
        return device

    def detect_gpu(self, timeout_s: float = 600) -> dict | None:
        """:func:`mla_lab.arch.detect_arch` as seen by a task holding one GPU (the cluster's GPUs are assumed to be
        of one kind: measured rows are labelled with this arch)."""
        if self._local_not_started():
            return detect_arch()
        ray = self._ensure_init()
        fn = ray.remote(num_cpus=0, num_gpus=self.gpus_per_measured, max_calls=1)(detect_arch)
        return ray.get(fn.remote(), timeout=timeout_s)

    def run(self, tasks: Iterable[PointTask], compute_fn: ComputeFn, driver_version: str | None = None
            ) -> Iterator[PointResult]:
        """Submit the tasks (at most ``max_in_flight`` at once) and yield each result as it completes. On an
        exception in the consumer (Ctrl-C) the tasks still pending are cancelled. No task: Ray is not started."""
        queue = list(tasks)
        if not queue:
            return
        ray = self._ensure_init()
        limit = self.max_in_flight
        if limit is None:
            r = ray.cluster_resources()
            limit = max(4, int(2 * (r.get("CPU", 0) + r.get("GPU", 0))))
        cf = ray.put(compute_fn)
        pending: dict = {}
        nxt = 0
        try:
            while nxt < len(queue) or pending:
                while nxt < len(queue) and len(pending) < limit:
                    t = queue[nxt]
                    fn = self._fns.get(t.mode, self._fns["modelled"])
                    pending[fn.remote(t.point, t.mode, cf, driver_version)] = t
                    nxt += 1
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    t = pending.pop(ref)
                    try:
                        out = ray.get(ref)
                    except Exception as e:  # the task itself was lost (worker died, node gone, cancelled)
                        msg = str(e).strip()
                        msg = msg if len(msg) <= 2000 else msg[:2000] + " ..."
                        out = {"rows": [], "error": f"{type(e).__name__}: {msg}", "host": "", "seconds": 0.0}
                    yield _result(t, out)
        finally:
            for ref in pending:
                try:
                    ray.cancel(ref, force=True)
                except Exception:
                    pass


def make_executor(name: str = "local", address: str | None = None, **kwargs):
    """An executor by name (``local`` / ``ray``; ``address`` and ``kwargs``: :class:`RayExecutor`'s). Raises ValueError
    (unknown name; options for ``local``) or ImportError (no ``ray``).
    """
    if name == "local":
        if address is not None or kwargs:
            raise ValueError(f"executor='local' takes no address or options (got address={address!r}, {kwargs}); "
                             "use executor='ray' for a Ray cluster")
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(address=address, **kwargs)
    raise ValueError(f"executor={name!r} is not known; allowed: {list(EXECUTORS)}")
