"""Engine version ``vllm@56902``: vLLM PR #56902, merged 2026-09-14 (no release wheel)."""

from ..record import EnginePreset, Fact, pr_src
from . import _pr_era

PRESET = EnginePreset(
    "vllm@56902", _pr_era.version("56902", "vLLM PR #56902, merged 2026-09-14 (no release wheel)", "2026-09-14"),
    "padded view of the shared workspace per call (padded heads hold its scratch)", _pr_era.RULE, "FLASHMLA_SPARSE",
    _pr_era.FACTS + (Fact("pad_call", "workspace", "per-call view of the shared workspace (PR #56902)",
          (pr_src(_pr_era.FM + " (PR #56902)", "-", "pass"),)),),
    members=("shared_workspace:none",), order=2, first_names=("vllm-56902",))
