"""The two-sample Kolmogorov-Smirnov test (two-sided), for the prefix-cache timing audit.

Exact p-value (Hodges' lattice-path count, in integers) when n*m <= EXACT_MAX_PRODUCT, as scipy's
`ks_2samp(method="auto")` does; else the asymptotic Kolmogorov distribution."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

EXACT_MAX_PRODUCT = 10_000
_SERIES_TERMS = 100


@dataclass(frozen=True)
class KsResult:
    statistic: float  # the largest gap between the two empirical distribution functions
    p_value: float
    exact: bool


def ks_2samp(x: Sequence[float], y: Sequence[float]) -> KsResult:
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        raise ValueError("the Kolmogorov-Smirnov test needs two non-empty samples")
    # D * n * m as an integer: the gap |i/n - j/m| after every distinct value, with ties taken together.
    xs, ys = sorted(x), sorted(y)
    i = j = gap = 0
    while i < n and j < m:
        value = min(xs[i], ys[j])
        while i < n and xs[i] == value:
            i += 1
        while j < m and ys[j] == value:
            j += 1
        gap = max(gap, abs(i * m - j * n))
    statistic = gap / (n * m)
    if n * m <= EXACT_MAX_PRODUCT:
        return KsResult(statistic, _exact_p(n, m, gap), exact=True)
    return KsResult(statistic, _asymptotic_p(statistic * math.sqrt(n * m / (n + m))), exact=False)


def _exact_p(n: int, m: int, gap: int) -> float:
    """P(D >= d) under the null: 1 - (monotone lattice paths staying strictly inside the gap) / C(n+m, n)."""
    inside = [1 if abs(j * n) < gap else 0 for j in range(m + 1)]  # row i = 0
    for j in range(1, m + 1):
        inside[j] = inside[j - 1] if inside[j] else 0
    for i in range(1, n + 1):
        inside[0] = inside[0] if abs(i * m) < gap else 0
        for j in range(1, m + 1):
            inside[j] = inside[j] + inside[j - 1] if abs(i * m - j * n) < gap else 0
    total = math.comb(n + m, n)
    return (total - inside[m]) / total


def _asymptotic_p(lam: float) -> float:
    """The Kolmogorov distribution's tail: 2 * sum (-1)^(k-1) exp(-2 k^2 lam^2)."""
    if lam < 0.2:
        return 1.0
    tail = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, _SERIES_TERMS))
    return min(1.0, max(0.0, tail))
