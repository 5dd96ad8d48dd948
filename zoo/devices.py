"""The torch device a command runs on (``auto``, ``cpu``, ``cuda`` or ``cuda:N``), checked before
any work starts so a typo costs nothing and leaves nothing half-written."""

from __future__ import annotations

import torch


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when CUDA is available, else ``cpu``; anything else must exist here."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r} is not a device this tool runs on; use auto, cpu, cuda or cuda:N")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device} was asked for but CUDA is not available here")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def free_gpu_bytes(device) -> int:
    """Bytes a CUDA ``device`` can still give this process: what the driver reports free plus the
    idle blocks PyTorch's caching allocator holds (freed tensors it keeps for reuse)."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
