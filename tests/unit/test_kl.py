"""KL estimators (reasonrl.algo.kl) against Schulman's k1 / k2 / k3 by hand, their bias and sign, and
the adaptive KL coefficient's update by hand."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import F64, close, t

from reasonrl.algo.kl import KL_ESTIMATORS, AdaptiveKLCoef, k1, k2, k3


def test_kl_estimators_hand_values():
    # d = ref - logp.
    # logp -1, ref -2: d = -1 -> k1 = -d = 1, k2 = d^2/2 = 0.5, k3 = e^-1 + 1 - 1 = 0.367879
    # logp -2, ref -1: d = +1 -> k1 = -1,      k2 = 0.5,        k3 = e^1 - 1 - 1 = 0.718282
    logp, ref = t([[-1.0, -2.0]]), t([[-2.0, -1.0]])
    torch.testing.assert_close(k1(logp, ref), t([[1.0, -1.0]]))
    torch.testing.assert_close(k2(logp, ref), t([[0.5, 0.5]]))
    torch.testing.assert_close(k3(logp, ref), t([[0.36787944, 0.71828183]]))


def test_kl_estimators_are_zero_when_equal():
    x = t([[-0.1, -3.0, -7.5]])
    for fn in (k1, k2, k3):
        assert torch.equal(fn(x, x.clone()), torch.zeros_like(x))


def test_k3_is_nonnegative_everywhere():
    grid = torch.linspace(-20, 0, 81, dtype=F64)
    logp, ref = torch.meshgrid(grid, grid, indexing="ij")
    assert (k3(logp, ref) >= 0).all()
    assert (k2(logp, ref) >= 0).all()


def test_k1_and_k3_are_unbiased_estimators_of_kl():
    # p = [0.5, 0.5], ref = [0.25, 0.75]:
    # KL(p || ref) = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5*0.693147 - 0.5*0.405465 = 0.143841
    # E_p[k3] = E_p[ref/p] - E_p[d] - 1 = 1 + KL - 1 = KL; E_p[k1] = E_p[log p - log ref] = KL.
    p, ref = t([0.5, 0.5]), t([0.25, 0.75])
    kl = 0.5 * math.log(2.0) + 0.5 * math.log(2.0 / 3.0)
    assert kl == pytest.approx(0.143841, abs=1e-6)
    for fn in (k1, k3):
        assert (p * fn(p.log(), ref.log())).sum().item() == pytest.approx(kl)


def test_adaptive_kl_coefficient_by_hand():
    # target 0.5, horizon 100, 10 samples: KL 1.0 -> e = clip(1, -0.2, 0.2) = 0.2 -> 0.1 (1 + 0.02) = 0.102;
    # then KL 0.45 -> e = -0.1 -> 0.102 (1 - 0.01) = 0.10098.
    coef = AdaptiveKLCoef(0.1, target=0.5, horizon=100)
    assert coef.update(1.0, samples=10) == pytest.approx(0.102)
    assert coef.update(0.45, samples=10) == pytest.approx(0.10098)
    restored = AdaptiveKLCoef(0.1, target=0.5, horizon=100)
    restored.load_state_dict(coef.state_dict())
    assert restored.value == coef.value
    assert AdaptiveKLCoef(0.1).update(5.0, samples=10) == 0.1  # target 0: fixed


def test_the_registry_names_the_three_estimators_and_each_name_gives_its_equation():
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}
    # Looked up by name, logp -1 and ref -2 (d = ref - logp = -1, see above): -d = 1, d^2 / 2 = 0.5,
    # e^d - d - 1 = 0.367879.
    logp, ref = t([[-1.0]]), t([[-2.0]])
    close(KL_ESTIMATORS["k1"](logp, ref), [[1.0]])
    close(KL_ESTIMATORS["k2"](logp, ref), [[0.5]])
    close(KL_ESTIMATORS["k3"](logp, ref), [[0.36787944]])
