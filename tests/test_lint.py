"""``ruff check .`` is clean over the whole repository (the rules and the notebooks' per-file ignores are in
pyproject.toml's ``[tool.ruff]``). ruff is a dev dependency; skipped, with the reason, only where it is not installed."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    exe = Path(sys.executable).parent / "ruff"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("ruff")
    if found:
        return [found]
    pytest.skip("ruff is not installed in this environment (the dev extra brings it: pip install -e '.[dev]')")


def test_ruff_check_is_clean():
    r = subprocess.run([*_ruff(), "check", ".", "--output-format", "concise"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, f"ruff check . found problems (fix them or `ruff check --fix .`):\n{r.stdout}{r.stderr}"


def test_ruff_check_catches_a_problem(tmp_path):
    """The same command on a file with an unused import and a bare expression fails, naming the rules, so the test
    above can fail."""
    (tmp_path / "bad.py").write_text("import os\n\n\ndef f(x):\n    x == 1\n")
    r = subprocess.run([*_ruff(), "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), "bad.py",
                        "--output-format", "concise"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "F401" in r.stdout and "B015" in r.stdout, r.stdout + r.stderr
