"""The union builder's buffer layout and byte count (torch-free): shared by :mod:`mla_lab.kernels.union` and the
memory account. Bytes; indices int32; the membership mask uint8 for g <= 8, int32 for g = 16."""

from __future__ import annotations

__all__ = ["UNION_GROUP_SIZES", "SHARED_CAP_MULTIPLE", "REST_CAP_MULTIPLE", "union_caps", "union_field_bits",
           "union_scratch_words", "check_union_group", "union_buffer_bytes"]

#: Tokens per group the union builders accept: 64 / H (H 8, 16, 32), 1 (no packing), 16 (sm100 at 8 heads).
UNION_GROUP_SIZES = (1, 2, 4, 8, 16)
#: ``shared_idx``'s width is a multiple of 128: FlashMLA sm90's topk must be (``csrc/api/sparse_fwd.h``, B_TOPK).
SHARED_CAP_MULTIPLE = 128
#: ``rest_idx``'s width is a multiple of 64 (the masked kernel's key block).
REST_CAP_MULTIPLE = 64


def union_caps(topk: int, g: int) -> tuple[int, int]:
    """``(cap_s, cap_r)``: widths of ``shared_idx`` (multiple of 128, >= topk, >= 128) and ``rest_idx`` (multiple of
    64, >= g * topk, >= 64)."""
    return (max(SHARED_CAP_MULTIPLE, -(-topk // SHARED_CAP_MULTIPLE) * SHARED_CAP_MULTIPLE),
            max(REST_CAP_MULTIPLE, -(-(g * topk) // REST_CAP_MULTIPLE) * REST_CAP_MULTIPLE))


def union_field_bits(g: int) -> int:
    """Bits per key in the builder's scratch: ``g`` membership bits + 1 claim bit, rounded up to 8, 16 or 32."""
    return 8 if g <= 7 else 16 if g <= 15 else 32


def union_scratch_words(s_kv: int, g: int) -> int:
    """int32 words per program of the builder's scratch: ``ceil(s_kv / keys per word)``."""
    return -(-s_kv // (32 // union_field_bits(g)))


def check_union_group(g) -> None:
    """Raises ValueError (one line) unless ``g`` is one of :data:`UNION_GROUP_SIZES`."""
    if isinstance(g, bool) or not isinstance(g, int) or g not in UNION_GROUP_SIZES:
        raise ValueError(f"g must be one of {list(UNION_GROUP_SIZES)}; got g={g!r}")


def union_buffer_bytes(T: int, topk: int, g: int, s_kv: int, num_programs: int) -> dict:
    """``{outputs, scratch, total}`` bytes of :func:`mla_lab.kernels.union.build_union`'s buffers: ``shared_idx``
    ``[G, cap_s]``, ``rest_idx`` / ``rest_mask`` ``[G, cap_r]``, three ``[G]`` lengths; scratch ``num_programs x
    words x 4``. Raises ValueError: a negative T or topk, a bad g, s_kv or num_programs < 1."""
    for name, v, lo in (("T", T, 0), ("topk", topk, 0), ("s_kv", s_kv, 1), ("num_programs", num_programs, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}; got {name}={v!r}")
    check_union_group(g)
    G = -(-T // g)
    cap_s, cap_r = union_caps(topk, g)
    mb = 1 if g <= 8 else 4
    outputs = G * (cap_s * 4 + cap_r * (4 + mb) + 3 * 4)
    scratch = num_programs * union_scratch_words(s_kv, g) * 4
    return {"outputs": outputs, "scratch": scratch, "total": outputs + scratch}
