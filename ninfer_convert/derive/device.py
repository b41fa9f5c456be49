"""The device a run encodes grouped tensors on (``--device``), shared by convert and verify."""

from __future__ import annotations

import os

from ..errors import UsageError

__all__ = ["resolve_device"]


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when torch sees a GPU, else 'cpu'; 'cuda' without a GPU is an error."""
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"unknown device {device!r}", hint="use auto, cpu or cuda")
    if device == "cpu":
        return "cpu"
    if device == "auto" and not os.path.exists("/dev/nvidiactl"):
        # No NVIDIA driver node: skip importing torch (seconds) just to learn there is no GPU.
        return "cpu"
    import torch

    available = bool(torch.cuda.is_available())
    if device == "cuda" and not available:
        raise UsageError(
            "--device cuda was requested but torch sees no CUDA device",
            hint="use --device cpu or auto",
        )
    return "cuda" if available else "cpu"
