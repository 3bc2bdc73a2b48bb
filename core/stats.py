"""Comparisons that account for both sources of noise: training seeds and evaluation episodes.
A success rate is a draw from two lotteries (training seed, initial states). ``bootstrap_rate`` resamples
seeds, then each drawn seed's episodes, so the interval widens when seeds disagree; ``bootstrap_difference``
does so for two methods independently. With one seed the interval reflects episodes only.
``wilson_interval`` is one evaluation's interval (one seed, binomial episodes). Every statistic of the
package lives here: the evaluator's summary and the studies' tables import it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z_95 = 1.96  # the standard normal's two-sided 95% quantile
N_BOOT = 10000  # bootstrap draws per interval and p-value
ALPHA = 0.05  # the 95% intervals' level, and the family-wise level of the Holm correction
# a difference of success rates whose whole 95% interval lies within +-5 points reads "equivalent": smaller
# than a practitioner would choose an encoder by (and about the resolution of 3 seeds x 50 episodes)
EQUIVALENCE_MARGIN = 0.05
# two policies that both fail are no evidence that their encoders are equivalent: "equivalent" needs both success
# rates' 95% intervals wholly above this floor, and both intervals wholly below it read "both fail"
EQUIVALENCE_FLOOR = 0.10
UNRESOLVED = "not resolved at this scale"
BOTH_FAIL = "both fail"


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (sane at 0/n and n/n, unlike Wald)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class Estimate:
    mean: float  # mean over seeds of each seed's success rate
    lo: float  # 95% percentile interval
    hi: float
    seeds: int
    episodes: int  # in all
    p: float | None = None  # a difference's two-sided bootstrap p-value: twice the share of draws on the far side of 0
    # a difference's p-value for equivalence within EQUIVALENCE_MARGIN: twice the larger share of draws beyond one
    # side of the margin (below 0.05 exactly when the 95% interval lies within it), for Holm's correction
    p_equivalent: float | None = None

    def fmt(self) -> str:
        return f"{100 * self.mean:.0f}% [{100 * self.lo:.0f}, {100 * self.hi:.0f}]"


def _draws(per_seed: list[np.ndarray], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot,) bootstrap replicates of the mean over seeds of the per-seed success rate."""
    outcomes = [np.asarray(o, dtype=float) for o in per_seed]
    if not outcomes or any(len(o) == 0 for o in outcomes):
        raise ValueError("every seed needs at least one evaluated episode")
    k = len(outcomes)
    seeds = rng.integers(0, k, size=(n_boot, k))  # which seeds each replicate draws
    rates = np.empty((n_boot, k))
    for j, o in enumerate(outcomes):  # resample each seed's episodes once per replicate
        rates[:, j] = o[rng.integers(0, len(o), size=(n_boot, len(o)))].mean(axis=1)
    return np.take_along_axis(rates, seeds, axis=1).mean(axis=1)


def bootstrap_rate(per_seed: list[np.ndarray], n_boot: int = N_BOOT, seed: int = 0) -> Estimate:
    """per_seed[i]: 0/1 outcomes of the episodes of training seed i."""
    rng = np.random.default_rng(seed)
    draws = _draws(per_seed, n_boot, rng)
    lo, hi = np.percentile(draws, [2.5, 97.5])
    mean = float(np.mean([np.mean(o) for o in per_seed]))
    return Estimate(mean, float(lo), float(hi), len(per_seed), int(sum(len(o) for o in per_seed)))


def bootstrap_difference(a: list[np.ndarray], b: list[np.ndarray], n_boot: int = N_BOOT, seed: int = 0) -> Estimate:
    """Mean rate of method ``a`` minus that of ``b``, with a 95% interval (both resampled independently)."""
    rng = np.random.default_rng(seed)
    draws = _draws(a, n_boot, rng) - _draws(b, n_boot, rng)
    lo, hi = np.percentile(draws, [2.5, 97.5])
    mean = float(np.mean([np.mean(o) for o in a]) - np.mean([np.mean(o) for o in b]))
    p = min(1.0, 2 * float(min(np.mean(draws <= 0), np.mean(draws >= 0))))  # a draw of exactly 0 counts on both sides
    p_eq = min(1.0, 2 * float(max(np.mean(draws <= -EQUIVALENCE_MARGIN), np.mean(draws >= EQUIVALENCE_MARGIN))))
    return Estimate(mean, float(lo), float(hi), min(len(a), len(b)), int(sum(map(len, a)) + sum(map(len, b))), p, p_eq)


def paired_difference(a, b, n_boot: int = N_BOOT, seed: int = 0) -> Estimate:
    """Mean of ``a - b`` over pairs (episode i of both runs starts from the same initial state), with a
    95% interval from a bootstrap over the pairs: the pairing removes the initial states' own variance."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if d.size == 0:
        raise ValueError("a paired difference needs at least one pair")
    draws = d[np.random.default_rng(seed).integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return Estimate(float(d.mean()), float(lo), float(hi), 1, int(d.size))


def equivalent_text(margin: float = EQUIVALENCE_MARGIN) -> str:
    return f"equivalent within ±{100 * margin:.0f} points"


def verdict(diff: Estimate, claim_sign: int = 1, margin: float | None = None,
            rates: tuple[Estimate, Estimate] | None = None, floor: float = EQUIVALENCE_FLOOR) -> str:
    """'supported' / 'contradicted': the interval excludes 0 on the claimed / the other side. Else, given both
    sides' ``rates``: 'both fail' when both intervals lie below ``floor``; with a ``margin``, 'equivalent within
    ±N points' when the whole interval lies within it and (given ``rates``) both intervals lie above ``floor``.
    Else 'not resolved at this scale'."""
    if claim_sign * diff.lo > 0 or claim_sign * diff.hi < 0:
        return "supported" if claim_sign * diff.mean > 0 else "contradicted"
    if rates and all(r.hi < floor for r in rates):
        return BOTH_FAIL
    if margin is not None and -margin <= diff.lo and diff.hi <= margin and (not rates or all(r.lo > floor for r in rates)):
        return equivalent_text(margin)
    return UNRESOLVED


def holm(p_values: list[float], alpha: float = ALPHA) -> list[bool]:
    """Which of a family's hypotheses Holm's step-down procedure rejects at family-wise error ``alpha``:
    the k-th smallest p-value is held to alpha / (m - k + 1), and the first that fails stops the rest."""
    rejected = [False] * len(p_values)
    for k, i in enumerate(sorted(range(len(p_values)), key=p_values.__getitem__)):
        if p_values[i] > alpha / (len(p_values) - k):
            break
        rejected[i] = True
    return rejected
