"""The device a run computes on (``engine.device``), checked against this machine, and what a
process on it has held there."""

from __future__ import annotations

import torch


def engine_device(name: str, *, resolve: bool = True) -> torch.device:
    """The device ``engine.device`` names, refused with one line when it is not here. Plain
    ``cuda`` is the current GPU, by its index; with ``resolve`` False, as named (reading the
    current GPU starts CUDA in this process, which a launcher that only checks does not want)."""
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"engine.device={name!r}: this machine has no CUDA device (torch.cuda.is_available() is False)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"engine.device={name!r}: only {torch.cuda.device_count()} CUDA device(s) here")
        if device.index is None and resolve:
            # The records then say which GPU ("cuda:0"), and memory is read off that one.
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def device_memory(device: torch.device | str) -> dict[str, float]:
    """On a CUDA device, the most this process's tensors held there and the most its caching
    allocator reserved (MiB; the process's CUDA context is in neither); elsewhere nothing."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_initialized():
        return {}
    return {
        "cuda_max_allocated_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1),
        "cuda_max_reserved_mib": round(torch.cuda.max_memory_reserved(device) / 2**20, 1),
    }
