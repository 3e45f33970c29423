"""Engine version ``vllm@pr53878``: vLLM PR #53878, merged on or after 2026-08-27 (no release wheel)."""

from ._pr_era import FM, preset

PRESET = preset("pr53878", "2026-08-27", "vLLM PR #53878, merged on or after 2026-08-27 (no release wheel)",
                "pre-padded private Q-concat workspace (padded heads never written: zeros)",
                ("workspace", "concat_mla_q into the padded workspace (PR #53878)", FM + " (PR #53878)"),
                ("private_workspace",), 1, "vllm-53878")
