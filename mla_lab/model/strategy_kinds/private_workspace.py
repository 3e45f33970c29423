"""``private_workspace``: vLLM PR #53878's pre-padded Q-concat workspace, zeroed once."""

from ...placement import Strategy, StrategyKind
from ..ops import padded_path_ops

KIND = StrategyKind("private_workspace", 2, "vllm-flashmla", "workspace", "flashmla_pad64", padded_path_ops,
                    fixed=(Strategy("private_workspace", "zeros", "zero_once"),))
