"""Engine version ``vllm@pr53878-before``: vLLM main on PR #53878's merge-base (no release wheel)."""

from ..record import EnginePreset, Fact, pr_src
from . import _pr_era

PRESET = EnginePreset(
    "vllm@pr53878-before",
    _pr_era.version("pr53878-before", "vLLM main on PR #53878's merge-base (no release wheel)", "2026-08-27"),
    "private unpadded Q buffer + new_empty pad per call (range: pad zeros / stale)", _pr_era.RULE, "FLASHMLA_SPARSE",
    _pr_era.FACTS + (Fact("pad_call", "new_empty", "q.new_empty((T, prefill_padding, 576)) + slice copy per call",
          (pr_src(_pr_era.PRE_SRC, "-", "pass"),)),),
    members=("per_call_empty:zeros", "per_call_empty:stale"), order=0, first_names=("vllm-pre-53878",))
