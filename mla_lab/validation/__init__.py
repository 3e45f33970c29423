"""Validation against real runs: blind predictions (:mod:`.blind`) and their scores (:mod:`.score`)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["write_record"]


def write_record(path: Path, doc: dict, overwrite: bool, ap) -> None:
    """Write ``doc`` as JSON to ``path`` (a committed record: replaced only with ``overwrite``; else ``ap.error``,
    one line naming the file)."""
    if path.exists() and not overwrite:
        ap.error(f"{path} exists: pass --overwrite to replace it")
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")
