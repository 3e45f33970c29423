"""Generated blocks of the pages: the text between a begin and an end marker, rewritten by the ``--update-*``
commands of :mod:`.answer`, :mod:`.engine_serving`, :mod:`.module_map`, :mod:`.noise`, :mod:`.packed_kernels` and
:mod:`.reproduce`."""

from __future__ import annotations

from pathlib import Path

__all__ = ["splice", "update_block"]


def splice(text: str, begin: str, end: str, block: str, where: str = "the text", what: str = "") -> str:
    """``text`` with what lies between ``begin`` and ``end`` replaced by ``block`` (the markers stay).

    Raises:
        ValueError: the markers are not both there, in order (names ``where`` and ``what`` block; nothing written).
    """
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
