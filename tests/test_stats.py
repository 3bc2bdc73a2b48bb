"""The seed-then-episode bootstrap: real intervals on known cases."""
import numpy as np
import pytest

from studies.stats import bootstrap_difference, bootstrap_rate, verdict


def test_identical_seeds_give_the_binomial_width():
    seed = np.array([1] * 40 + [0] * 10)  # 80% of 50
    est = bootstrap_rate([seed])
    assert est.mean == pytest.approx(0.8)
    # one seed: the interval is the episodes' alone, about +-11 points for 50 episodes at 80%
    assert 0.67 < est.lo < 0.72 and 0.88 < est.hi < 0.92


def test_disagreeing_seeds_widen_the_interval():
    agree = [np.array([1] * 45 + [0] * 5)] * 3  # 90% each
    disagree = [np.ones(50), np.array([1] * 40 + [0] * 10), np.array([1] * 45 + [0] * 5)]  # 100, 80, 90
    a, d = bootstrap_rate(agree), bootstrap_rate(disagree)
    assert a.mean == pytest.approx(d.mean) == pytest.approx(0.9)
    assert (d.hi - d.lo) > 1.3 * (a.hi - a.lo)


def test_difference_interval_and_verdicts():
    better = [np.ones(50)] * 3
    worse = [np.array([1] * 25 + [0] * 25)] * 3
    diff = bootstrap_difference(better, worse)
    assert diff.mean == pytest.approx(0.5) and diff.lo > 0.3
    assert verdict(diff) == "supported" and verdict(diff, claim_sign=-1) == "contradicted"
    same = bootstrap_difference([np.array([1, 0] * 25)] * 3, [np.array([0, 1] * 25)] * 3)
    assert same.lo < 0 < same.hi and verdict(same) == "not resolved at this scale"
    with pytest.raises(ValueError, match="at least one evaluated episode"):
        bootstrap_rate([np.array([])])
