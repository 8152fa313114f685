"""The two-sample Kolmogorov-Smirnov test of the prefix-cache timing audit, against values
computed offline with scipy 1.17.1 (`scipy.stats.ks_2samp`, method auto = exact at these sizes;
`scipy.special.kolmogorov` for the asymptotic tail). scipy is not a dependency."""

from __future__ import annotations

import pytest

from kvpreflight._internal.checks.kstest import ks_2samp


@pytest.mark.parametrize(("x", "y", "statistic", "p_value"), [
    (list(range(1, 11)), list(range(11, 21)), 1.0, 1.0825088224469026e-05),  # 2 / C(20, 10)
    ([0.1, 0.5, 0.3, 0.9], [0.2, 0.6, 0.8, 0.4, 0.7], 0.35, 0.873015873015873),
    (list(range(30)), [v + 15.5 for v in range(30)], 0.5333333333333333, 0.0002933405491362055),
    (list(range(30)), [v + 30 for v in range(30)], 1.0, 1.6911233892144742e-17),
    ([1, 1, 2, 2, 3], [1, 2, 2, 3, 3, 3], 0.3, 0.8961038961038962),  # ties are taken together
    ([1.0] * 5, [1.0] * 5, 0.0, 1.0),
])
def test_exact_p_values_match_scipy(x: list[float], y: list[float], statistic: float, p_value: float) -> None:
    result = ks_2samp(x, y)
    assert result.exact
    assert result.statistic == pytest.approx(statistic, abs=1e-12)
    assert result.p_value == pytest.approx(p_value, rel=1e-9)
    assert ks_2samp(y, x).p_value == pytest.approx(p_value, rel=1e-9)  # symmetric


def test_large_samples_use_the_asymptotic_kolmogorov_tail() -> None:
    # n*m = 22,500 > 10,000: D = 20/150, lambda = D*sqrt(75); scipy.special.kolmogorov(lambda)
    result = ks_2samp(list(range(150)), [v + 20 for v in range(150)])
    assert not result.exact
    assert result.statistic == pytest.approx(20 / 150)
    assert result.p_value == pytest.approx(0.13892028431881934, rel=1e-9)


def test_an_empty_sample_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        ks_2samp([], [1.0])
