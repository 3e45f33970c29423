"""Stamp the measured sweep CSVs with the model config each was measured with: writes ``config_digests.json``.

    python -m mla_lab.report.stamp_measured [--root data/measured] [--check]

Per CSV (archive folders included), per (``device``, ``flash_mla``, ``git_commit``) group and model: the digest
(:func:`mla_lab.report.data.config_digest`) of the config at the rows' commit, else at the CSV's last commit, else
today's. ``--check`` writes nothing and exits 1 when the manifest differs; exit 2 on a bad ``--root``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from mla_lab.paths import MANIFEST_NAME, REPO_ROOT, measured_dir, models_dir
from mla_lab.report.data import config_digest, config_digest_of_bytes, measured_sweep_frames


def _git(*args) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.decode() if r.returncode == 0 else None


def _config_at(commit: str, model: str) -> str | None:
    cfg = models_dir() / model / "config.json"
    try:
        rel = cfg.resolve().relative_to(REPO_ROOT)
    except ValueError:
        return None  # configs outside the repository (MLA_LAB_DATA): no history to read
    raw = _git("show", f"{commit}:{rel.as_posix()}")
    if raw is None:
        return None
    try:
        return config_digest_of_bytes(raw.encode())
    except ValueError:
        return None


def _stamped(model: str, commit: str, csv_commit: str) -> tuple[str, str]:
    """``(config digest, where it was read)`` of ``model``: at the rows' commit, else the CSV's, else today's."""
    clean = commit.split("+")[0]
    got = _config_at(clean, model) if clean else None
    if got is not None:
        return got, f"config at the rows' git_commit {commit}"
    got = _config_at(csv_commit, model) if csv_commit else None
    if got is not None:
        return got, f"config at the CSV's commit {csv_commit[:12]}"
    return config_digest(models_dir() / model / "config.json"), "today's config (a fresh run)"


def stamp(root: Path) -> dict:
    """The manifest for every measured sweep CSV under ``root``."""
    files: dict = {}
    for p, df in measured_sweep_frames(root, include_archive=True):
        keys = ["device", "flash_mla", "git_commit"]
        df = df.assign(**{c: (df[c].astype("string").fillna("") if c in df.columns else "") for c in keys})
        rel = p.relative_to(root).as_posix()
        try:
            csv_commit = (_git("log", "-1", "--format=%H", "--", str(p.resolve().relative_to(REPO_ROOT))) or "").strip()
        except ValueError:
            csv_commit = ""
        files[rel] = []
        for (dev, prov, commit), g in df.groupby(keys):
            got = {m: _stamped(m, str(commit), csv_commit) for m in sorted(g["model"].astype(str).unique())}
            files[rel].append({"device": dev, "flash_mla": prov, "git_commit": commit, "rows": int(len(g)),
                               "models": {m: d for m, (d, _) in got.items()},
                               "verified": {m: how for m, (_, how) in got.items()}})
    csv_rows = {}
    for p in sorted(root.rglob("*.csv")):
        if "runs" in p.relative_to(root).parts:
            continue  # a measure run's own folder (its provenance.json beside it)
        with open(p, newline="", encoding="utf-8", errors="replace") as f:
            csv_rows[p.relative_to(root).as_posix()] = max(0, sum(1 for _ in f) - 1)
    return {"csv_rows": csv_rows, "about": "SHA-256 of each model's data/models/<model>/config.json the measured rows of each CSV were "
                     "measured with, per GPU (device) and FlashMLA provider (flash_mla); written by "
                     "mla_lab/report/stamp_measured.py, read by mla_lab.report.data.load_measured (a changed config "
                     "detaches the rows)",
            "digest": "sha256 of json.dumps(config, sort_keys=True, separators=(',', ':'))",
            "files": files}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=None, help="the measured root (default: data/measured or MLA_LAB_MEASURED)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the manifest is out of date")
    args = ap.parse_args(argv)
    root = Path(args.root) if args.root else measured_dir()
    if not root.is_dir():
        print(f"--root={str(root)!r} is not a folder; allowed: the measured root (e.g. data/measured)", file=sys.stderr)
        return 2
    doc = stamp(root)
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    path = root / MANIFEST_NAME
    if args.check:
        same = path.is_file() and path.read_text() == text
        print(f"{path}: {'up to date' if same else 'out of date (run mla_lab/report/stamp_measured.py)'}")
        return 0 if same else 1
    path.write_text(text)
    n = sum(e["rows"] for es in doc["files"].values() for e in es)
    print(f"{path}: {len(doc['files'])} file(s), {n} measured row(s) stamped")
    for f, es in doc["files"].items():
        for e in es:
            print(f"  {f} [{e['device']}, {e['flash_mla']}, {e['git_commit']}]: "
                  + ", ".join(f"{m} {d[:12]} ({e['verified'][m]})" for m, d in e["models"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
