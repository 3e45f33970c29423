"""The fenced Python examples of README.md and docs/*.md run (issue 19).

Every block fenced as ```python is executed on its own (a fresh namespace, the working directory a temporary
folder), so an example that names a moved module or a stale signature fails here. A block that cannot run on a CPU
machine (a Ray cluster, a GPU) is fenced ```python no-run: it is compiled, and its imports are executed, so the
names it uses stay importable. Shell commands are fenced ```bash, program output ```text (neither is run here).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PYTHON_LANGS = {"python", "py", "python3", "pycon"}
FLAGS = {"", "no-run"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")


def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """``(line of the opening fence, info string, code)`` of every fenced block of a Markdown text."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, start, body = m.group("fence"), len(m.group("indent")), i + 1, []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        blocks.append((start, m.group("info").strip(), "\n".join(body) + "\n"))
        i += 1
    return blocks


def _python_blocks() -> list[tuple[str, str, str]]:
    """``(id, flag, code)`` of every Python block of the docs; id = file:line."""
    out = []
    for doc in DOCS:
        for line, info, code in fenced_blocks(doc.read_text()):
            lang, _, flag = info.partition(" ")
            if lang.lower() in PYTHON_LANGS:
                out.append((f"{doc.relative_to(REPO)}:{line}", flag.strip(), code))
    return out


BLOCKS = _python_blocks()


def test_the_docs_have_python_examples():
    assert len(BLOCKS) >= 4 and any(flag == "" for _, flag, _ in BLOCKS)


@pytest.mark.parametrize("where,flag", [(w, f) for w, f, _ in BLOCKS], ids=[w for w, _, _ in BLOCKS])
def test_python_block_is_python_and_marked_run_or_no_run(where, flag):
    code = next(c for w, _, c in BLOCKS if w == where)
    assert flag in FLAGS, f"{where}: fence flag {flag!r}; allowed: ```python (runs here) or ```python no-run"
    compile(code, where, "exec")  # a syntax error fails even in a no-run block


@pytest.mark.parametrize("where", [w for w, f, _ in BLOCKS if f == ""], ids=[w for w, f, _ in BLOCKS if f == ""])
def test_runnable_python_block_runs(where, tmp_path, monkeypatch):
    code = next(c for w, _, c in BLOCKS if w == where)
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    exec(compile(code, where, "exec"), {"__name__": "__docs_example__"})


@pytest.mark.parametrize("where", [w for w, f, _ in BLOCKS if f == "no-run"],
                         ids=[w for w, f, _ in BLOCKS if f == "no-run"])
def test_no_run_block_imports_exist(where):
    code = next(c for w, _, c in BLOCKS if w == where)
    tree = ast.parse(code, where)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert imports, f"{where}: a no-run block with no import checks nothing: fence it ```text if it is not code"
    exec(compile(ast.Module(body=imports, type_ignores=[]), where, "exec"), {"__name__": "__docs_example__"})


def test_fence_parser_on_a_sample():
    """The parser on fences the checks depend on: flags, other languages, an indented fence, an unrunnable block
    (whose run would fail: the checks above can fail)."""
    md = ("text\n```python\nx = 1\n```\n```python no-run\nfrom mla_lab.executors import RayExecutor\n```\n"
          "```bash\nmake test\n```\n  ```python\n  y = 2\n  ```\n")
    blocks = fenced_blocks(md)
    assert [(b[1], b[2]) for b in blocks] == [("python", "x = 1\n"), ("python no-run",
                                              "from mla_lab.executors import RayExecutor\n"),
                                             ("bash", "make test\n"), ("python", "y = 2\n")]
    with pytest.raises(ModuleNotFoundError, match="mla_lab.executors"):
        exec(blocks[1][2], {})
