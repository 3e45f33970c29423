"""MLA model geometry read from Hugging Face ``config.json`` files under ``data/models/<name>/``.
KV-cache bytes per token, layer and rank (the latent cache is replicated on every TP rank): bf16 ``head_size * 2``
= 1152 B; fp8 (``fp8_ds_mla``) 656 B = 512 fp8 NoPE + 4 fp32 scales + 64 bf16 RoPE (FlashMLA README "FP8 KV
cache"); plus the indexer key, ``index_head_dim`` fp8 + an fp32 scale per 128 = 132 B (vLLM
``DeepseekV32IndexerCache``)."""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from ._validate import check_int, divisors
from .paths import models_dir
from .routes import config_family

__all__ = ["ModelConfig", "load_model", "model_names", "model_config_path", "models_dir", "KV_CACHE_DTYPES"]

KV_CACHE_DTYPES = ("bf16", "fp8")
_DTYPE_ALIASES = {"auto": "bf16", "bfloat16": "bf16", "bf16": "bf16", "fp8": "fp8", "fp8_ds_mla": "fp8",
                  "fp8_e4m3": "fp8"}


def normalize_kv_cache_dtype(kv_cache_dtype: str) -> str:
    """vLLM spellings (``auto``, ``bfloat16``, ``fp8_ds_mla``...) -> ``bf16`` / ``fp8``. Raises ValueError: unknown."""
    key = str(kv_cache_dtype).strip().lower()
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not supported; allowed: {sorted(_DTYPE_ALIASES)}")
    return _DTYPE_ALIASES[key]


@dataclass(frozen=True)
class ModelConfig:
    """Geometry of one sparse-MLA model (HF config.json field names)."""

    name: str
    num_attention_heads: int
    num_hidden_layers: int
    hidden_size: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    index_topk: int
    index_n_heads: int
    index_head_dim: int
    first_k_dense_replace: int
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    intermediate_size: int
    vocab_size: int
    n_shared_experts: int = 1
    index_topk_freq: int = 1
    #: config.json ``architectures`` and ``model_type``: they decide the family (:attr:`family`), never the name.
    architectures: tuple[str, ...] = ()
    model_type: str = ""

    #: ``deepseek``, ``glm`` or ``other`` (:func:`mla_lab.routes.config_family`).
    family = property(lambda self: config_family(self.architectures, self.model_type)[0])
    #: "" for a known family, else the assumption the model is priced under.
    family_note = property(lambda self: config_family(self.architectures, self.model_type)[1])

    @property
    def indexer_layers(self) -> tuple[int, ...]:
        """Layers with their own DSA indexer: all, or for ``index_topk_freq`` f > 1 those with ``max(i - 2, 0) % f
        == 0`` (vLLM ``vllm/model_executor/models/deepseek_v2.py``, GLM-5.2 IndexShare)."""
        f = self.index_topk_freq
        return tuple(i for i in range(self.num_hidden_layers) if f == 1 or max(i - 2, 0) % f == 0)

    #: Absorbed-MLA q/k head size seen by the sparse kernel: kv_lora_rank + qk_rope_head_dim (576).
    head_size = property(lambda self: self.kv_lora_rank + self.qk_rope_head_dim)
    #: Value / output head dim seen by the sparse kernel: kv_lora_rank (512).
    d_v = property(lambda self: self.kv_lora_rank)
    #: Sparse attention keys per query token (``index_topk``).
    topk = property(lambda self: self.index_topk)

    def heads_per_rank(self, tp: int) -> int:
        """``num_attention_heads // tp``. Raises ValueError: ``tp`` does not divide it."""
        tp = check_int("tp", tp)
        if self.num_attention_heads % tp:
            raise ValueError(f"tp={tp} does not divide num_attention_heads={self.num_attention_heads} of model "
                             f"{self.name!r}; allowed tp: {divisors(self.num_attention_heads)}")
        return self.num_attention_heads // tp

    def kv_cache_bytes_per_token_layer(self, kv_cache_dtype: str = "bf16", include_indexer: bool = True) -> int:
        """KV-cache bytes per token per layer on one rank (layout in the module docstring)."""
        bf16 = normalize_kv_cache_dtype(kv_cache_dtype) == "bf16"
        b = self.head_size * 2 if bf16 else self.kv_lora_rank + 4 * 4 + self.qk_rope_head_dim * 2
        return b + (self.index_head_dim + 4 * math.ceil(self.index_head_dim / 128) if include_indexer else 0)

    def kv_cache_bytes_per_token(self, kv_cache_dtype: str = "bf16", include_indexer: bool = True) -> int:
        """KV-cache bytes per token on one rank, all layers (indexer keys on :attr:`indexer_layers` only)."""
        latent = self.kv_cache_bytes_per_token_layer(kv_cache_dtype, include_indexer=False)
        full = self.kv_cache_bytes_per_token_layer(kv_cache_dtype, include_indexer)
        return self.num_hidden_layers * latent + len(self.indexer_layers) * (full - latent)

    def to_dict(self) -> dict:
        extra = {"head_size": self.head_size, "d_v": self.d_v, "family": self.family}
        return {f.name: getattr(self, f.name) for f in fields(self)} | extra


#: config.json fields a model needs, and those read when present (defaults: ``n_shared_experts`` 1,
#: ``index_topk_freq`` 1); 0 is allowed for :data:`MAY_BE_ZERO`.
REQUIRED_FIELDS = tuple(f.name for f in fields(ModelConfig) if f.default is MISSING and f.name != "name")
OPTIONAL_FIELDS = ("n_shared_experts", "index_topk_freq")
MAY_BE_ZERO = ("n_shared_experts", "first_k_dense_replace")
#: The largest value each config.json field may hold: 8-64x DeepSeek-V3.2's (data/models/deepseek-v3.2/config.json).
CONFIG_BOUNDS = {"num_attention_heads": 1024, "num_hidden_layers": 1024, "hidden_size": 2**17, "q_lora_rank": 2**16,
                 "kv_lora_rank": 2**14, "qk_nope_head_dim": 4096, "qk_rope_head_dim": 4096, "v_head_dim": 4096,
                 "index_topk": 2**20, "index_n_heads": 1024, "index_head_dim": 4096, "first_k_dense_replace": 1024,
                 "n_routed_experts": 65536, "num_experts_per_tok": 1024, "moe_intermediate_size": 2**17,
                 "intermediate_size": 2**19, "vocab_size": 2**23, "n_shared_experts": 1024, "index_topk_freq": 1024}


def model_names() -> list[str]:
    """Models with a ``config.json`` under :func:`models_dir`."""
    d = models_dir()
    return sorted(p.parent.name for p in d.glob("*/config.json")) if d.is_dir() else []


def model_config_path(name: str) -> Path:
    """``config.json`` of the model folder named ``name`` (any case). Raises ValueError: no such folder."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"model={name!r} must be a non-empty str; allowed: {model_names()}")
    key = name.strip().lower()
    known = next((k for k in model_names() if k.lower() == key), None)
    if known:
        return models_dir() / known / "config.json"
    raise ValueError(f"model={name!r} is not known (no {models_dir() / key / 'config.json'}); allowed: {model_names()}")


def _read_config(path: Path) -> dict:
    """config.json as a dict. Raises ValueError: absent, not JSON, not an object."""
    if not path.is_file():
        raise ValueError(f"config.json path={str(path)!r} does not exist")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"config.json {path} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"config.json {path} must hold a JSON object, got {type(raw).__name__}")
    return raw


def _config_fields(path: Path, raw: dict) -> dict:
    """The geometry fields of ``raw``, each a bounded int (:data:`CONFIG_BOUNDS`). Raises ValueError naming one."""
    kwargs = {}
    for key in REQUIRED_FIELDS + OPTIONAL_FIELDS:
        if key not in raw:
            if key in OPTIONAL_FIELDS:
                continue
            raise ValueError(f"config.json {path} is missing required field {key!r}")
        v = raw[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (v == 0 and key not in MAY_BE_ZERO):
            raise ValueError(f"config.json {path}: field {key!r}={v!r} must be a positive int")
        if v > CONFIG_BOUNDS[key]:
            raise ValueError(f"config.json {path}: field {key!r}={v!r} is out of range; allowed: at most "
                             f"{CONFIG_BOUNDS[key]:,} (a bound 8-64x DeepSeek-V3.2's config)")
        kwargs[key] = v
    return kwargs


def load_model(name: str | ModelConfig, path: str | Path | None = None) -> ModelConfig:
    """``data/models/<name>/config.json`` (or ``path``) as a :class:`ModelConfig`.
    Raises ValueError: unknown model; malformed JSON; a field missing or out of range (names it and the file)."""
    if isinstance(name, ModelConfig):
        return name
    canonical = None
    if path is None:
        path = model_config_path(name)
        canonical = path.parent.name  # the folder's own spelling: names are normalised once, here
    path = Path(path)
    raw = _read_config(path)
    kwargs = _config_fields(path, raw)
    archs = raw.get("architectures", [])
    if not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ValueError(f"config.json {path}: field 'architectures'={archs!r} must be a list of str")
    mtype = raw.get("model_type", "")
    if not isinstance(mtype, str):
        raise ValueError(f"config.json {path}: field 'model_type'={mtype!r} must be a str")
    return ModelConfig(name=canonical or (str(name) if isinstance(name, str) else path.parent.name), **kwargs,
                       architectures=tuple(archs), model_type=mtype)
