"""``shared_workspace:<zero_policy>``: vLLM PR #56902's padded view at offset 0 of the workspace shared with the
fused-MoE and indexer scratch (``none``: stale padded heads; ``zero_per_call``: the concat zeroes them). Memory: only
what the padded view adds beyond the workspace's other users."""

from ...placement import Strategy, StrategyKind
from ..ops import padded_path_ops

KIND = StrategyKind("shared_workspace", 3, "vllm-flashmla", "workspace", "flashmla_pad64", padded_path_ops,
                    fixed=(Strategy("shared_workspace", "stale", "none"),
                           Strategy("shared_workspace", "zeros", "zero_per_call")),
                    label=lambda s: f"shared_workspace:{s.zero_policy}",
                    memory=lambda st, s: {"persistent": max(0, s.rows * s.hp * s.row - s.shared_other_bytes)})
