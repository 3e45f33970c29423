"""Engine version ``vllm@0.33.0-flashmla``: vLLM 0.33.0 with ``--attention-backend FLASHMLA_SPARSE`` forced: bf16 Q
a per-call view of the shared workspace padded to 64 (sm90 and sm100); FlashMLA decodes must share one query length
(``require_uniform_decodes``)."""

from ..record import EnginePreset, version_rule
from ._common import FORCED
from .vllm_0_33_0 import COMMON, RELEASE

PRESET = EnginePreset(
    "vllm@0.33.0-flashmla", RELEASE, "FLASHMLA_SPARSE forced: per-call view of the shared workspace padded to 64; "
    "short prefills still dense MHA",
    version_rule("vllm@0.33.0-flashmla", COMMON, "sparse-mqa", "topk", ("deepseek", "glm"),
                 backend="FLASHMLA_SPARSE", uniform=True),
    "FLASHMLA_SPARSE", COMMON + (FORCED,), members=("shared_workspace:none",),
    uniform_decodes=("FLASHMLA_SPARSE",), order=6, today=True)
