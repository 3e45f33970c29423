"""The engine-version record (a foundation module: stdlib only): one :class:`EnginePreset` per engine version, its
:class:`EngineVersion` (release), :class:`EngineRule` (routing) and :class:`Fact` s, each with the ``file:line`` in the
release wheel it is read from (:class:`Source`). One module under :mod:`mla_lab.engines.presets` builds one record."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Source", "Fact", "EngineVersion", "EngineRule", "EnginePreset", "src", "pr_src", "rule_name",
           "version_rule"]


@dataclass(frozen=True)
class Source:
    """Where a fact is written: ``path`` in the wheel (or a PR's file), ``line`` (``"754"`` / ``"766-777"`` / ``"-"``),
    ``code``: one Python statement or expression :mod:`mla_lab.engines.wheel_check` must find (ast) in ``scope``
    (``"Cls.method"``, ``"function"``, a module-level variable, ``""`` the module). ``checkable`` False: a PR-era
    source with no release wheel (cited, not checked)."""

    path: str
    line: str
    code: str
    scope: str = ""
    checkable: bool = True

    def cite(self) -> str:
        return f"{self.path}:{self.line}"


def src(path, line, code, scope="") -> Source:
    """A checkable :class:`Source` in a release wheel."""
    return Source(path, line, code, scope)


def pr_src(path, line, code, scope="") -> Source:
    """A PR-era :class:`Source` (no release wheel: cited, not checked)."""
    return Source(path, line, code, scope, checkable=False)


@dataclass(frozen=True)
class Fact:
    """One fact a preset relies on: ``key`` (``prefill_padding``, ``decode_threshold`` ...), ``value`` (what the lab
    uses), ``text`` (one sentence) and its ``sources``."""

    key: str
    value: object
    text: str
    sources: tuple = ()

    def cite(self) -> str:
        return "; ".join(s.cite() for s in self.sources)


@dataclass(frozen=True)
class EngineVersion:
    """A release or PR-era build: ``engine`` (``vllm`` / ``sglang``), ``version``, ``release_date`` (ISO: the wheel's
    build date, or the PR's merge date), ``wheel`` (the wheel's file-name stem; None: no release wheel) and
    ``models`` (families it runs as DSA)."""

    engine: str
    version: str
    release_date: str
    wheel: str | None
    models: tuple = ("deepseek", "glm")
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.engine}@{self.version}"


@dataclass(frozen=True)
class EngineRule:
    """How one engine configuration routes sparse-MLA attention (:func:`mla_lab.routes.route_for` reads it).

    Attributes:
        name: the ``@<rule>`` of strategy names; engine: ``vllm`` / ``sglang`` / ``mla_lab``.
        backend_route / decode_route: route of MQA prefill tokens / of decode tokens.
        dense_kv_len_threshold: prefills of seq_len <= this go ``mha-dense`` (``"topk"``: ``index_topk``; 0: never).
        dense_models: families allowed the dense route (the others are MQA-only).
        all_prefills: the dense route needs *every* prefill of the step under the threshold (vLLM #47327); False:
            SGLang's per-batch ``max_kv_len`` (decode rows count too).
        source: files and PRs the rule follows.
        decode_query_len_threshold / decode_thresholds: requests of at most this many query tokens are decodes
            (vLLM ``reorder_batch_threshold``; ``((num_heads, n), ...)`` per head count, this the default).
        uniform_decodes: decodes must share one query length (vLLM ``require_uniform_decodes``).
        prefill_graph_max_tokens: steps of at most this many tokens run in a prefill CUDA graph, dense route off
            (SGLang 0.5.23); 0: none.
        mqa_only_reason: why a family outside ``dense_models`` takes the backend route.
        family_reasons: ``((family, why), ...)``: that reason for one family (GLM on vLLM's MQA-only wrapper).
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
        name: ``<engine>@<version>[-<variant>]`` (the one spelling of an engine version).
        engine_version: the release (:class:`EngineVersion`).
        summary: one line.
        rule: its :class:`EngineRule` (the ``@<rule>`` of its members' names is ``rule.name``).
        forced_backend: the ``--attention-backend`` forced (None: the engine's own choice).
        facts: its :class:`Fact` s (``prefill_padding``, ``decode_threshold``, ``backend_priority``, ...).
        members: the lab's strategies of its sm90 bf16-KV default as placement names (``fa3_sparse``), run under
            ``rule`` (two: the range zeros / stale).
        order: where ``mla-lab engines`` lists it (ascending).
        first_names: the lab's earlier door names for it (``vllm-53878`` -> ``vllm@pr53878``).
        label: how outputs name it ("": its name).
        today: answered beside every ``advise`` (a current release).
        uniform_decodes: backends whose decodes must share one query length (vLLM ``require_uniform_decodes``).
        decode_backend: the backend decode rows run on when not the prefill's (SGLang's ``fa3``); None: the same.
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

    @property
    def padding(self) -> dict:
        """``prefill_padding`` per sm (``{"sm90": 64, "sm100": 128}``)."""
        return self.fact("prefill_padding").value

    @property
    def decode_thresholds(self) -> dict:
        """``{backend: {sm: (((num_heads, n), ...), default)}}`` (fact ``decode_threshold``; {} without one)."""
        return self.fact("decode_threshold").value if self.has("decode_threshold") else {}

    @property
    def sources(self) -> list[str]:
        """Every file the facts cite, in order, once."""
        return list(dict.fromkeys(s.path for f in self.facts for s in f.sources))


def rule_name(preset: str) -> str:
    """The route rule name of an engine version's rule: ``vllm@0.33.0`` -> ``vllm-0.33.0`` (the spelling strategy
    names carry after ``@``, as the committed rows and docs spell them)."""
    return preset.replace("@", "-")


def version_rule(preset: str, facts, route: str, dense, models, *, backend: str | None = None,
                 decode_route: str | None = None, all_prefills: bool = True, uniform: bool = False,
                 graph_tokens: int = 0, why: str = "",
                 source_keys=("prefill_route", "decode_threshold")) -> EngineRule:
    """An engine version's :class:`EngineRule` built from its facts: the sm90 ``decode_threshold`` of ``backend``
    (``(), 1`` without one) and a source citing the facts ``source_keys``."""
    by_key = {f.key: f for f in facts}
    pairs, default = by_key["decode_threshold"].value[backend]["sm90"] if backend else ((), 1)
    source = f"{preset}: " + "; ".join(f"{k} ({by_key[k].cite()})" for k in source_keys)
    return EngineRule(rule_name(preset), preset.split("@")[0], route, decode_route or route, dense, tuple(models),
                      all_prefills, source, default, tuple(pairs), uniform, graph_tokens, why)
