"""The Jupyter kernel the lab's notebooks run on: ``mla-lab``, installed into this interpreter's prefix.
A fixed name keeps papermill off other environments' ``python3`` kernelspecs; ``make venv`` installs it."""

from __future__ import annotations

import sys

KERNEL_NAME = "mla-lab"


def ensure_kernel() -> str:
    """Install (or repair) the ``mla-lab`` kernelspec so that it runs ``sys.executable``; returns the name."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
        if spec.argv and spec.argv[0] == sys.executable:
            return KERNEL_NAME
    except NoSuchKernel:
        pass
    from ipykernel.kernelspec import install

    install(kernel_name=KERNEL_NAME, display_name="Python (mla_lab)", prefix=sys.prefix)
    return KERNEL_NAME


if __name__ == "__main__":
    print(f"kernel {ensure_kernel()} -> {sys.executable}")
