"""Engine version ``vllm@pr53878``: vLLM PR #53878, merged on or after 2026-08-27 (no release wheel)."""

from ..record import EnginePreset, Fact, pr_src
from . import _pr_era

PRESET = EnginePreset(
    "vllm@pr53878",
    _pr_era.version("pr53878", "vLLM PR #53878, merged on or after 2026-08-27 (no release wheel)", "2026-08-27"),
    "pre-padded private Q-concat workspace (padded heads never written: zeros)", _pr_era.RULE, "FLASHMLA_SPARSE",
    _pr_era.FACTS + (Fact("pad_call", "workspace", "concat_mla_q into the padded workspace (PR #53878)",
          (pr_src(_pr_era.FM + " (PR #53878)", "-", "pass"),)),),
    members=("private_workspace",), order=1, first_names=("vllm-53878",))
