"""The declared dependencies (issue 22): pyproject.toml, the pip lock constraints.txt that `make` installs from, and
the two conda environments (environment.yml for CPU, environment-gpu.yml for GPU) list the same packages; every
third-party module the package, its notebooks and tests import is declared, and nothing declared goes unused."""

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS = PYPROJECT["optional-dependencies"]
# pip name -> conda-forge name where they differ
CONDA_NAMES = {"torch": "pytorch", "ray": "ray-core", "jupyter-client": "jupyter_client"}
FLASHMLA_PIN = "tokenspeed-flashmla==1.0.0.post20260429"  # built for torch 2.11 + CUDA 13.0 (pyproject.toml: matrix)
GPU_PIP = {"torch": "torch==2.11.0", "triton": "triton==3.6.0", "tokenspeed-flashmla": FLASHMLA_PIN}


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _declared(*groups: str) -> dict:
    from packaging.requirements import Requirement

    reqs = list(PYPROJECT["dependencies"]) if "core" in groups else []
    for g in groups:
        if g != "core":
            reqs += EXTRAS[g]
    return {_name(r): Requirement(r) for r in reqs}


def _env(path: str) -> tuple[dict, set[str], list[str]]:
    """(the parsed file, its conda package names, its pip lines)."""
    env = yaml.safe_load((REPO / path).read_text())
    conda, pip_lines = set(), []
    for d in env["dependencies"]:
        if isinstance(d, dict):
            pip_lines += d["pip"]
        else:
            conda.add(_name(d))
    return env, conda - {"python", "pip"}, pip_lines


def _conda(names) -> set[str]:
    return {CONDA_NAMES.get(n, n).replace("_", "-") for n in names}


def test_cpu_environment_matches_pyproject():
    env, conda, pip_lines = _env("environment.yml")
    assert env["channels"] == ["conda-forge"], "use conda-forge only (the pytorch channel is deprecated)"
    assert conda == _conda(_declared("core", "lab", "dev"))
    assert pip_lines == ["-e ."]  # no GPU package in the CPU environment


def test_gpu_environment_pins_the_flashmla_build_torch_cuda_and_driver():
    env, conda, pip_lines = _env("environment-gpu.yml")
    assert env["channels"] == ["conda-forge"]
    pip_only = set(GPU_PIP)
    assert conda == _conda(set(_declared("core", "lab", "dev", "gpu")) - pip_only)
    reqs = [x.split("#")[0].strip() for x in pip_lines if not x.startswith("-")]
    assert {_name(r): r for r in reqs} == GPU_PIP
    assert "--extra-index-url https://download.pytorch.org/whl/cu130" in pip_lines and pip_lines[-1] == "-e ."
    assert FLASHMLA_PIN in EXTRAS["gpu"]  # the same provider build as the gpu extra
    head = (REPO / "environment-gpu.yml").read_text().split("name:")[0]
    assert "driver >= 580" in head and "CUDA 13.0" in head and "torch 2.11" in head


def test_python_versions_agree():
    need = tuple(int(x) for x in PYPROJECT["requires-python"].lstrip(">=").split("."))
    for path in ("environment.yml", "environment-gpu.yml"):
        env = yaml.safe_load((REPO / path).read_text())
        ver = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
        assert tuple(int(x) for x in ver.split("=")[1].split(".")) >= need, path


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
            assert m, f"constraints.txt: {line!r} is not an exact pin name==version"
            pins[_name(m.group(1))] = m.group(2)
    return pins


def test_constraints_pin_every_declared_package_within_its_range():
    """Each package of the core, lab and dev lists except torch (the Makefile's TORCH_SPEC) is pinned exactly in
    constraints.txt, at a version the declared range allows; the gpu extra is not (environment-gpu.yml)."""
    from packaging.version import Version

    pins = _constraints()
    for name, req in _declared("core", "lab", "dev").items():
        if name == "torch":
            assert name not in pins, "torch comes from TORCH_SPEC (CPU build) or the GPU machine's own torch"
            continue
        assert name in pins, f"{name} is declared but not pinned in constraints.txt"
        assert req.specifier.contains(Version(pins[name]), prereleases=True), (name, str(req.specifier), pins[name])
    assert "tokenspeed-flashmla" not in pins


def test_makefile_installs_from_the_constraints_with_progress():
    mk = (REPO / "Makefile").read_text()
    assert re.search(r"^CONSTRAINTS \?= constraints\.txt$", mk, flags=re.M)
    assert re.search(r"^PIP_INSTALL := \$\(PY\) -m pip install \$\(if \$\(CONSTRAINTS\),-c \$\(CONSTRAINTS\)\)$", mk,
                     flags=re.M)
    recipe = mk[mk.index("$(VENV)/.stamp:"):mk.index("venv: $(VENV)/.stamp")]
    assert recipe.splitlines()[0].split(":", 1)[1].split() == ["pyproject.toml", "$(CONSTRAINTS)"]
    installs = [ln for ln in recipe.splitlines() if "pip install" in ln or "$(PIP_INSTALL)" in ln]
    assert len(installs) == 3 and all("$(PIP_INSTALL)" in ln and " -q" not in ln for ln in installs), installs
    assert len(re.findall(r'@echo "\[make\] \d/5 ', recipe)) == 5  # one line per step
    assert re.search(r"^test:.*\n\t.*pytest -q \$\(XDIST\)", mk, flags=re.M)
    assert re.search(r"^XDIST \?= -n auto --dist loadfile$", mk, flags=re.M)


def test_triton_in_dev_only_on_linux():
    from packaging.requirements import Requirement

    dev = {_name(r): r for r in EXTRAS["dev"]}
    marker = Requirement(dev["triton"]).marker
    assert marker is not None and marker.evaluate({"platform_system": "Linux"})
    assert not marker.evaluate({"platform_system": "Darwin"}) and not marker.evaluate({"platform_system": "Windows"})


# ------------------------------------------------------------------------------------ imported == declared

#: import name -> distribution name, where they differ
MODULE_DIST = {"yaml": "pyyaml", "PIL": "pillow", "IPython": "ipython", "flash_mla": "tokenspeed-flashmla",
               "pynvml": "nvidia-ml-py", "jupyter_client": "jupyter-client",
               "bs4": "beautifulsoup4"}
#: declared but used as a program or a plugin, not imported: why each is declared
NOT_IMPORTED = {
    "jupyterlab": "make lab",
    "ipykernel": "the notebooks' kernel (mla_lab.kernelspec installs it)",
    "ruff": "ruff check . (tests/test_lint.py, pre-commit)",
    "pre-commit": ".pre-commit-config.yaml",
    "nbstripout": "a pre-commit hook",
    "pytest-xdist": "make test -n auto",
    "pyarrow": "pandas' default str dtype backend (pyproject.toml: lab)",
}


def _imported_modules(base: Path = REPO, roots=("mla_lab", "notebooks", "tests", "benchmarks")) -> dict[str, set[str]]:
    """Top-level third-party modules imported anywhere under ``base/roots`` -> the files importing them."""
    found: dict[str, set[str]] = {}
    siblings = {p.stem for p in (base / "tests").glob("*.py")}  # a test module importing another (tests/ on sys.path)
    for root in roots:
        for p in sorted((base / root).rglob("*.py")):
            for n in ast.walk(ast.parse(p.read_text(), filename=str(p))):
                if isinstance(n, ast.Import):
                    names = [a.name for a in n.names]
                elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                    names = [n.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ("mla_lab", "conftest", "__future__") \
                            and top not in siblings:
                        found.setdefault(top, set()).add(str(p.relative_to(base)))
    return found


def test_every_imported_module_is_declared_and_every_declared_package_is_used():
    declared = set(_declared("core", "lab", "dev", "gpu", "ray"))
    imported = _imported_modules()
    dists = {MODULE_DIST.get(m, m).lower().replace("_", "-"): files for m, files in imported.items()}
    undeclared = {d: sorted(f)[:3] for d, f in dists.items() if d not in declared}
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
    unused = declared - set(dists) - set(NOT_IMPORTED)
    assert not unused, f"declared in pyproject.toml but imported nowhere (drop it, or say why in NOT_IMPORTED): {unused}"


def test_the_import_scan_sees_a_missing_declaration(tmp_path):
    """The scan of the test above on a file importing an undeclared module (the check can fail)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("import pyarrow.parquet as pq\nfrom os import path\n")
    found = _imported_modules(tmp_path, roots=("pkg",))
    assert found == {"pyarrow": {"pkg/m.py"}}


@pytest.mark.parametrize("module", ["jinja2", "pynvml", "PIL", "yaml"])
def test_module_dist_names(module):
    """The import -> distribution names used above are the ones installed (where the distribution is here)."""
    from importlib.metadata import packages_distributions

    dists = {d.lower().replace("_", "-") for d in packages_distributions().get(module, [])}
    if not dists:
        pytest.skip(f"{module} is not installed here (the gpu extra brings pynvml)")
    assert MODULE_DIST.get(module, module).lower() in dists
