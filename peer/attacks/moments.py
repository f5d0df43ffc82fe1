"""Per-coordinate statistics of the few models an attack knows, bit for bit torch's own.

``torch.std(dim=0)`` of a float64 ``[n, D]`` tensor on the CPU runs Welford's update one
coordinate at a time (``ReduceOpsKernel.cpp``: ``WelfordOps`` through ``binary_kernel_reduce``):
for a dozen models of 7,850 values it takes about a millisecond, most of it loop overhead.
:func:`column_std` takes the very same steps, each over all ``D`` coordinates at once::

    delta = x_i - mean;  mean = mean + delta / (i + 1);  m2 = m2 + delta * (x_i - mean)
    std = sqrt(m2 / (n - correction))        # 0 as divisor when n <= correction

Every step is one correctly rounded IEEE operation on each coordinate, in the order torch
takes them, so the result is the same bits, about ten times faster. Whether this torch build
agrees (it would not if its kernel fused a multiply-add, or changed the algorithm) is checked
once per process on a probe; where it does not, torch's own ``std`` runs.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

__all__ = ["column_std"]


def column_std(models: torch.Tensor, correction: float = 0) -> torch.Tensor:
    """``models.std(dim=0, correction=correction)`` of ``models [n, D]``, the same bits."""
    if models.dtype != torch.float64 or models.device.type != "cpu" or models.dim() != 2 or models.shape[0] == 0 or not _agrees():
        return models.std(dim=0, correction=correction)
    return torch.from_numpy(_welford(models.detach().numpy(), float(correction)))


def _welford(x: np.ndarray, correction: float) -> np.ndarray:
    """The Welford steps of torch's CPU kernel over the rows of ``x`` (float64 [n, D])."""
    n = x.shape[0]
    mean = np.zeros(x.shape[1], dtype=np.float64)
    m2 = np.zeros_like(mean)
    delta, step = np.empty_like(mean), np.empty_like(mean)
    with np.errstate(all="ignore"):  # NaN and Inf propagate as in torch's kernel, silently
        for i in range(n):
            row = x[i]
            np.subtract(row, mean, out=delta)
            np.divide(delta, float(i + 1), out=step)
            mean += step
            np.subtract(row, mean, out=step)
            step *= delta
            m2 += step
        m2 /= n - correction if n > correction else 0.0
        return np.sqrt(m2, out=m2)


@functools.lru_cache(maxsize=1)
def _agrees() -> bool:
    """Whether :func:`_welford` gives torch's ``std`` bit for bit here, on a probe of models
    of several spreads and counts, both corrections."""
    generator = torch.Generator().manual_seed(20190525)
    for rows in (1, 2, 3, 8, 12):
        scale = torch.rand(1, 257, generator=generator, dtype=torch.float64) * 4
        probe = torch.randn(rows, 257, generator=generator, dtype=torch.float64) * scale + torch.randn(1, 257, generator=generator, dtype=torch.float64)
        for correction in (0, 1):
            if rows <= correction:
                continue
            if not torch.equal(torch.from_numpy(_welford(probe.numpy(), float(correction))), probe.std(dim=0, correction=correction)):
                return False
    return True
