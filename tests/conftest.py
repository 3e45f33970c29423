"""Test-suite policy: GPU tests may not skip on a GPU run, and which tests are too slow for `make test-fast`.

- ``MLA_LAB_REQUIRE_GPU=1`` (a GPU machine's run, e.g. ``benchmarks/h200_run.sh``): every skip of a test marked
  ``gpu`` — no CUDA, no flash_mla provider, a capability the test cannot use — is reported as a failure with the
  skip's reason, so a GPU run cannot pass by skipping its GPU tests; a test marked ``gpus(n)`` keeps its skip on a
  machine with fewer than ``n`` GPUs (a one-GPU run does not fail on the multi-GPU tests it cannot run).
- ``slow``: tests that take more than a few seconds on a 2-core CPU. A test file may mark its own; the files and
  tests listed in :data:`SLOW` and every test using a fixture of :data:`SLOW_FIXTURES` (notebook runs through
  papermill, a local Ray instance, the published report in Chromium, the Triton CPU interpreter) are marked here. ``make test-fast`` runs ``-m "not slow"``.
- The fast-test guard (under ``-m "not slow"``, i.e. ``make test-fast``, or with ``MLA_LAB_FAST_LIMIT_S`` set; not
  in the full suite): a test *not* marked ``slow`` whose call (the test body, not its fixtures' setup) takes more
  than :data:`FAST_LIMIT_S` seconds of wall time fails, naming its time, so ``make test-fast`` stays fast: mark it
  ``slow`` (here or in its file) or make it faster. The limit is for an idle machine: on a loaded one it is
  multiplied by the load per core (1-minute load average / cores, when above 1), so a test that takes 4 s idle does
  not fail because two other processes share the 2 cores (:func:`fast_limit_for_load`). ``MLA_LAB_FAST_LIMIT_S``
  sets another limit (seconds; ``0`` turns the guard off); ``MLA_LAB_FAST_LIMIT_LOAD=0`` keeps it fixed.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from pathlib import Path

import pytest

REQUIRE_GPU_ENV = "MLA_LAB_REQUIRE_GPU"
FAST_LIMIT_ENV = "MLA_LAB_FAST_LIMIT_S"
FAST_LIMIT_LOAD_ENV = "MLA_LAB_FAST_LIMIT_LOAD"
#: Wall seconds a test not marked ``slow`` may take in its call phase (``make test-fast`` <= 45 s on 2 idle cores).
FAST_LIMIT_S = 10.0

#: Node-id prefixes marked ``slow`` (a file: every test in it). Times: 2-core CPU, the whole suite's --durations
#: (idle, or a loaded machine's figure divided by its slowdown).
SLOW = (
    "tests/test_executors.py",  # a local Ray instance per test (7-25 s)
    "tests/test_notebook.py",  # papermill runs of the sweep notebook (3-16 s each)
    "tests/test_notebook_explore.py",  # the explorer notebook in a kernel (4 s)
    "tests/test_report_site.py",  # publishes reports through the CLI (8 s setup)
    "tests/test_measure_tp.py",  # gloo TP=2 ranks (14 s setup)
    "tests/test_properties.py::test_concat_real_heads_equal_inputs_padded_heads_untouched",  # hypothesis (6 s)
    "tests/test_report.py::test_report_module_leaves_the_matplotlib_backend_alone",  # a python subprocess (2.5 s)
    "tests/test_report.py::test_figures_have_no_clipped_legend_or_title",  # every report figure drawn (5.8 s)
    "tests/test_kernels_triton_interp.py",  # Triton interpreter (6 s first compile)
    "tests/test_fault_injection.py",  # a 2000-point sweep killed and resumed
    "tests/test_store_claims.py",  # two sweep processes on one store
    "tests/test_bad_input.py::test_bad_input[cli_",  # the CLI in a subprocess (2-3 s each)
    "tests/test_resume.py::test_sigkill",  # a sweep subprocess killed and resumed
    "tests/test_cli_flags.py::test_every_serve_flag_acts",  # two serving simulations per flag (22 flags, 1-5 s each)
    "tests/test_subchunk_graph.py::test_graph2_eager_loop_equals_every_strategy_on_cpu",  # every strategy on tensors (3-4 s)
    "tests/test_engines.py::test_every_real_preset_gives_the_same_real_heads",  # every preset on tensors (5 cases, 2 s each)
    "tests/test_sweep.py::test_fused_equals_unfused",  # the strategies on tensors per head count (12 cases, 1-2 s each)
    "tests/test_report_noise.py::test_figure_renders_with_the_reported_lines_and_percentiles",  # a figure drawn (5 s)
    "tests/test_browser.py::test_published_report_renders_with_every_figure",
    "tests/test_browser.py::test_index_and_run_report_render",
)


#: Tests that run Triton's CPU interpreter (node-id prefixes, and every test using a fixture of
#: :data:`TRITON_FIXTURES`). Triton ships Linux wheels only and the dev extra lists it for Linux only
#: (``platform_system == 'Linux'``): elsewhere, without triton, these skip with that reason; on Linux a missing
#: triton is an install error and they fail.
TRITON_TESTS = ("tests/test_kernels_triton_interp.py",)
TRITON_FIXTURES = ("worker_results",)

#: Fixtures whose setup alone takes more than a few seconds: every test using one is marked ``slow``.
SLOW_FIXTURES = (
    "worker_results",  # tests/test_measure_layer.py: the layer runner in a worker under the Triton interpreter (13-22 s)
)


def has_gpu_tests(path: Path) -> bool:
    """The test file marks a test (or itself) ``gpu``: an ``@pytest.mark.gpu`` decorator or a ``pytestmark``
    naming ``mark.gpu``. Read from the source (ast), without importing it."""
    import ast

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "gpu" and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "mark":
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    """``pytest -m gpu`` (the GPU machine's command) collects only the test files that hold GPU tests: the others'
    tests would all be deselected, and importing them needs the lab and dev extras (nbformat, hypothesis, ...), which
    a bare GPU image lacks. Every other selection collects every file (a missing extra there is an install error)."""
    p = Path(collection_path)
    if (config.getoption("markexpr", "") or "").strip() != "gpu" or p.suffix != ".py" \
            or not p.name.startswith("test_"):
        return None
    return True if not has_gpu_tests(p) else None


def _visible_gpus() -> int:
    """CUDA devices torch sees (0 without torch or CUDA)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def require_gpu() -> bool:
    """``MLA_LAB_REQUIRE_GPU`` is set to a true value (1, true, yes)."""
    return os.environ.get(REQUIRE_GPU_ENV, "").strip().lower() in ("1", "true", "yes")


def fast_limit_s() -> float:
    """The fast-test guard's limit in seconds (``MLA_LAB_FAST_LIMIT_S``, else :data:`FAST_LIMIT_S`); 0: no guard."""
    raw = os.environ.get(FAST_LIMIT_ENV, "").strip()
    if not raw:
        return FAST_LIMIT_S
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{FAST_LIMIT_ENV}={raw!r} must be a number of seconds (0 turns the guard off)") from None
    if value < 0:
        raise pytest.UsageError(f"{FAST_LIMIT_ENV}={raw!r} must be >= 0 (0 turns the guard off)")
    return value


def _no_triton_reason() -> str | None:
    """Why the Triton-interpreter tests skip here (not Linux and no triton), or None when they run."""
    if platform.system() == "Linux" or importlib.util.find_spec("triton") is not None:
        return None
    return (f"triton is not installed: it ships Linux wheels only (the dev extra installs it on Linux; this is "
            f"{platform.system()})")


def load_per_core() -> float:
    """1-minute load average per core (0 where the platform has no load average)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return 0.0


def fast_limit_for_load(limit: float, load: float) -> float:
    """The guard's limit on a machine with ``load`` runnable processes per core: ``limit`` up to 1, then
    ``limit * load`` (each process gets about 1/load of a core); ``MLA_LAB_FAST_LIMIT_LOAD=0``: ``limit``."""
    if os.environ.get(FAST_LIMIT_LOAD_ENV, "").strip() == "0":
        return limit
    return limit * max(1.0, load)


def _guarding(config) -> bool:
    """The fast-test guard acts where the fast suite runs: ``-m "not slow"`` (``make test-fast``), or always with
    ``MLA_LAB_FAST_LIMIT_S`` set. The full suite (``make test``, CI) runs every test and is not failed for a test's
    speed on a slower machine: a time limit is a benchmark's job, not a unit test's."""
    return bool(os.environ.get(FAST_LIMIT_ENV)) or "not slow" in (config.getoption("-m", default="") or "")


def pytest_collection_modifyitems(config, items):
    no_triton = _no_triton_reason()
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        slow = any(item.nodeid.startswith(p) for p in SLOW) or bool(fixtures & set(SLOW_FIXTURES))
        if slow and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
        if no_triton and (any(item.nodeid.startswith(p) for p in TRITON_TESTS) or fixtures & set(TRITON_FIXTURES)):
            item.add_marker(pytest.mark.skip(reason=no_triton))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    limit = fast_limit_s() if _guarding(item.config) else 0.0
    if rep.when == "call" and rep.passed and limit > 0 and item.get_closest_marker("slow") is None:
        load = load_per_core()
        allowed = fast_limit_for_load(limit, load)
        if call.duration > allowed:
            scaled = f" ({limit:g} s x load {load:.1f} per core)" if allowed > limit else ""
            rep.outcome = "failed"
            rep.longrepr = (f"not marked slow but took {call.duration:.1f} s (wall) > {allowed:.3g} s{scaled}, the "
                            f"fast-test limit of tests/conftest.py: mark it slow (tests/conftest.py SLOW, or "
                            f"@pytest.mark.slow) or make it faster ({FAST_LIMIT_ENV}=0 turns the guard off)")
            return
    if not (rep.skipped and require_gpu() and item.get_closest_marker("gpu") is not None):
        return
    many = item.get_closest_marker("gpus")
    if many is not None and _visible_gpus() < int(many.args[0]):
        return  # a multi-GPU test on a machine with fewer GPUs: outside this run's scope, its skip stands
    if hasattr(rep, "wasxfail"):
        return
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3 else str(rep.longrepr)
    reason = reason.removeprefix("Skipped: ")
    rep.outcome = "failed"
    rep.longrepr = (f"{REQUIRE_GPU_ENV}=1: this gpu test may not skip; it was skipped because: {reason}")


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``mla-lab argv`` in this process: ``(exit code, stdout, stderr)`` (argparse's SystemExit read as the code)."""
    import contextlib
    import io

    from mla_lab import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()
