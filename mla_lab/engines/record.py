"""The engine-version record (a foundation module: stdlib only): one :class:`EnginePreset` per engine version, its
:class:`EngineVersion` (release), :class:`EngineRule` (routing) and :class:`Fact` s, each with the ``file:line`` in the
release wheel it is read from (:class:`Source`). One module under :mod:`mla_lab.engines.presets` builds one record."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Source", "Fact", "EngineVersion", "EngineRule", "EnginePreset", "src", "pr_src", "rule_name",
           "version_rule"]


@dataclass(frozen=True)
class Source:
    """Where a fact is written: ``path:line`` (``"754"`` / ``"766-777"`` / ``"-"``) and the ``code`` (one statement
    or expression) :mod:`mla_lab.engines.wheel_check` must find in ``scope`` (``"Cls.method"``, a function or variable,
    ``""`` the module). ``checkable`` False: no release wheel (cited, not checked)."""

    path: str
    line: str
    code: str
    scope: str = ""
    checkable: bool = True

    def cite(self) -> str:
        return f"{self.path}:{self.line}"


#: A checkable :class:`Source` in a release wheel: ``src(path, line, code, scope="")``.
src = Source


def pr_src(path: str, code: str = "pass", scope: str = "") -> Source:
    """A PR-era :class:`Source` (no release wheel, no line: cited, not checked)."""
    return Source(path, "-", code, scope, checkable=False)


@dataclass(frozen=True)
class Fact:
    """One fact a preset relies on: ``key``, ``value`` (what the lab uses), ``text`` (one sentence), ``sources``."""

    key: str
    value: object
    text: str
    sources: tuple = ()

    def cite(self) -> str:
        return "; ".join(s.cite() for s in self.sources)


@dataclass(frozen=True)
class EngineVersion:
    """A release or PR-era build: ``release_date`` (ISO: the wheel's build or the PR's merge), ``wheel`` (None: no
    release wheel), ``models`` (families it runs as DSA)."""

    engine: str
    version: str
    release_date: str
    wheel: str | None
    models: tuple = ("deepseek", "glm")
    note: str = ""

    name = property(lambda self: f"{self.engine}@{self.version}")


@dataclass(frozen=True)
class EngineRule:
    """How one engine configuration routes sparse-MLA attention (:func:`mla_lab.routes.route_for` reads it).

    Attributes:
        dense_kv_len_threshold: prefills of seq_len <= this go ``mha-dense`` (``"topk"``: ``index_topk``; 0: never)
            for ``dense_models``; all_prefills: every prefill must be under it (vLLM #47327), else SGLang's
            per-batch ``max_kv_len``.
        decode_query_len_threshold / decode_thresholds: query tokens of a decode (vLLM ``reorder_batch_threshold``;
            ``((num_heads, n), ...)``); uniform_decodes: vLLM ``require_uniform_decodes``.
        prefill_graph_max_tokens: steps up to this run in a prefill CUDA graph, dense route off (SGLang 0.5.23).
        mqa_only_reason / family_reasons: why a family takes the backend route.
    """

    name: str
    engine: str
    backend_route: str
    decode_route: str
    dense_kv_len_threshold: int | str
    dense_models: tuple
    all_prefills: bool
    source: str
    decode_query_len_threshold: int = 1
    decode_thresholds: tuple = ()
    uniform_decodes: bool = False
    prefill_graph_max_tokens: int = 0
    mqa_only_reason: str = ""
    family_reasons: tuple = ()

    def decode_threshold(self, num_heads: int | None = None) -> int:
        """Query tokens per request still a decode at ``num_heads`` heads per rank (None: the default)."""
        return dict(self.decode_thresholds).get(num_heads, self.decode_query_len_threshold)

    def dense_threshold(self, topk: int) -> int:
        """The dense route's seq_len threshold for a model with ``topk`` (0: no dense route)."""
        return topk if self.dense_kv_len_threshold == "topk" else int(self.dense_kv_len_threshold)


@dataclass(frozen=True)
class EnginePreset:
    """One engine version as the lab runs it: the whole record.

    Attributes:
        name: ``<engine>@<version>[-<variant>]``, the one spelling; forced_backend: ``--attention-backend`` or None.
        members: the lab's strategies of its sm90 bf16-KV default (placement names) under ``rule``.
        first_names: earlier door names (``vllm-53878``); label: how outputs name it; today: answered by ``advise``.
        uniform_decodes: backends with vLLM ``require_uniform_decodes``; decode_backend: when not the prefill's.
    """

    name: str
    engine_version: EngineVersion
    summary: str
    rule: EngineRule
    forced_backend: str | None
    facts: tuple
    members: tuple
    order: int
    first_names: tuple = ()
    label: str = ""
    today: bool = False
    uniform_decodes: tuple = ()
    decode_backend: str | None = None

    def fact(self, key: str) -> Fact:
        for f in self.facts:
            if f.key == key:
                return f
        raise ValueError(f"preset {self.name!r} has no fact {key!r}; it has: {[f.key for f in self.facts]}")

    def has(self, key: str) -> bool:
        return any(f.key == key for f in self.facts)

    #: ``prefill_padding`` per sm (``{"sm90": 64, "sm100": 128}``).
    padding = property(lambda self: self.fact("prefill_padding").value)

    #: ``{backend: {sm: (((num_heads, n), ...), default)}}`` (fact ``decode_threshold``; {} without one).
    decode_thresholds = property(
        lambda self: self.fact("decode_threshold").value if self.has("decode_threshold") else {})

    #: Every file the facts cite, in order, once.
    sources = property(lambda self: list(dict.fromkeys(s.path for f in self.facts for s in f.sources)))


def rule_name(preset: str) -> str:
    """``vllm@0.33.0`` -> ``vllm-0.33.0``: the rule name strategy names carry after ``@``."""
    return preset.replace("@", "-")


def version_rule(preset: str, facts, route: str, dense, models, *, backend: str | None = None,
                 decode_route: str | None = None, all_prefills: bool = True, uniform: bool = False,
                 graph_tokens: int = 0, why: str = "",
                 source_keys=("prefill_route", "decode_threshold")) -> EngineRule:
    """An engine version's :class:`EngineRule` from its facts (sm90 ``decode_threshold`` of ``backend``)."""
    by_key = {f.key: f for f in facts}
    pairs, default = by_key["decode_threshold"].value[backend]["sm90"] if backend else ((), 1)
    source = f"{preset}: " + "; ".join(f"{k} ({by_key[k].cite()})" for k in source_keys)
    return EngineRule(rule_name(preset), preset.split("@")[0], route, decode_route or route, dense, tuple(models),
                      all_prefills, source, default, tuple(pairs), uniform, graph_tokens, why)
