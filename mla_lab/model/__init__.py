"""The cost model: what one rank spends on a prefill step, per op, per strategy (modelled numbers)."""

from .calibration import Calibration, ClassEff, default_calibration, fit_calibration, load_calibration
from .memory import activation_peak_bytes, memory_tradeoff, weights_bytes_per_rank
from .ops import LayerOp, attention_path_ops, layer_ops, step_ops, step_stats
from .timing import attention_path_ms, comm_time_ms, layer_time_ms, op_time_ms, step_time_ms
from .ttft import SCOPES, compare_strategies, predict_ttft

__all__ = ["Calibration", "ClassEff", "default_calibration", "fit_calibration", "load_calibration",
           "activation_peak_bytes", "memory_tradeoff", "weights_bytes_per_rank", "LayerOp", "attention_path_ops",
           "layer_ops", "step_ops", "step_stats", "attention_path_ms", "comm_time_ms", "layer_time_ms",
           "op_time_ms", "step_time_ms", "SCOPES", "compare_strategies", "predict_ttft"]
