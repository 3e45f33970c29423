"""Issue 32: the first command's prerequisites are checked: ``make test`` (its 8 browser tests) and ``mla-lab
check-report`` need a system Chromium, and ``make`` says so in one line with how to install it."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from mla_lab.paths import REPO_ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _make(*args, path: str, chromium: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CHROMIUM"}
    env["PATH"] = path
    if chromium is not None:
        env["CHROMIUM"] = chromium
    return subprocess.run([shutil.which("make"), "-s", "-C", str(REPO_ROOT), *args], env=env, capture_output=True,
                          text=True, timeout=60)


def test_make_names_the_missing_chromium_in_one_line():
    names = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
    if any(shutil.which(n, path="/usr/bin:/bin") for n in names):
        pytest.skip("a Chromium is installed system-wide here (the missing case cannot be made)")
    r = _make("check-chromium", path="/usr/bin:/bin")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("make: ***")]
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert "apt-get install chromium" in lines[0] and "check-report" in lines[0], lines[0]


def test_make_finds_chromium_on_path_or_in_the_env(tmp_path):
    fake = tmp_path / "bin" / "chromium"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert _make("check-chromium", path=f"{fake.parent}:/usr/bin:/bin").returncode == 0
    assert _make("check-chromium", path="/usr/bin:/bin", chromium=str(fake)).returncode == 0


def test_make_test_checks_chromium_first_unless_told_to_skip():
    r = subprocess.run([shutil.which("make"), "-n", "-C", str(REPO_ROOT), "test"], capture_output=True, text=True,
                       env={**os.environ, "CHROMIUM": "/nonexistent"}, timeout=60)
    assert "check-chromium" in r.stdout + r.stderr or "no Chromium" in r.stdout + r.stderr
    r = subprocess.run([shutil.which("make"), "-n", "-C", str(REPO_ROOT), "test", "BROWSER=skip"],
                       capture_output=True, text=True, timeout=60)
    assert "no Chromium" not in r.stdout + r.stderr
