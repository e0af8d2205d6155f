"""Gradient compression for DDP: bucket-wise quantisation in the spirit of CGX.

A gradient bucket is cut into chunks of ``bucket_size`` values; each chunk is
mapped onto ``2**bits`` evenly spaced levels between its own minimum and
maximum (per-chunk scaling), with unbiased stochastic rounding, so the
dequantised value is within one level (``scale``) of the original and equal to
it in expectation. 4-bit codes are packed two to a byte. Workers exchange the
codes and the per-chunk (min, scale) pairs, dequantise everyone's part and
average. This follows CGX (Markov et al., "CGX: Adaptive System Support for
Communication-Efficient Deep Learning") but exchanges codes with an
all-gather rather than CGX's requantising reduce-scatter, which keeps it exact
up to the quantisation error at the cost of traffic growing with the worker
count.

Example:
    >>> import torch
    >>> x = torch.linspace(-1, 1, 10)
    >>> q = quantize(x, bits=8, bucket_size=4)
    >>> bool((dequantize(q) - x).abs().max() <= q.scales.max())
    True
"""

# No "from __future__ import annotations": DDP checks the hook's annotations at runtime.

from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["QuantHookState", "Quantized", "dequantize", "quantize", "quantized_allreduce_hook"]


@dataclass
class Quantized:
    """Codes (uint8, 4-bit ones packed in pairs) with per-chunk minimum and scale."""

    codes: torch.Tensor
    mins: torch.Tensor
    scales: torch.Tensor
    numel: int
    bits: int
    bucket_size: int

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + 4 * (self.mins.numel() + self.scales.numel())


def _check(bits: int, bucket_size: int) -> None:
    if bits not in (2, 4, 8):
        raise ValueError(f"bits is {bits}; use 8, 4 or 2")
    if bucket_size < 1:
        raise ValueError(f"bucket_size is {bucket_size}; it must be at least 1")


def quantize(
    x: torch.Tensor,
    bits: int = 8,
    bucket_size: int = 512,
    generator: torch.Generator | None = None,
    stochastic: bool = True,
) -> Quantized:
    """Quantise a tensor chunk-wise to ``bits`` bits (see the module docstring)."""
    _check(bits, bucket_size)
    flat = x.detach().reshape(-1).float()
    n = flat.numel()
    nchunks = max(1, -(-n // bucket_size))
    padded = torch.zeros(nchunks * bucket_size, dtype=torch.float32, device=flat.device)
    padded[:n] = flat
    if (
        n < padded.numel()
    ):  # pad with the last chunk's own values so padding does not widen its range
        padded[n:] = flat[-1] if n else 0.0
    chunks = padded.view(nchunks, bucket_size)
    lo = chunks.min(dim=1).values
    hi = chunks.max(dim=1).values
    levels = (1 << bits) - 1
    scale = (hi - lo) / levels
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    pos = (chunks - lo[:, None]) / safe[:, None]
    if stochastic:
        noise = torch.rand(pos.shape, generator=generator, device=pos.device, dtype=pos.dtype)
        q = torch.floor(pos + noise)
    else:
        q = torch.round(pos)
    q = q.clamp_(0, levels).to(torch.uint8).reshape(-1)
    if bits < 8:
        q = _pack(q, bits)
    return Quantized(q.reshape(-1), lo, scale, n, bits, bucket_size)


def _pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    per = 8 // bits
    pad = (-q.numel()) % per
    if pad:
        q = torch.cat([q, q.new_zeros(pad)])
    q = q.view(-1, per)
    out = torch.zeros(q.shape[0], dtype=torch.uint8, device=q.device)
    for i in range(per):
        out |= q[:, i] << (bits * i)
    return out


def _unpack(codes: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    per = 8 // bits
    mask = (1 << bits) - 1
    parts = [(codes >> (bits * i)) & mask for i in range(per)]
    return torch.stack(parts, dim=1).reshape(-1)[:count]


def dequantize(q: Quantized) -> torch.Tensor:
    """The float32 values a :class:`Quantized` stands for (flat, ``numel`` long)."""
    nchunks = q.mins.numel()
    total = nchunks * q.bucket_size
    codes = q.codes if q.bits == 8 else _unpack(q.codes, q.bits, total)
    vals = codes.float().view(nchunks, q.bucket_size) * q.scales[:, None] + q.mins[:, None]
    return vals.reshape(-1)[: q.numel]


@dataclass
class QuantHookState:
    """State of :func:`quantized_allreduce_hook`: bits, chunk size and the rounding generator."""

    bits: int
    bucket_size: int
    generator: torch.Generator | None = None
    process_group: dist.ProcessGroup | None = None
    bytes_sent: int = 0
    bytes_uncompressed: int = 0


def quantized_allreduce_hook(
    state: QuantHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average a gradient bucket exchanged as quantised codes.

    Register with ``ddp.register_comm_hook(QuantHookState(8, 512), quantized_allreduce_hook)``.
    """
    group = state.process_group
    world = dist.get_world_size(group)
    buf = bucket.buffer()
    q = quantize(buf, state.bits, state.bucket_size, state.generator)
    codes = [torch.empty_like(q.codes) for _ in range(world)]
    meta_local = torch.stack([q.mins, q.scales])
    metas = [torch.empty_like(meta_local) for _ in range(world)]
    dist.all_gather(codes, q.codes, group=group)
    dist.all_gather(metas, meta_local, group=group)
    total = torch.zeros(buf.numel(), dtype=torch.float32, device=buf.device)
    for c, m in zip(codes, metas, strict=True):
        total += dequantize(Quantized(c, m[0], m[1], q.numel, q.bits, q.bucket_size))
    total /= world
    state.bytes_sent += q.nbytes
    state.bytes_uncompressed += buf.numel() * buf.element_size()
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(total.to(buf.dtype).view_as(buf))
    return fut
