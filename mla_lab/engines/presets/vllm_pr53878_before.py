"""Engine version ``vllm@pr53878-before``: vLLM main on PR #53878's merge-base (no release wheel)."""

from ._pr_era import PRE_SRC, preset

PRESET = preset("pr53878-before", "2026-08-27", "vLLM main on PR #53878's merge-base (no release wheel)",
                "private unpadded Q buffer + new_empty pad per call (range: pad zeros / stale)",
                ("new_empty", "q.new_empty((T, prefill_padding, 576)) + slice copy per call", PRE_SRC),
                ("per_call_empty:zeros", "per_call_empty:stale"), 0, "vllm-pre-53878")
