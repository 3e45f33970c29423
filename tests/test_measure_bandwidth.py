"""mla_lab.measure.bandwidth: the probes write exactly what they say (zeros or the source into the first H heads),
leave every other head untouched, and refuse bad input in one line. The kernel runs under Triton's interpreter in a
subprocess (``TRITON_INTERPRET`` is read when triton is imported)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mla_lab.kernels.triton_concat import triton_available

pytestmark = pytest.mark.skipif(not triton_available()[0], reason="triton not importable here (Linux-only wheels)")

_SCRIPT = r"""
import torch
from mla_lab.measure.bandwidth import gapped_write
torch.manual_seed(0)
for T, H, Hp in [(1, 1, 1), (3, 8, 64), (5, 3, 8), (4, 16, 16)]:
    src = torch.randn(T, H, 576).to(torch.bfloat16)
    for fill in (True, False):
        out = torch.full((T, Hp, 576), float("nan"), dtype=torch.bfloat16)
        r = gapped_write(out, H) if fill else gapped_write(out, H, src=src)
        assert r is out
        want = torch.zeros_like(src) if fill else src
        assert torch.equal(out[:, :H].view(torch.int16), want.view(torch.int16)), (T, H, Hp, fill)
        assert out[:, H:].isnan().all(), (T, H, Hp, fill)
print("probes ok")
"""


def _run(code):
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_probes_write_the_first_heads_only():
    p = _run(_SCRIPT)
    assert p.returncode == 0 and "probes ok" in p.stdout, p.stderr[-2000:]


@pytest.mark.parametrize("out_shape,H,src_shape,fragment", [
    ((2, 8, 512), 1, None, "out must be [T, H', 576]"),
    ((2, 8, 576), 9, None, "H must be in 1..8 (out's heads); got H=9"),
    ((2, 8, 576), 0, None, "H must be in 1..8 (out's heads); got H=0"),
    ((2, 8, 576), 4, (2, 3, 576), "src must be [T, H, 576] = (2, 4, 576)"),
    ((2, 8, 576), 2.0, None, "H must be an int; got H=2.0"),
    ((2, 8, 576), True, None, "H must be an int; got H=True"),
    ("float32", 1, None, "out.dtype must be float16 or bfloat16; got torch.float32"),
])
def test_probes_refuse_bad_input(out_shape, H, src_shape, fragment):
    import torch

    from mla_lab.measure.bandwidth import gapped_write

    out = (torch.empty(2, 8, 576) if out_shape == "float32" else torch.empty(out_shape, dtype=torch.bfloat16))
    src = None if src_shape is None else torch.empty(src_shape, dtype=torch.bfloat16)
    with pytest.raises(ValueError) as e:
        gapped_write(out, H, src=src)
    assert fragment in str(e.value) and "\n" not in str(e.value)
