"""The README's module map, generated from the package (issue 31): one row per sub-package with the first sentence
of its docstring, ordered by its layer in the import graph, then the top-level modules. Read with :mod:`ast`, nothing
imported; ``tests/test_front_door.py`` checks README.md's block is current.

    python -m mla_lab.report.module_map [--update-readme]
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from functools import cache
from pathlib import Path

from ..paths import REPO_ROOT
from .blocks import block_main, update_block

__all__ = ["BEGIN", "END", "PACKAGE", "units", "layer", "summary", "module_map", "update_readme"]

PACKAGE = REPO_ROOT / "mla_lab"
BEGIN = "<!-- modules:begin (python -m mla_lab.report.module_map --update-readme) -->"
END = "<!-- modules:end -->"
_ROLE = re.compile(r":(?:mod|func|class|meth|data|attr):`~?\.?([^`]+)`")
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+(?=[A-Z`(])")


def units(package: Path = PACKAGE) -> dict[str, Path]:
    """The package's units: ``{name: path}`` for every sub-package (its folder) and top-level module (its file),
    sorted by name. A folder without ``__init__.py`` is not a unit."""
    found = {p.name: p for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    found |= {p.stem: p for p in package.glob("*.py") if p.name != "__init__.py"}
    return dict(sorted(found.items()))


def _files(path: Path) -> list[Path]:
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def _imported_units(path: Path, package: Path) -> set[str]:
    """The other units of the package that ``path``'s files import (absolute ``mla_lab.x`` and relative)."""
    names, here = set(units(package)), path.name if path.is_dir() else path.stem
    out = set()
    for f in _files(path):
        depth_in_pkg = len(f.relative_to(package).parts) - 1  # 0: a top-level module; 1: in a sub-package; ...
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module or ""]
            elif isinstance(node, ast.ImportFrom) and node.level - 1 == depth_in_pkg:  # ``from ..x import``
                mods = [f"mla_lab.{node.module}" if node.module else f"mla_lab.{a.name}" for a in node.names]
            else:  # not an import, or one inside its own unit
                continue
            for m in mods:
                parts = m.split(".")
                if parts[0] == "mla_lab" and len(parts) > 1 and parts[1] in names and parts[1] != here:
                    out.add(parts[1])
    return out


@cache
def _graph(package: Path = PACKAGE) -> dict[str, frozenset[str]]:
    return {name: frozenset(_imported_units(p, package)) for name, p in units(package).items()}


def layer(name: str, package: Path = PACKAGE) -> int:
    """A unit's layer in the import graph: 0 when it imports no other unit, else 1 + the highest layer of what it
    imports. Raises ValueError: ``name`` is not a unit of the package, or the imports form a circle."""
    graph = _graph(package)
    if name not in graph:
        raise ValueError(f"name={name!r} is not a unit of {package}; allowed: {', '.join(graph)}")

    def go(n: str, seen: tuple[str, ...]) -> int:
        if n in seen:
            raise ValueError(f"import circle: {' -> '.join((*seen, n))}")
        return 1 + max((go(d, (*seen, n)) for d in graph[n]), default=-1)

    return go(name, ())


def summary(path: Path) -> str:
    """The first sentence of a unit's docstring (``__init__.py`` for a sub-package) as Markdown: Sphinx roles and
    double back-quotes become single back-quotes, ``|`` is escaped. ``"(no docstring)"`` when there is none."""
    f = path / "__init__.py" if path.is_dir() else path
    doc = ast.get_docstring(ast.parse(f.read_text(), str(f)))
    if not doc:
        return "(no docstring)"
    first = _SENTENCE_END.split(" ".join(doc.split("\n\n")[0].split()))[0]
    return _ROLE.sub(lambda m: f"`{m.group(1)}`", first).replace("``", "`").replace("|", "\\|")


def module_map(package: Path = PACKAGE) -> str:
    """The Markdown block: the sub-packages (layer, name, first docstring sentence), lowest layer first, then the
    top-level modules."""
    us = units(package)
    order = sorted(us, key=lambda n: (layer(n, package), n))
    subs = [n for n in order if us[n].is_dir()]
    mods = [n for n in order if not us[n].is_dir()]
    lines = ["| layer | sub-package | what it is (its docstring's first sentence) |", "|---|---|---|"]
    lines += [f"| {layer(n, package)} | `mla_lab/{n}/` | {summary(us[n])} |" for n in subs]
    tail = (f"Top-level modules, lowest layer first: {', '.join(f'`{n}`' for n in mods)}. Layer = 1 + the highest "
            "layer the unit imports (read from the imports with `ast`; 0: it imports no other unit).")
    lines += ["", textwrap.fill(tail, width=116, break_on_hyphens=False, break_long_words=False)]
    return "\n".join(lines)


def update_readme(block: str, path: Path = REPO_ROOT / "README.md") -> bool:
    """Rewrite README.md's module-map block with ``block``; True when the file changed. Raises as
    :func:`mla_lab.report.blocks.splice`."""
    return update_block(path, BEGIN, END, block, "module-map")


def main(argv=None) -> int:
    return block_main(argv, __spec__.name, REPO_ROOT / "README.md", BEGIN, END, module_map, "module-map",
                      "--update-readme")


if __name__ == "__main__":
    sys.exit(main())
