"""The one colour + marker table of every strategy the lab draws: :data:`STRATEGY_STYLE`, read through
:func:`strategy_style`. Every preset member and sub-chunk hand-off has its own colour and marker (distinct in
greyscale too); sub-chunk sizes share their hand-off's. Colours: Okabe & Ito, "Color Universal Design" (2008), and
Paul Tol's "muted" scheme (https://personal.sron.nl/~pault/), two greys for vLLM before PR #53878.
"""

from __future__ import annotations

from ..placement import measured_as

__all__ = ["STRATEGY_STYLE", "STRATEGY_COLORS", "strategy_style", "style_key", "FALLBACK_STYLE"]

#: ``style key -> (colour, marker, legend label)``; keys are canonical strategy names (``subchunk``,
#: ``subchunk_views``, ``subchunk_graph2``: the sub-chunk families ``subchunk:<S>``, ``subchunk:<S>:views``,
#: ``subchunk:<S>:graph2``). Every (colour, marker) pair and every label is distinct (tests/test_strategy_styles.py).
STRATEGY_STYLE = {
    "per_call_empty:zeros": ("#999999", "o", "vLLM pre-#53878 (new_empty, zeros)"),
    "per_call_empty:stale": ("#4d4d4d", "X", "vLLM pre-#53878 (new_empty, stale)"),
    "per_call_zeros": ("#D55E00", "v", "SGLang flashmla_sparse forced (new_zeros per call)"),
    "per_call_zeros@sglang-dense": ("#CC79A7", "h", "sglang-dense, prefill graphs off (dense MHA <= 2048 tokens)"),
    "private_workspace": ("#0072B2", "s", "vLLM #53878 (private workspace)"),
    "shared_workspace:none": ("#56B4E9", "D", "vLLM #56902 (shared workspace, stale)"),
    "shared_workspace:zero_per_call": ("#882255", "P", "shared workspace + zero per call"),
    "kernel_native": ("#009E73", "*", "real-head FlashMLA (modelled; kernel_native)"),
    "fa3_sparse": ("#332288", "p", "fa3_sparse@vllm-pr46189 (FA3, always sparse)"),
    "subchunk": ("#E69F00", "^", "sub-chunk S (copy out)"),
    "subchunk_views": ("#999933", "<", "sub-chunk S (views to consumer)"),
    "subchunk_graph2": ("#44AA99", ">", "sub-chunk S (2 workspaces, 2 streams, one CUDA graph)"),
    # Paul Tol's muted rose: the lab's packed kernel (packed:<overlap> shares it)
    "packed": ("#CC6677", "d", "packed (lab kernel, 8 tokens x 8 heads)"),
}
#: What a name outside the table gets (black circle, the name as its label): never a name of mla_lab.placement.
FALLBACK_STYLE = ("#000000", "o")
STRATEGY_COLORS = {k: v[0] for k, v in STRATEGY_STYLE.items()}


def style_key(name: str) -> str | None:
    """The :data:`STRATEGY_STYLE` key of a strategy name: canonical names as they are, ``subchunk:<S>[:views |
    :graph2]`` -> its family, presets and the first version's aliases through :func:`mla_lab.placement.measured_as`
    (``sglang`` -> ``per_call_zeros@sglang-dense``); None for a name the table does not know."""
    name = str(name)
    if name in STRATEGY_STYLE:
        return name
    if name.startswith("packed:"):
        return "packed"
    if name.startswith("subchunk:"):
        end = name.rsplit(":", 1)[-1]
        return {"views": "subchunk_views", "graph2": "subchunk_graph2"}.get(end, "subchunk")
    try:
        canon = measured_as(name)
    except ValueError:
        return None
    return style_key(canon) if canon != name else None


def strategy_style(name: str) -> tuple[str, str, str]:
    """``(colour, marker, label)`` of a strategy (canonical, preset or alias name; :func:`style_key`); a name the
    table does not know gets :data:`FALLBACK_STYLE` and its own name as the label."""
    key = style_key(name)
    return STRATEGY_STYLE[key] if key is not None else (*FALLBACK_STYLE, str(name))
