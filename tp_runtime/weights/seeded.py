"""Counter-based standard-normal draws: value i of stream `key` is a pure function of (key, i).

Unlike a stateful generator, the same (key, index) gives the same number on every device, rank,
tp and launcher, and a shard can be drawn without drawing the rest. A 32-bit integer hash
(lowbias32) of the counter gives two uniforms, Box-Muller turns them into one normal.
"""

from __future__ import annotations

import math
import zlib

import torch

_M32 = 0xFFFFFFFF


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors: products wrap, the low 32 bits are kept."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def normal(key: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """N(0, 1) fp32 for every pair of broadcast int64 key and index (index < 2^31)."""
    return normal_of_counters(key, *counters(index))


def counters(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The hashed counters of draw `index`'s two uniforms: mix32(2 i), mix32(2 i + 1) (key-independent,
    so a caller drawing the same indices under many keys computes them once)."""
    return mix32(2 * index), mix32(2 * index + 1)


def normal_of_counters(key: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor) -> torch.Tensor:
    """`normal(key, index)` from index's `counters`: two uniforms in (0, 1), then Box-Muller."""
    u1 = (mix32(key ^ c1).double() + 0.5) / 2**32
    u2 = (mix32(key ^ c2).double() + 0.5) / 2**32
    return (torch.sqrt(-2 * torch.log(u1)) * torch.cos(2 * math.pi * u2)).float()


def stream_key(seed: int, name: str) -> int:
    """The key of a named stream (a weight tensor) under a seed."""
    return int(mix32(torch.tensor([seed ^ zlib.crc32(name.encode())], dtype=torch.long))[0])


def named_normal(seed: int, name: str, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The tensor `name` of a seeded model: element i (row-major) = normal(key(seed, name), i)."""
    n = math.prod(shape)
    if n >= 2**31:
        raise ValueError(f"{name}: {n} elements exceed the 2^31 counter range")
    key = torch.tensor(stream_key(seed, name), dtype=torch.long, device=device)
    return normal(key, torch.arange(n, dtype=torch.long, device=device)).view(shape)


def token_rows(seed: int, request: torch.Tensor, pos: torch.Tensor, hidden: int) -> torch.Tensor:
    """Rows [T, hidden] that depend only on (seed, request, position, channel)."""
    channels = torch.arange(hidden, device=pos.device, dtype=torch.long)
    return normal(token_keys(seed, request, pos)[:, None], channels[None])  # [T, 1] keys x [1, hidden]


def token_keys(seed: int, request: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Each token's stream key [T] int64 from int64 request ids and positions [T]: integer ops only, so
    the same bits on any device (the run makes them on the host and sends T keys, not T x hidden rows)."""
    return mix32(mix32(mix32(torch.full_like(pos, seed)) ^ request) ^ pos)
