"""Generated blocks of the pages: the text between a begin and an end marker, rewritten by the ``--update-*``
commands of :mod:`.answer`, :mod:`.engine_serving`, :mod:`.module_map`, :mod:`.noise_figures`, :mod:`.packed_figures`
and :mod:`.reproduce` (one entry convention: :func:`block_main`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..paths import REPO_ROOT

__all__ = ["splice", "update_block", "block_main"]


def splice(text: str, begin: str, end: str, block: str, where: str = "the text", what: str = "") -> str:
    """``text`` with what lies between ``begin`` and ``end`` replaced by ``block`` (the markers stay). Raises
    ValueError: the markers are not both there, in order (names ``where`` and ``what``)."""
    if begin not in text or end not in text or text.index(begin) > text.index(end):
        raise ValueError(f"{where} has no {what + ' ' if what else ''}markers ({begin} ... {end}); nothing written")
    return text[:text.index(begin) + len(begin)] + block + text[text.index(end):]


def update_block(path: Path, begin: str, end: str, block: str, what: str = "") -> bool:
    """Rewrite ``path``'s block with ``"\\n" + block + "\\n"``; True when the file changed. Raises as :func:`splice`."""
    text = path.read_text()
    new = splice(text, begin, end, "\n" + block + "\n", str(path), what)
    if new != text:
        path.write_text(new)
    return new != text


def block_main(argv, module: str, path: Path, begin: str, end: str, render, what: str, flag: str = "--update-docs",
               write=None):
    """``python -m <module> [flag]``: print ``render()``; with ``flag``, rewrite ``path``'s block with it (or call
    ``write(block) -> changed``; exit 2 naming the file when its markers are missing, nothing written). Returns the
    exit code."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}")
    ap.add_argument(flag, action="store_true", help=f"rewrite the {what} block of {path.name}")
    a = ap.parse_args(argv)
    block = render()
    print(block)
    if getattr(a, flag[2:].replace("-", "_")):
        try:
            changed = write(block) if write else update_block(path, begin, end, block, what)
        except ValueError as e:
            ap.error(str(e))
        print(f"-> {path.relative_to(REPO_ROOT)}" + ("" if changed else " (unchanged)"))
    return 0
