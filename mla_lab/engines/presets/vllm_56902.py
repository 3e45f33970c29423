"""Engine version ``vllm@56902``: vLLM PR #56902, merged 2026-09-14 (no release wheel)."""

from ._pr_era import FM, preset

PRESET = preset("56902", "2026-09-14", "vLLM PR #56902, merged 2026-09-14 (no release wheel)",
                "padded view of the shared workspace per call (padded heads hold its scratch)",
                ("workspace", "per-call view of the shared workspace (PR #56902)", FM + " (PR #56902)"),
                ("shared_workspace:none",), 2, "vllm-56902")
