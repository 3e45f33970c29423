"""environment.yml (conda-forge) and pyproject.toml list the same packages."""

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
# pip name -> conda-forge name where they differ
CONDA_NAMES = {"torch": "pytorch", "ray": "ray-core"}
PIP_ONLY = {"tokenspeed-flashmla"}  # not on conda-forge: listed in the environment's pip section


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[;]", req.strip(), maxsplit=1)[0].lower()


def test_environment_matches_pyproject():
    py = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pip_names = {_name(r) for r in py["dependencies"]}
    for extra in ("lab", "gpu", "dev"):
        pip_names |= {_name(r) for r in py["optional-dependencies"][extra]}
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"], "use conda-forge only (the pytorch channel is deprecated)"
    conda, pip_section = set(), set()
    for d in env["dependencies"]:
        if isinstance(d, dict):
            pip_section |= {_name(x) for x in d["pip"] if not x.startswith("-")}
        else:
            conda.add(_name(d))
    conda -= {"python", "pip"}
    expected_conda = {CONDA_NAMES.get(n, n) for n in pip_names - PIP_ONLY}
    assert conda == expected_conda
    assert pip_section == PIP_ONLY


def test_python_versions_agree():
    py = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    ver = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    major_minor = tuple(int(x) for x in ver.split("=")[1].split("."))
    assert major_minor >= tuple(int(x) for x in py.lstrip(">=").split("."))
