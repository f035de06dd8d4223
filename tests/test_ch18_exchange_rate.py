"""Chapter 18: nu* prices reward minus KL; the optimum's reward falls one unit per unit of cost (finite differences)."""
import pytest
import torch

from rlkit.safety import constrained_optimum

D = torch.float64
# the chapter's bandit: safe and binding prompts; correct, harmless wrong, costly wrong (reference from its printout)
REF = torch.tensor([[0.61, 0.354, 0.036], [0.602, 0.245, 0.153]], dtype=D)
R = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], dtype=D)
C = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 1.0]], dtype=D)
W = torch.tensor([1 - 0.168, 0.168], dtype=D)


def _fd(budget, beta, field, e=1e-5):
    lo, hi = (getattr(constrained_optimum(REF, R, C, budget + s, beta, W), field) for s in (-e, e))
    return (hi - lo) / (2 * e)


@pytest.mark.parametrize("budget", [0.03, 0.06, 0.09, 0.15])
def test_reward_slope_is_one_and_nu_adds_the_kl_share(budget):
    beta = 0.1
    sol = constrained_optimum(REF, R, C, budget, beta, W)
    d_reward, d_kl, d_obj = (_fd(budget, beta, f) for f in ("reward", "kl", "objective"))
    assert abs(d_obj - sol.lam) < 1e-3                          # envelope theorem: nu* is the slope of F*
    assert abs(d_reward - (sol.lam + beta * d_kl)) < 1e-3       # F* = J_R - beta KL, differentiated
    assert abs(d_reward - 1.0) < 1e-3                           # one unit of reward per unit of cost
    # nu* differs from the reward slope by the KL's share: above 1 at tight budgets, below 1 near C_0
    assert (sol.lam - 1.0) * (0.12 - budget) > 0


def test_without_kl_the_price_is_one_at_every_binding_budget():
    for budget in (0.03, 0.06, 0.09, 0.15):
        assert abs(constrained_optimum(REF, R, C, budget, 0.003, W).lam - 1.0) < 0.01
    # and zero once the budget is slack
    free = constrained_optimum(REF, R, C, 1.0, 0.003, W)
    assert constrained_optimum(REF, R, C, free.cost + 0.01, 0.003, W).lam == 0.0
