"""The tiny deterministic model: one attention head over the paged cache that copies.

Each token's K and V are its row of a fixed random codebook. Attention scores carry an
ALiBi-style distance bias, -(i - j)^2 * ALIBI, that is not stored in the cache, plus a small
content term q.k: the bias dominates, so decode step i attends to cache position i and emits the
token whose V sits there (a copy head). The model therefore echoes what the cache holds: its own
prompt when the cache is right, and stale text from earlier requests when it is not, exactly the
way the incident surfaced. The LM head is nearest-codebook (logits = 2 o.E - |E|^2).
"""

from __future__ import annotations

import torch

from kvpreflight._internal.builtin_engine.config import KV_DIM
from kvpreflight._internal.builtin_engine.tokenizer import VOCAB_SIZE

ALIBI = 30.0  # neighbour weight exp(-30): the head reads one position
QUERY_SCALE = 1e-3  # the content term: real, but too small to override position
WINDOW = 4  # input logprobs: weights beyond +-4 positions underflow to 0 anyway


class CopyModel:
    def __init__(self, device: str) -> None:
        gen = torch.Generator().manual_seed(20260827)
        self.device = device
        self.codebook = torch.randn(VOCAB_SIZE, KV_DIM, generator=gen).to(device)
        self.code_norm = (self.codebook * self.codebook).sum(-1)
        self.query = torch.full((KV_DIM,), QUERY_SCALE, device=device)

    @property
    def weight_bytes(self) -> int:
        return self.codebook.numel() * self.codebook.element_size()

    def kv_for(self, token_ids: list[int]) -> torch.Tensor:
        """[n, 2, dim]: K and V for each token; linear in the prompt length."""
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        rows = self.codebook[ids]
        return torch.stack((rows, rows), dim=1)

    def tokens_in(self, cache: torch.Tensor) -> torch.Tensor:
        """[n]: the token whose KV each of the cache's slots [n, 2, dim] holds (the nearest code)."""
        return torch.argmax(self._logits(cache[:, 1, :]), dim=1)

    def _logits(self, out: torch.Tensor) -> torch.Tensor:
        return 2.0 * out @ self.codebook.T - self.code_norm

    def step(self, cache: torch.Tensor, position: int) -> tuple[int, float]:
        """One decode step at `position` over the gathered cache [L, 2, dim]: (token, logprob)."""
        length = cache.shape[0]
        keys, values = cache[:, 0, :], cache[:, 1, :]
        dist = torch.arange(length, dtype=torch.float64, device=cache.device) - position
        scores = (keys @ self.query).double() - ALIBI * dist * dist
        weights = torch.softmax(scores, dim=0).float()
        out = weights @ values
        logprobs = torch.log_softmax(self._logits(out), dim=-1)
        token = int(torch.argmax(logprobs))
        return token, float(logprobs[token])

    def position_logprobs(self, cache: torch.Tensor, token_ids: list[int]) -> list[float]:
        """Logprob the head gives token_ids[t] when reading position t (banded attention)."""
        length = cache.shape[0]
        keys, values = cache[:, 0, :], cache[:, 1, :]
        pos = torch.arange(length, device=cache.device)
        offsets = torch.arange(-WINDOW, WINDOW + 1, device=cache.device)
        idx = pos[:, None] + offsets[None, :]
        valid = (idx >= 0) & (idx < length)
        idx = idx.clamp(0, length - 1)
        scores = (keys[idx] @ self.query).double() - ALIBI * (offsets.double() ** 2)[None, :]
        scores = scores.masked_fill(~valid, float("-inf"))
        weights = torch.softmax(scores, dim=1).float()
        out = (weights[:, :, None] * values[idx]).sum(1)
        logprobs = torch.log_softmax(self._logits(out), dim=-1)
        ids = torch.tensor(token_ids, dtype=torch.long, device=cache.device)
        return logprobs.gather(1, ids[:, None]).squeeze(1).tolist()
