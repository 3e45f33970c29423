"""The repository's own configuration (issue 14): jupytext pairing, pre-commit hooks, pytest markers and the GPU
policy of tests/conftest.py, the install extras (the ``gpu`` extra never replaces torch), ``make test-fast``, and
the one-line hint when the ``lab`` extra is missing."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VENV_BIN = Path(sys.executable).parent


# ---------------------------------------------------------------------------------------- jupytext, pre-commit


def test_jupytext_toml_pairs_ipynb_with_py_percent():
    cfg = tomllib.loads((REPO / "jupytext.toml").read_text())
    assert cfg["formats"] == "ipynb,py:percent"


def _hooks() -> dict:
    cfg = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    return {h["id"]: h for repo in cfg["repos"] for h in repo["hooks"]}


def test_pre_commit_config_has_nbstripout_jupytext_sync_and_ruff():
    hooks = _hooks()
    assert {"nbstripout", "jupytext-sync", "ruff"} <= set(hooks)
    assert "nbstripout" in hooks["nbstripout"]["entry"] and "--keep-id" in hooks["nbstripout"]["entry"]
    assert hooks["jupytext-sync"]["entry"].endswith("jupytext --sync")
    assert hooks["ruff"]["entry"].endswith("ruff check")
    for h in hooks.values():  # offline: the project's own tools, no hook repository to download
        assert h["language"] == "system"
        assert h["entry"].split()[0].startswith(".venv/bin/")


@pytest.mark.slow  # two tools over every notebook (3 s)
def test_notebook_hooks_leave_the_committed_notebooks_unchanged(tmp_path):
    """nbstripout (keeping cell ids) and jupytext --sync on copies of the notebooks change nothing: the committed
    notebooks already carry no outputs and are in sync, so the hooks never fight the tests."""
    exe = {t: VENV_BIN / t for t in ("nbstripout", "jupytext")}
    missing = [t for t, p in exe.items() if not p.is_file()]
    if missing:
        pytest.skip(f"{missing} not installed in this environment (the dev and lab extras bring them)")
    nb = tmp_path / "notebooks"
    shutil.copytree(REPO / "notebooks", nb, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    shutil.copy(REPO / "jupytext.toml", tmp_path / "jupytext.toml")
    before = {p.name: p.read_bytes() for p in nb.iterdir() if p.is_file()}
    ipynbs = sorted(str(p) for p in nb.glob("*.ipynb"))
    for cmd in (hook_cmd.split() + ipynbs for hook_cmd in (_hooks()["nbstripout"]["entry"],
                                                            _hooks()["jupytext-sync"]["entry"])):
        cmd[0] = str(VENV_BIN / Path(cmd[0]).name)
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    after = {p.name: p.read_bytes() for p in nb.iterdir() if p.is_file()}
    assert [n for n in before if before[n] != after.get(n)] == []


# ------------------------------------------------------------------------------------------- pytest policy


def test_pytest_runs_with_strict_markers_and_registers_gpu_and_slow():
    ini = PYPROJECT["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in ini["addopts"].split()
    names = {m.split(":")[0] for m in ini["markers"]}
    assert {"gpu", "slow"} <= names


def test_makefile_has_test_fast_selecting_not_slow():
    mk = (REPO / "Makefile").read_text()
    m = re.search(r"^test-fast:.*\n\t(.+)$", mk, flags=re.M)
    assert m and '-m "not slow"' in m.group(1)
    assert re.search(r"^test-gpu:.*\n\tMLA_LAB_REQUIRE_GPU=1 ", mk, flags=re.M)


_POLICY_TESTS = '''
import pytest

@pytest.mark.gpu
@pytest.mark.skipif(True, reason="no CUDA GPU here")
def test_gpu_skipped_by_mark():
    pass

@pytest.mark.gpu
def test_gpu_skipped_inside():
    pytest.skip("flash_mla unavailable: no provider")

@pytest.mark.gpu
def test_gpu_runs():
    pass

@pytest.mark.skipif(True, reason="an ordinary skip")
def test_cpu_skip():
    pass

@pytest.mark.slow
def test_slow_one():
    pass
'''


def _run_policy(tmp_path: Path, env_value: str | None, *args: str, tests: str = _POLICY_TESTS,
                extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """pytest on a small suite (``tests``) that uses this repository's conftest.py and markers."""
    d = tmp_path / "suite"
    (d / "tests").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "tests" / "conftest.py", d / "tests" / "conftest.py")
    (d / "tests" / "test_policy.py").write_text(tests)
    ini = PYPROJECT["tool"]["pytest"]["ini_options"]
    markers = "\n".join(f"    {m}" for m in ini["markers"])
    (d / "pytest.ini").write_text(f"[pytest]\ntestpaths = tests\naddopts = {ini['addopts']}\nmarkers =\n{markers}\n")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("MLA_LAB_REQUIRE_GPU", FAST_LIMIT_ENV, FAST_LIMIT_LOAD_ENV)}
    if env_value is not None:
        env["MLA_LAB_REQUIRE_GPU"] = env_value
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=d, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # a pytest subprocess (1 s); the MLA_LAB_REQUIRE_GPU check stays in test-fast
def test_gpu_skips_are_skips_by_default(tmp_path):
    r = _run_policy(tmp_path, None)
    assert r.returncode == 0, r.stdout
    assert re.search(r"2 passed, 3 skipped", r.stdout), r.stdout


def test_require_gpu_turns_every_gpu_skip_into_a_failure_with_the_reason(tmp_path):
    r = _run_policy(tmp_path, "1")
    assert r.returncode == 1, r.stdout
    out = r.stdout
    assert re.search(r"1 failed, 2 passed, 1 skipped, 1 error", out), out  # a skip in setup shows as an error
    assert "MLA_LAB_REQUIRE_GPU=1: this gpu test may not skip; it was skipped because: no CUDA GPU here" in out
    assert ("MLA_LAB_REQUIRE_GPU=1: this gpu test may not skip; it was skipped because: flash_mla unavailable: "
            "no provider") in out
    assert re.search(r"SKIPPED \[1\] tests/test_policy.py:\d+: an ordinary skip", out)  # not a gpu test: stays


@pytest.mark.slow  # a pytest subprocess (1 s); the MLA_LAB_REQUIRE_GPU check stays in test-fast
def test_unregistered_marker_is_an_error(tmp_path):
    (tmp_path / "suite" / "tests").mkdir(parents=True)
    (tmp_path / "suite" / "tests" / "test_typo.py").write_text("import pytest\n\n@pytest.mark.gpuu\ndef test_x():\n"
                                                               "    pass\n")
    r = _run_policy(tmp_path, None)
    assert r.returncode != 0 and "'gpuu' not found in `markers` configuration option" in r.stdout + r.stderr


@pytest.mark.slow  # a pytest subprocess (1 s); the MLA_LAB_REQUIRE_GPU check stays in test-fast
def test_slow_deselection(tmp_path):
    r = _run_policy(tmp_path, None, "-m", "not slow")
    assert r.returncode == 0 and "1 deselected" in r.stdout, r.stdout


FAST_LIMIT_ENV = "MLA_LAB_FAST_LIMIT_S"
FAST_LIMIT_LOAD_ENV = "MLA_LAB_FAST_LIMIT_LOAD"
_GUARD_TESTS = '''
import time

import pytest

@pytest.fixture
def slow_setup():
    time.sleep(1.0)

def test_quick():
    pass

def test_body_over_the_limit():
    time.sleep(1.0)

@pytest.mark.slow
def test_slow_one_may_take_long():
    time.sleep(1.0)

def test_setup_time_is_not_counted(slow_setup):
    pass
'''


def test_fast_guard_fails_a_test_not_marked_slow_whose_call_is_over_the_limit(tmp_path):
    """The guard of tests/conftest.py at a 0.4 s limit: the 1 s body not marked slow fails with its time; a slow
    test and a slow fixture setup do not."""
    r = _run_policy(tmp_path, None, tests=_GUARD_TESTS, extra_env={FAST_LIMIT_ENV: "0.4", FAST_LIMIT_LOAD_ENV: "0"})
    out = r.stdout
    assert r.returncode == 1 and re.search(r"\b1 failed, 3 passed\b", out), out
    assert re.search(r"FAILED tests/test_policy.py::test_body_over_the_limit", out), out
    assert re.search(r"not marked slow but took \d+\.\d s \(wall\) > 0.4 s, the fast-test limit", out), out


@pytest.mark.slow  # two pytest subprocesses (2-3 s)
def test_fast_guard_off_and_bad_limit(tmp_path):
    r = _run_policy(tmp_path, None, tests=_GUARD_TESTS, extra_env={FAST_LIMIT_ENV: "0"})
    assert r.returncode == 0 and re.search(r"\b4 passed\b", r.stdout), r.stdout
    r = _run_policy(tmp_path, None, tests=_GUARD_TESTS, extra_env={FAST_LIMIT_ENV: "ten"})
    assert r.returncode != 0 and "MLA_LAB_FAST_LIMIT_S='ten' must be a number of seconds" in r.stdout + r.stderr


def test_fast_guard_default_is_10_s_on_an_idle_machine_and_grows_with_the_load(monkeypatch):
    text = (REPO / "tests" / "conftest.py").read_text()
    assert re.search(r"^FAST_LIMIT_S = 10\.0$", text, flags=re.M)
    from conftest import fast_limit_for_load

    monkeypatch.delenv(FAST_LIMIT_LOAD_ENV, raising=False)
    assert [fast_limit_for_load(10.0, x) for x in (0.0, 0.5, 1.0, 2.0, 3.5)] == [10.0, 10.0, 10.0, 20.0, 35.0]
    monkeypatch.setenv(FAST_LIMIT_LOAD_ENV, "0")
    assert fast_limit_for_load(10.0, 3.5) == 10.0


# ------------------------------------------------------------------------------------------------ install


def _req_name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower()


def test_gpu_extra_never_replaces_torch():
    """torch is not in the gpu extra, and the FlashMLA provider is pinned exactly (a build whose wheel declares no
    torch requirement; the matrix of builds and torch versions is in the comment above the extra)."""
    gpu = PYPROJECT["project"]["optional-dependencies"]["gpu"]
    names = {_req_name(r): r for r in gpu}
    assert "torch" not in names
    assert names["tokenspeed-flashmla"] == "tokenspeed-flashmla==1.0.0.post20260429"
    text = (REPO / "pyproject.toml").read_text()
    block = text[: text.index("gpu = [")]
    assert "built for torch" in block and "1.0.0.post20260429" in block and "2.11" in block


def test_lab_extra_brings_playwright_but_no_browser_download():
    lab = {_req_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["lab"]}
    assert {"playwright", "pillow", "papermill", "matplotlib"} <= lab
    assert "playwright install" not in (REPO / ".ci" / "run").read_text().replace("no `playwright install`", "")


LAB_MODULES = ("papermill", "nbformat", "nbconvert", "matplotlib", "ipykernel", "IPython", "ipywidgets", "jupytext",
               "jupyterlab", "playwright", "PIL")


def test_sweep_without_the_lab_extra_says_which_extra_in_one_line(tmp_path):
    """With every module of the lab extra unimportable, ``mla-lab sweep`` exits 1 with one line naming the extra."""
    code = textwrap.dedent(f"""
        import sys
        for m in {LAB_MODULES!r}:
            sys.modules[m] = None  # import fails, importlib.util.find_spec gives None: as if not installed
        from mla_lab.cli import main
        sys.exit(main(["sweep", "-p", "models", "[glm-5]", "-p", "store_dir", "st", "-p", "data_file", "x.csv"]))
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1, r.stderr
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert re.fullmatch(r"mla-lab: error: mla-lab sweep needs the 'lab' extra \(papermill, nbformat, nbconvert, "
                        r"matplotlib not installed\): pip install -e '\.\[lab\]' .*", lines[0]), lines[0]
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "st").exists()


def test_examples_cite_public_sources_not_a_private_facts_file():
    """Citations name public sources (vLLM PR #53878, flashmla_sparse.py, FlashMLA's README), never a private
    notes file that is not in the repository."""
    for p in sorted((REPO / "examples").rglob("*")):
        if p.is_file():
            assert "FACTS" not in p.read_text(), p
    seed = (REPO / "examples" / "seed.yaml").read_text()
    assert "vLLM PR #53878" in seed and "flashmla_sparse.py" in seed


def test_fast_guard_acts_in_the_fast_suite_only(monkeypatch):
    """The guard fails slow tests under ``-m "not slow"`` (make test-fast) or with its variable set; the full suite
    (make test, CI) is never failed for a test's speed on a slower machine."""
    from conftest import _guarding

    class Config:
        def __init__(self, m):
            self.m = m

        def getoption(self, name, default=None):
            return self.m

    monkeypatch.delenv(FAST_LIMIT_ENV, raising=False)
    assert _guarding(Config("not slow")) and _guarding(Config("gpu and not slow"))
    assert not _guarding(Config("")) and not _guarding(Config("gpu"))
    monkeypatch.setenv(FAST_LIMIT_ENV, "5")
    assert _guarding(Config(""))
