"""Check the engine records' facts against a release wheel by reading its Python sources with ``ast``.
The wheel is read as a zip, never installed or imported. A source's ``scope`` must hold a node matching its
``code`` (equal, a ``Call`` with those arguments among more, a ``Dict`` / ``Set`` holding its entries) at its
recorded line. Statuses: ``holds``, ``moved``, ``fails`` (nothing matches), ``missing`` (file or scope absent)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from .record import Source
from .registry import engine_version, version_facts

__all__ = ["check_source", "check_wheel", "find_wheel", "download_wheel", "write_report",
           "format_report", "wheel_version"]

STATUSES = ("holds", "moved", "fails", "missing")


def _dump(node) -> str:
    return ast.dump(node, annotate_fields=True, include_attributes=False)


def _snippet(code: str):
    """The node a snippet stands for: an expression statement's expression, else the statement."""
    body = ast.parse(code).body
    if len(body) != 1:
        raise ValueError(f"code={code!r} must be one statement or expression")
    node = body[0]
    return node.value if isinstance(node, ast.Expr) else node


def _set_elts(node):
    if isinstance(node, ast.Set):
        return node.elts
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set")
            and len(node.args) == 1 and isinstance(node.args[0], (ast.Set, ast.List, ast.Tuple))):
        return node.args[0].elts
    return None


def _matches(want, node) -> bool:
    if _dump(want) == _dump(node):
        return True
    if isinstance(want, ast.Call) and isinstance(node, ast.Call):  # those arguments among more
        have = {k.arg: _dump(k.value) for k in node.keywords}
        return (_dump(want.func) == _dump(node.func) and len(want.args) <= len(node.args)
                and all(_dump(a) == _dump(b) for a, b in zip(want.args, node.args))
                and all(have.get(k.arg) == _dump(k.value) for k in want.keywords))
    if isinstance(want, ast.Dict) and isinstance(node, ast.Dict):
        have = {_dump(k): _dump(v) for k, v in zip(node.keys, node.values) if k is not None}
        return all(have.get(_dump(k)) == _dump(v) for k, v in zip(want.keys, want.values))
    we, ne = _set_elts(want), _set_elts(node)
    if we is not None and ne is not None:
        have = {_dump(e) for e in ne}
        return all(_dump(e) in have for e in we)
    return False


def _targets(node) -> list:
    """The targets of an assignment (``=`` or annotated), else []."""
    return node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []


def _scope(tree: ast.Module, scope: str):
    """The node ``scope`` names (``Cls.method``, a function, a module variable's assignment), or None."""
    node = tree
    for i, part in enumerate(scope.split(".") if scope else []):
        node = next((c for c in ast.walk(node) if isinstance(c, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and c.name == part), None)
        if node is None and i == 0:
            node = next((c for c in tree.body if any(isinstance(t, ast.Name) and t.id == part for t in _targets(c))
                         and c.value is not None), None)
        if node is None:
            return None
    return node


def _span(a: int, b: int) -> str:
    return f"{a}" if a == b else f"{a}-{b}"


def _entry_lines(want, node) -> str:
    """A dict-literal match is reported at its matching entries' lines, other matches at the node's."""
    if isinstance(want, ast.Dict) and isinstance(node, ast.Dict) and _dump(want) != _dump(node):
        keys = {_dump(k) for k in want.keys}
        hit = [(k, v) for k, v in zip(node.keys, node.values) if k is not None and _dump(k) in keys]
        if hit:
            return _span(hit[0][0].lineno, hit[-1][1].end_lineno)
    return _span(node.lineno, getattr(node, "end_lineno", None) or node.lineno)


def _overlap(recorded: str, found: str) -> bool:
    def rng(s):
        a, _, b = s.partition("-")
        return int(a), int(b or a)
    (a, b), (c, d) = rng(recorded), rng(found)
    return a <= d and c <= b


def check_source(text: str | None, src: Source) -> tuple[str, list, list, str]:
    """``(status, found, instead, detail)`` of one :class:`Source` in one file's text (None: absent).
    Raises ValueError: ``code`` not one statement / expression."""
    want = _snippet(src.code)
    if text is None:
        return "missing", [], [], f"{src.path} is not in the wheel"
    tree = ast.parse(text)
    scope = _scope(tree, src.scope)
    if scope is None:
        return "missing", [], [], f"scope {src.scope!r} not found in {src.path}"
    found = [_entry_lines(want, n) for n in ast.walk(scope) if hasattr(n, "lineno") and _matches(want, n)]
    if not found:
        tw = [_dump(t) for t in _targets(want)]
        instead = [f"{src.path}:{_entry_lines(n, n)}: {ast.unparse(n)}" for n in ast.walk(scope)
                   if tw and [_dump(t) for t in _targets(n)] == tw]
        return "fails", [], instead, f"no node matching {src.code!r} in {src.scope or 'the module'}"
    if src.line and src.line != "-" and not any(_overlap(src.line, f) for f in found):
        return "moved", found, [], f"recorded line {src.line}, found at {', '.join(found)}"
    return "holds", found, [], ""


def wheel_version(wheel: str | Path) -> tuple[str, str]:
    """``(engine, version)`` of ``<name>-<version>-...whl``. Raises ValueError: another name."""
    name = Path(wheel).name
    parts = name.split("-")
    if not name.endswith(".whl") or len(parts) < 3:
        raise ValueError(f"wheel={str(wheel)!r} is not a wheel file name (<name>-<version>-<tags>.whl)")
    return parts[0].lower().replace("_", "-"), parts[1]


def check_wheel(wheel: str | Path) -> dict:
    """Check every fact of every preset on the wheel's engine version: ``{engine, version, wheel, wheel_built,
    counts, facts: [{preset, key, text, path, line, scope, code, status, found, instead, detail}], lab_claims}``.
    Raises ValueError: no such file, not a zip, an engine version the lab does not describe."""
    p = Path(wheel)
    if not p.is_file():
        raise ValueError(f"wheel={str(wheel)!r} is not a file; allowed: a release wheel such as "
                         "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl (download it with --download)")
    engine, version = wheel_version(p)
    ev = engine_version(engine, version)
    try:
        zf = zipfile.ZipFile(p)
    except zipfile.BadZipFile:
        raise ValueError(f"wheel={str(wheel)!r} is not a zip file (a wheel is one)") from None
    with zf:
        names, built = set(zf.namelist()), max(i.date_time for i in zf.infolist())
        texts = {s.path: zf.read(s.path).decode() if s.path in names else None for _, _, s in version_facts(ev)}
    results = []
    for preset, fact, src in version_facts(ev):
        status, found, instead, detail = check_source(texts[src.path], src)
        results.append(dict(preset=preset, key=fact.key, text=fact.text, path=src.path, line=src.line,
                            scope=src.scope, code=src.code, status=status, found=found, instead=instead, detail=detail))
    lab = [r for r in results if r["preset"] == "lab (PR-era)"]
    results = [r for r in results if r["preset"] != "lab (PR-era)"]
    counts = {s: sum(r["status"] == s for r in results) for s in STATUSES}
    return {"engine": ev.engine, "version": ev.version, "wheel": p.name,
            "wheel_built": "%04d-%02d-%02d" % built[:3], "release_date": ev.release_date, "counts": counts,
            "facts": results, "lab_claims": [{**r, "still_holds": r["status"] in ("holds", "moved")} for r in lab]}


def find_wheel(folder: str | Path, engine: str, version: str) -> Path | None:
    """The wheel of ``engine==version`` in ``folder`` (None if absent)."""
    hits = sorted(Path(folder).glob(f"{engine.replace('-', '_')}-{version}-*.whl"))
    return hits[0] if hits else None


def download_wheel(engine: str, version: str, dest: str | Path) -> Path:
    """``pip download --no-deps --only-binary=:all:`` the manylinux x86_64 CPython 3.12 wheel into ``dest``.
    Raises ValueError: an unknown engine version; RuntimeError: pip failed."""
    engine_version(engine, version)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    have = find_wheel(dest, engine, version)
    if have:
        return have
    plats = ["manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", *[x for p in plats for x in ("--platform", p)], "-d", str(dest),
           f"{engine}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    got = find_wheel(dest, engine, version)
    if proc.returncode or got is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"pip download {engine}=={version} failed: {tail[0]}")
    return got


def format_report(rep: dict) -> str:
    """The report as Markdown: one table row per fact (status, preset, fact, file:line recorded / found)."""
    c = rep["counts"]
    out = [f"# Engine facts checked against {rep['wheel']}", "",
           f"Engine {rep['engine']} {rep['version']} (release {rep['release_date']}, wheel built "
           f"{rep['wheel_built']}). Read with Python `ast` from the wheel's sources by `mla-lab engines "
           f"--check-wheel` (mla_lab/engines/wheel_check.py); nothing installed or imported. "
           + ", ".join(f"{c[s]} {s}" for s in STATUSES) + ".", "",
           "| status | preset | fact | recorded | found | code |", "|---|---|---|---|---|---|"]
    for f in rep["facts"]:
        found = ", ".join(f["found"]) or "-"
        note = f" ({f['detail']}; instead: {'; '.join(f['instead'])})" if f["status"] in ("fails", "missing") else ""
        code = f["code"].replace("|", "\\|").replace("\n", " ")
        out.append(f"| {f['status']} | {f['preset']} | {f['key']}: {f['text']}{note} | {f['path']}:{f['line']} "
                   f"| {found} | `{code}` |")
    claims = rep.get("lab_claims", [])
    if claims:
        gone = [f for f in claims if not f["still_holds"]]
        out += ["", f"## What the lab's PR-era presets relied on: {len(gone)} of {len(claims)} no longer hold", "",
                "| still holds | fact | file | found / instead | code |", "|---|---|---|---|---|"]
        for f in claims:
            where = ", ".join(f["found"]) or ("; ".join(f["instead"]) or f["detail"])
            code = f["code"].replace("|", "\\|")
            out.append(f"| {'yes' if f['still_holds'] else 'NO'} | {f['key']}: {f['text']} | {f['path']} | "
                       f"{where.replace('|', '/')} | `{code}` |")
    return "\n".join(out) + "\n"


def write_report(rep: dict, folder: str | Path, overwrite: bool = False) -> tuple[Path, Path]:
    """Write ``wheel_facts_<engine>-<version>.json`` / ``.md``. Raises ValueError: exists without ``overwrite``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"wheel_facts_{rep['engine']}-{rep['version']}"
    paths = folder / f"{stem}.json", folder / f"{stem}.md"
    for p in paths:
        if p.exists() and not overwrite:
            raise ValueError(f"{p} exists; allowed: pass --overwrite to replace it")
    paths[0].write_text(json.dumps(rep, indent=1) + "\n")
    paths[1].write_text(format_report(rep))
    return paths
