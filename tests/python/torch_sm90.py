"""The skip shared by the PyTorch op tests: call require_torch_sm90() at the top of a test module.

It returns torch, or skips the whole module without torch (importorskip), without a CUDA device or
on a GPU other than sm_90 (flamia's kernels are built for sm_90a only), so the CPU CTest run
(pytest tests/python) is unaffected."""

import pytest


def require_torch_sm90():
    torch = pytest.importorskip("torch", reason="flamia's PyTorch op tests need torch")
    if not torch.cuda.is_available():
        pytest.skip("flamia's PyTorch op tests need a CUDA device", allow_module_level=True)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"flamia's kernels are built for sm_90a only; this GPU is sm_"
                    f"{''.join(map(str, torch.cuda.get_device_capability()))}", allow_module_level=True)
    return torch
