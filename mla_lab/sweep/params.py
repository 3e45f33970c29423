"""Sweep parameters: the schema (names, defaults, types), their validation, and the grid they span.

The notebook's ``parameters`` cell, ``-p``/``-f`` of the CLI and YAML files all hold these names; every value is
checked here before any point runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from dataclasses import dataclass, field

from .._validate import short_repr
from ..arch import get_arch
from ..models import load_model, normalize_kv_cache_dtype
from ..placement import ALIASES, ENGINE_PRESETS, PRESETS, SWEEP_STRATEGIES, canonical_names, expand_strategies
from . import executors
from .executors import EXECUTORS, RAY_INSTALL_HINT
from .store import point_key

#: The sweep's default strategies (:data:`mla_lab.placement.SWEEP_STRATEGIES`): every engine preset, the shared
#: workspace with the concat zeroing its padded heads, and the sub-chunked workspace at
#: :data:`~mla_lab.placement.SUBCHUNK_ROWS`.
DEFAULT_STRATEGIES = list(SWEEP_STRATEGIES)


@dataclass
class SweepParams:
    """Sweep parameters (the notebook's ``parameters`` cell holds the same names; vLLM spellings: :data:`VLLM_ALIASES`).

    ``tp_sizes`` default ``[8]``: the one TP at which GLM-5's and DeepSeek-V3.2's fp8 weights load on an H200 or a
    B200 (a smaller TP is listed ``does_not_fit``). ``strategies``: door names, expanded to canonical ones (the
    baseline is always priced). ``num_runs``: interleaved repeats per measured strategy (>= 5 for an interval).
    ``shared_workspace_bytes``: the shared workspace's other users (null: the fused-MoE scratch). ``output_len``,
    ``max_num_seqs``, ``request_rate``, ``seed``: ``vllm bench serve``'s. ``device``: ``auto`` / ``cpu`` (modelled)
    / ``cuda``. ``executor``: ``local`` or ``ray`` (:mod:`mla_lab.sweep.executors`).
    """

    models: list = field(default_factory=lambda: ["glm-5", "deepseek-v3.2"])
    tp_sizes: list = field(default_factory=lambda: [8])
    archs: list = field(default_factory=lambda: ["h200", "b200"])
    max_num_batched_tokens: list = field(default_factory=lambda: [8192, 16384])
    prompt_lens: list = field(default_factory=lambda: [1024, 8192])
    kv_cache_dtype: object = "bf16"
    num_prompts: int = 32
    concurrency: int | None = None
    strategies: list = field(default_factory=lambda: list(DEFAULT_STRATEGIES))
    device: str = "auto"
    store_dir: str = "data/sweeps/padding_sweep"
    data_file: str = "data/padding_sweep.csv"
    report_dir: str = "reports"
    check_equivalence: bool = True
    force: bool = False
    overwrite: bool = False
    executor: str = "local"
    ray_address: str | None = None
    weight_dtype: str = "fp8"
    moe_parallel: str = "ep"
    num_runs: int = 7
    shared_workspace_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    output_len: int = 128
    max_num_seqs: int = 256
    request_rate: object = "inf"
    seed: int = 0

DEFAULTS = dataclasses.asdict(SweepParams())

_LIST_INT = ("tp_sizes", "max_num_batched_tokens", "prompt_lens")
_LIST_STR = ("models", "archs", "strategies")

#: vLLM's names (``vllm serve`` / ``vllm bench serve``) -> the sweep's.
VLLM_ALIASES = {
    "tensor_parallel_size": "tp_sizes", "max_num_batched_tokens": "max_num_batched_tokens",
    "kv_cache_dtype": "kv_cache_dtype", "gpu_memory_utilization": "gpu_memory_utilization",
    "num_prompts": "num_prompts", "random_input_len": "prompt_lens", "random_output_len": "output_len",
    "max_concurrency": "concurrency", "request_rate": "request_rate", "max_num_seqs": "max_num_seqs",
    "seed": "seed",
}


def normalize_names(raw: dict) -> dict:
    """Names with vLLM's spellings mapped to the sweep's (:data:`VLLM_ALIASES`), dashes read as underscores. Raises
    ValueError for a name given twice (once under each spelling).
    """
    out: dict = {}
    for k, v in raw.items():
        key = str(k).replace("-", "_")
        key = VLLM_ALIASES.get(key, key)
        if key in out:
            raise ValueError(f"parameter {short_repr(key)} is given twice (as {short_repr(k)} and another spelling); allowed: once")
        out[key] = v
    return out


#: Notebook names that are not sweep parameters: set by ``mla-lab sweep`` (where the figures go, the run's id).
NOTEBOOK_ONLY = ("figure_dir", "run_id")
_KERNEL_NAMES = ("In", "Out", "get_ipython", "exit", "quit", "open")


def check_notebook_names(names) -> None:
    """Refuse (ValueError, the allowed names listed) a name papermill injected that the notebook does not declare
    (``papermill -p tp_size 8`` only warns). ``names``: the notebook's globals before its first import; IPython's own
    (``In``, ``Out``, ``_...``) are ignored.
    """
    known = set(DEFAULTS) | set(NOTEBOOK_ONLY) | set(VLLM_ALIASES)
    unknown = sorted(n for n in names if not str(n).startswith("_") and n not in _KERNEL_NAMES and n not in known)
    if unknown:
        raise ValueError(f"unknown notebook parameter(s) {unknown}; allowed: {sorted(set(DEFAULTS) | set(NOTEBOOK_ONLY))}")


def _grid_list(k: str, v) -> list:
    """One grid axis as a list of distinct entries (a value given twice is one grid value, order kept)."""
    v = [v] if isinstance(v, (str, int)) and not isinstance(v, bool) else v
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"{k}={short_repr(v)} must be a list")
    if not v:
        raise ValueError(f"{k}=[] gives an empty grid; give at least one value")
    want = int if k in _LIST_INT else str
    for x in v:
        if isinstance(x, bool) or not isinstance(x, want):
            raise ValueError(f"{k} holds {short_repr(x)} ({type(x).__name__}); every entry must be {want.__name__}")
        if want is int and x <= 0:
            raise ValueError(f"{k} holds {short_repr(x)}; every entry must be a positive int")
    return list(dict.fromkeys(v))


def _grid(p: dict) -> None:
    """The grid axes checked and normalised in place (models, archs, dtypes, strategies by name)."""
    for k in _LIST_INT + _LIST_STR:
        p[k] = _grid_list(k, p[k])
    kv = [p["kv_cache_dtype"]] if isinstance(p["kv_cache_dtype"], str) else p["kv_cache_dtype"]
    if not isinstance(kv, (list, tuple)) or not kv:
        raise ValueError(f"kv_cache_dtype={short_repr(p['kv_cache_dtype'])} must be 'bf16', 'fp8' or a non-empty "
                         "list of them")
    p["kv_cache_dtype"] = list(dict.fromkeys(normalize_kv_cache_dtype(x) for x in kv))
    p["models"] = list(dict.fromkeys(load_model(m).name for m in p["models"]))  # case-insensitive, normalised once
    for a in p["archs"]:
        get_arch(a)
    for name in p["strategies"]:
        try:
            expand_strategies([name])
        except ValueError:
            raise ValueError(f"strategies holds {short_repr(name)}; allowed: canonical strategies {canonical_names()}, "
                             f"presets {list(PRESETS)}, engine presets {list(ENGINE_PRESETS)} or aliases "
                             f"{list(ALIASES)}") from None
    p["strategies"] = expand_strategies(p["strategies"])


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: The scalar parameters' checks, in the order they are made: (names, test, what the message says of a value).
_SCALARS = (
    (("num_prompts", "num_runs"), lambda v: _int(v) and v > 0, "must be a positive int"),
    (("concurrency",), lambda v: v is None or (_int(v) and v > 0), "must be a positive int or null"),
    (("gpu_memory_utilization",), lambda v: _number(v) and 0 < v <= 1, "must be a number in (0, 1]"),
    (("output_len", "max_num_seqs"), lambda v: _int(v) and v > 0, "must be a positive int"),
    (("seed",), lambda v: _int(v) and 0 <= v <= 2**32 - 1,
     f"must be an int in [0, {2**32 - 1}] (numpy's RandomState seeds)"),
    (("request_rate",), lambda v: v == "inf" or (_number(v) and v > 0),
     "must be 'inf' or a positive number of requests per second"),
    (("shared_workspace_bytes",), lambda v: v is None or (_int(v) and v >= 0),
     "must be a non-negative int (bytes) or null"),
    (("device",), lambda v: v in ("auto", "cpu", "cuda"), "is not allowed; allowed: ['auto', 'cpu', 'cuda']"),
    (("store_dir", "data_file", "report_dir"), lambda v: isinstance(v, str) and bool(v),
     "must be a non-empty path string"),
    (("check_equivalence", "force", "overwrite"), lambda v: isinstance(v, bool), "must be true or false"),
    (("weight_dtype",), lambda v: v in ("fp8", "bf16"), "is not allowed; allowed: ['fp8', 'bf16']"),
    (("moe_parallel",), lambda v: v in ("ep", "tp"), "is not allowed; allowed: ['ep', 'tp']"),
)


def _scalars(p: dict) -> None:
    """The workload, serving and run scalars checked in place (``request_rate`` text that is a number read as one)."""
    if isinstance(p["request_rate"], str) and p["request_rate"] != "inf":  # YAML 1.1 reads 4e-7 (no dot) as text
        with contextlib.suppress(ValueError):
            p["request_rate"] = float(p["request_rate"])
    for names, ok, what in _SCALARS:
        for k in names:
            if not ok(p[k]):
                raise ValueError(f"{k}={short_repr(p[k])} {what}")
        c = p["concurrency"]
        if names == ("concurrency",) and c is not None and c > p["num_prompts"]:
            raise ValueError(f"concurrency={short_repr(c)} exceeds num_prompts={short_repr(p['num_prompts'])}; "
                             f"allowed: 1..{p['num_prompts']} or null (= num_prompts)")


def validate_params(raw: dict) -> SweepParams:
    """:class:`SweepParams` of raw parameters (YAML, ``-p`` pairs or the notebook), names and types checked. Raises
    ValueError naming the key and the value: unknown key (the allowed listed), wrong type, empty grid, unknown value.
    """
    raw = normalize_names(raw)
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown sweep parameter(s) {unknown}; allowed: {sorted(DEFAULTS)}")
    p = {**DEFAULTS, **raw}
    _grid(p)
    _scalars(p)
    _validate_executor(p)
    return SweepParams(**p)


def _validate_executor(p: dict) -> None:
    if p["executor"] not in EXECUTORS:
        raise ValueError(f"executor={short_repr(p['executor'])} is not allowed; allowed: {list(EXECUTORS)}")
    addr = p["ray_address"]
    if addr is not None and (not isinstance(addr, str) or not addr.strip()):
        raise ValueError(f"ray_address={short_repr(addr)} must be a Ray address string (auto, host:6379, "
                         "ray://host:10001) or null")
    if addr is not None and p["executor"] != "ray":
        raise ValueError(f"ray_address={short_repr(addr)} is only used with executor='ray' "
                         f"(executor={short_repr(p['executor'])})")
    if p["executor"] == "ray" and not executors.ray_available():
        raise ValueError(f"executor='ray' needs the optional ray package, which is not installed here; install it "
                         f"with {RAY_INSTALL_HINT}")


def check_tp_sizes(params: SweepParams) -> None:
    """Refuse (ValueError, the model's message) a (model, TP) whose TP does not divide the model's heads; the CLI calls
    this before the notebook starts (:func:`mla_lab.sweep.run.run_sweep` records such points as failed).
    """
    for m in params.models:
        model = load_model(m)
        for tp in params.tp_sizes:
            model.heads_per_rank(tp)


def expand_grid(params: SweepParams) -> list[dict]:
    """Every grid point as a dict (canonical names: arch resolved to its card; two aliases of one card, one point)."""
    out: dict = {}
    for m, tp, a, mbt, L, kv in itertools.product(params.models, params.tp_sizes, params.archs,
                                                   params.max_num_batched_tokens, params.prompt_lens,
                                                   params.kv_cache_dtype):
        pt = {"model": m, "tp": tp, "arch": get_arch(a).name, "max_num_batched_tokens": mbt,
              "prompt_len": L, "kv_cache_dtype": kv, "num_prompts": params.num_prompts,
              "concurrency": params.concurrency or params.num_prompts,
              "weight_dtype": params.weight_dtype, "moe_parallel": params.moe_parallel,
              "strategies": list(params.strategies), "num_runs": params.num_runs,
              "shared_workspace_bytes": params.shared_workspace_bytes,
              "gpu_memory_utilization": params.gpu_memory_utilization}
        out.setdefault(point_key(pt, ""), pt)
    return list(out.values())
