"""The engine versions the lab describes: the ``PRESET`` of every module of :mod:`mla_lab.engines.presets` (found
at import) and any :func:`register` ed later; the lookups every layer above reads them through. :data:`BACKENDS`:
vLLM 0.33.0's ``supports_compute_capability`` / ``supported_kv_cache_dtypes`` of each sparse backend class."""

from __future__ import annotations

import importlib
import pkgutil

from . import presets as _presets
from .presets._pr_era import LAB_CLAIMS
from .record import EnginePreset, EngineVersion, Fact

__all__ = ["ENGINE_PRESETS", "BACKENDS", "UNPADDED_BACKENDS", "LAB_CLAIMS", "register", "engine_names",
           "resolve_engine", "engine_preset", "engine_version", "fact", "version_facts",
           "sparse_backend", "padding_for", "decode_threshold", "fp8_reserved_bytes", "first_names", "preset_of_rule"]

#: name -> :class:`EnginePreset`, in ``order`` (live: :func:`register` adds to it).
ENGINE_PRESETS: dict[str, EnginePreset] = {}
#: Sparse-MLA backends (vLLM ``--attention-backend`` spellings; SGLang's ``flashmla_sparse`` is FLASHMLA_SPARSE):
#: ``({sm major}, {kv dtypes})`` each runs.
BACKENDS = {
    "FLASH_ATTN_MLA_SPARSE": ({9}, {"bf16"}),
    "FLASH_ATTN_MLA_SPARSE_FA4": ({10}, {"bf16"}),
    "FLASHINFER_MLA_SPARSE": ({10}, {"bf16", "fp8"}),
    "FLASHINFER_MLA_SPARSE_SM90": ({9}, {"bf16", "fp8"}),
    "FLASHMLA_SPARSE": ({9, 10}, {"bf16", "fp8"}),
}
#: Backends that take the real head count (no padded Q, no padded output).
UNPADDED_BACKENDS = ("FLASH_ATTN_MLA_SPARSE", "FLASH_ATTN_MLA_SPARSE_FA4", "FLASHINFER_MLA_SPARSE")


def register(preset: EnginePreset) -> EnginePreset:
    """Add one engine version; returns it. Raises ValueError: a name or rule already held; no members."""
    if not isinstance(preset, EnginePreset) or not preset.members:
        raise ValueError(f"preset={preset!r} must be an EnginePreset with at least one member strategy")
    taken = {n for p in ENGINE_PRESETS.values() for n in (p.name, *p.first_names)}
    clash = sorted(taken & {preset.name, *preset.first_names})
    rule = next((p.rule for p in ENGINE_PRESETS.values() if p.rule.name == preset.rule.name), preset.rule)
    if clash or rule != preset.rule:  # a rule name is shared only by the same rule (the PR-era builds)
        raise ValueError(f"engine preset {preset.name!r}: {clash or preset.rule.name!r} already taken")
    ENGINE_PRESETS[preset.name] = preset
    items = sorted(ENGINE_PRESETS.values(), key=lambda p: (p.order, p.name))
    ENGINE_PRESETS.clear()
    ENGINE_PRESETS.update((p.name, p) for p in items)
    return preset


for _m in pkgutil.iter_modules(_presets.__path__):
    if not _m.name.startswith("_"):
        register(importlib.import_module(f"{_presets.__name__}.{_m.name}").PRESET)


def engine_names() -> list[str]:
    """Every engine preset name, in order."""
    return list(ENGINE_PRESETS)


def first_names() -> dict[str, str]:
    """The lab's first door names -> engine preset (``vllm-53878`` -> ``vllm@pr53878``)."""
    return {n: p.name for p in ENGINE_PRESETS.values() for n in p.first_names}


def resolve_engine(name: str) -> str:
    """The preset name of a preset or first name. Raises ValueError naming ``--engine`` and the allowed."""
    names = {**first_names(), **{n: n for n in ENGINE_PRESETS}}
    if isinstance(name, str) and name in names:
        return names[name]
    raise ValueError(f"--engine={name!r} is not valid; allowed: {engine_names()} (or the first names "
                     f"{list(first_names())})")


def engine_preset(name: str) -> EnginePreset:
    """The :class:`EnginePreset` of a name (:func:`resolve_engine`; raises as that does)."""
    return ENGINE_PRESETS[resolve_engine(name)]


def preset_of_rule(rule: str) -> EnginePreset | None:
    """The engine preset whose own route rule is named ``rule`` (``vllm-0.33.0``); None for a shared rule."""
    hits = [p for p in ENGINE_PRESETS.values() if p.rule.name == rule]
    return hits[0] if len(hits) == 1 else None


def engine_version(engine: str, version: str) -> EngineVersion:
    """The :class:`EngineVersion` ``engine@version``. Raises ValueError naming those the lab describes."""
    key, known = f"{engine}@{version}", {p.engine_version.name: p.engine_version for p in ENGINE_PRESETS.values()}
    if key not in known:
        raise ValueError(f"engine version={key!r} is not described by the lab; allowed: {list(known)}")
    return known[key]


def fact(preset: str, key: str) -> Fact:
    """The :class:`Fact` ``key`` of ``preset``. Raises ValueError naming the preset's keys."""
    return engine_preset(preset).fact(key)


def version_facts(ev: EngineVersion):
    """``(preset, Fact, Source)``: the PR-era :data:`LAB_CLAIMS` (release wheels only), then each checkable source
    of ``ev``'s presets once."""
    for f in LAB_CLAIMS.get(ev.engine, ()) if ev.wheel else ():
        yield from (("lab (PR-era)", f, s) for s in f.sources)
    seen = set()
    for p, f in ((q, f) for q in ENGINE_PRESETS.values() if q.engine_version == ev for f in q.facts):
        for s in f.sources:
            k = (f.key, s.path, s.scope, s.code)
            if s.checkable and k not in seen:
                seen.add(k)
                yield p.name, f, s


def _sm_key(sm) -> str:
    key = {"90": "sm90", "9": "sm90", "100": "sm100", "10": "sm100"}.get(str(sm).lower().replace("sm", ""))
    if key is None:
        raise ValueError(f"sm={sm!r} is not valid; allowed: ['sm90', 'sm100']")
    return key


def _kv_key(kv_cache_dtype: str) -> str:
    k = str(kv_cache_dtype).lower()
    if k in ("bf16", "bfloat16", "auto") or k.startswith("fp8"):
        return k[:3] if k.startswith("fp8") else "bf16"
    raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not valid; allowed: bf16 (auto, bfloat16), fp8 "
                     "(fp8_ds_mla, fp8_e4m3)")


def _runs(backend: str, sm_k: str, kv: str) -> bool:
    gpus, kvs = BACKENDS[backend]
    return (9 if sm_k == "sm90" else 10) in gpus and kv in kvs


def sparse_backend(preset: str, sm, kv_cache_dtype: str, num_heads: int) -> str:
    """The forced backend, else the first of fact ``backend_priority`` that runs there (:data:`BACKENDS`).
    Raises ValueError: bad sm / kv_cache_dtype / preset; no backend runs there."""
    p = engine_preset(preset)
    sm_k, kv = _sm_key(sm), _kv_key(kv_cache_dtype)
    if p.forced_backend:
        if _runs(p.forced_backend, sm_k, kv):
            return p.forced_backend
        raise ValueError(f"--engine={p.name!r} forces {p.forced_backend}, which does not run on {sm_k} with {kv} KV")
    prio = p.fact("backend_priority").value.get(sm_k, {})
    lst = prio.get(kv) or prio.get(f"{kv}<=16" if num_heads <= 16 else f"{kv}>16") or ()
    for b in lst:
        if _runs(b, sm_k, kv):
            return b
    raise ValueError(f"--engine={p.name!r} has no sparse backend on {sm_k} with {kv} KV; allowed: {list(prio)}")


def padding_for(preset: str, backend: str, sm, kv_cache_dtype: str = "bf16") -> int:
    """Heads ``backend`` pads a bf16 sparse prefill to under ``preset`` (``prefill_padding``); 0 when it takes the
    real heads (:data:`UNPADDED_BACKENDS`; FLASHMLA_SPARSE with an fp8 KV cache). Raises ValueError: bad sm / preset."""
    p = engine_preset(preset)
    if backend in UNPADDED_BACKENDS or _kv_key(kv_cache_dtype) == "fp8":
        return 0
    return int(p.padding[_sm_key(sm)])


def decode_threshold(preset: str, backend: str, sm, num_heads: int) -> tuple[int, bool]:
    """``(n, uniform)``: requests of <= ``n`` query tokens are decodes (``uniform``: of one length).
    Raises ValueError: no threshold for ``backend``."""
    p = engine_preset(preset)
    by_sm, key = p.decode_thresholds.get(backend, {}), _sm_key(sm)
    if key not in by_sm:
        raise ValueError(f"--engine={p.name!r} gives no decode threshold for {backend} on {key}; allowed: "
                         f"{[(b, list(v)) for b, v in p.decode_thresholds.items()]}")
    pairs, default = by_sm[key]
    return dict(pairs).get(num_heads, default), backend in p.uniform_decodes


def fp8_reserved_bytes(num_heads: int, max_num_batched_tokens: int, max_model_len: int, head_size: int = 576,
                       kv_lora_rank: int = 512) -> dict:
    """``{name: bytes, total}`` (bf16) vLLM 0.33.0's FLASHMLA_SPARSE takes from the shared workspace with fp8 KV
    (``flashmla_sparse.py:810,822-829``; factor ``vllm/config/vllm.py:1872-1874``): Q-concat ``(T, H, 576)``, gather
    ``(factor x max_model_len, 576)`` (factor 5 up to 256 Ki, else 2), padded Q / output at ``round_up(H, 64)``,
    output ``(T, H, 512)``. Raises ValueError: a size not a positive int."""
    H, T, L = num_heads, max_num_batched_tokens, max_model_len
    for name, v in (("num_heads", H), ("max_num_batched_tokens", T), ("max_model_len", L)):  # (no _validate
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:  # import: engines stays at layer 0)
            raise ValueError(f"{name}={v!r} must be a positive int")
    Hp, factor = -(-H // 64) * 64, 5 if L <= 256 * 1024 else 2
    out = {"q_concat": T * H * head_size * 2, "prefill_gather": factor * L * head_size * 2,
           "padded_q": T * Hp * head_size * 2, "padded_out": T * Hp * kv_lora_rank * 2,
           "out": T * H * kv_lora_rank * 2}
    out["total"] = sum(out.values())
    return out
