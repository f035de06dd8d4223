"""rlkit's GRPO-family losses on fixed inputs equal the formulas TRL documents for its loss types.

TRL (``GRPOConfig.loss_type``, trl 1.16 documentation and ``GRPOTrainer._compute_loss``) writes the
per-token loss as :math:`\\ell_{i,t} = -\\min(\\rho_{i,t} A_i, \\mathrm{clip}(\\rho_{i,t}, 1-\\epsilon_{low},
1+\\epsilon_{high}) A_i)` and aggregates it, with :math:`m_{i,t}` the completion mask, :math:`N` the
completions and :math:`L` = ``max_completion_length``:

* ``grpo``:    :math:`\\frac1N \\sum_i \\frac{\\sum_t m_{i,t}\\ell_{i,t}}{\\max(1, \\sum_t m_{i,t})}`;
* ``bnpo``:    :math:`\\frac{\\sum_{i,t} m_{i,t}\\ell_{i,t}}{\\max(1, \\sum_{i,t} m_{i,t})}` over the local batch;
* ``dr_grpo``: :math:`\\frac{\\sum_{i,t} m_{i,t}\\ell_{i,t}}{N L}`;
* ``dapo``:    :math:`\\frac{\\sum_{i,t} m_{i,t}\\ell_{i,t}}{\\text{active tokens of the whole generation batch}}`,
  which is ``bnpo`` when one optimisation step takes the whole generation batch;

and its advantages (``scale_rewards="group"``) :math:`A_i = (r_i - \\bar r_g)/(\\mathrm{std}_g + 10^{-4})`
with the sample standard deviation, ``scale_rewards="none"``: :math:`A_i = r_i - \\bar r_g`. The
formulas are written out below in plain loops; TRL is not imported. Where rlkit differs on purpose
(its :math:`\\zeta = 10^{-6}` in place of :math:`10^{-4}`; ``dapo``'s normaliser per minibatch) the
module docstring of rlkit.llm.rl says so, and the tests pin the difference.
"""
from __future__ import annotations

import math

import pytest
import torch

from rlkit.llm import RLConfig, policy_loss, sequence_advantages
from rlkit.objectives import grpo_advantages

G = 4                                    # completions per prompt
N, T = 8, 6                              # two prompts, padded completion length (= max_completion_length)


def fixed_inputs():
    g = torch.Generator().manual_seed(7)
    lengths = [6, 1, 3, 6, 2, 5, 4, 6]
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths], dtype=torch.float64)
    old = -torch.rand(N, T, generator=g, dtype=torch.float64) * 2
    new = old + 0.4 * torch.randn(N, T, generator=g, dtype=torch.float64)   # ratios well outside [0.8, 1.28]
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    return new, old, rewards, mask


def trl_advantages(rewards, scale):
    out = []
    for k in range(0, len(rewards), G):
        grp = [float(x) for x in rewards[k:k + G]]
        mean = sum(grp) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (G - 1))
        out += [(x - mean) / (std + 1e-4) if scale == "group" else x - mean for x in grp]
    return out


def trl_token_loss(new, old, adv, i, t, eps_low, eps_high):
    rho = math.exp(float(new[i, t]) - float(old[i, t]))
    a = adv[i]
    return -min(rho * a, min(max(rho, 1 - eps_low), 1 + eps_high) * a)


def trl_loss(loss_type, new, old, adv, mask, eps_low=0.2, eps_high=0.2):
    tok = [[trl_token_loss(new, old, adv, i, t, eps_low, eps_high) * float(mask[i, t]) for t in range(T)]
           for i in range(N)]
    active = [sum(float(m) for m in mask[i]) for i in range(N)]
    if loss_type == "grpo":
        return sum(sum(tok[i]) / max(1.0, active[i]) for i in range(N)) / N
    if loss_type in ("bnpo", "dapo"):                 # dapo: the whole generation batch is this batch
        return sum(map(sum, tok)) / max(1.0, sum(active))
    if loss_type == "dr_grpo":
        return sum(map(sum, tok)) / (N * T)
    raise ValueError(loss_type)


def rlkit_loss(algo, aggregation, new, old, adv, mask, **kw):
    cfg = RLConfig(algo=algo, aggregation=aggregation, group_size=G, **kw).resolved()
    adv_tok = torch.as_tensor(adv, dtype=torch.float64)[:, None].expand(N, T) * mask
    loss, _ = policy_loss(cfg, new, old, adv_tok, mask)
    return float(loss)


@pytest.mark.parametrize("algo,aggregation,loss_type,scale", [
    ("grpo", None, "grpo", "group"),                         # rlkit's grpo default = TRL's grpo
    ("dr_grpo", None, "dr_grpo", "none"),                    # rlkit's dr_grpo default = TRL's dr_grpo
    ("grpo", "token-mean", "bnpo", "group"),
    ("grpo", "token-mean", "dapo", "group"),                 # one minibatch = the whole generation batch
    ("grpo", "seq-mean-token-sum-norm", "dr_grpo", "group"),
])
def test_policy_loss_equals_trl_formula(algo, aggregation, loss_type, scale):
    new, old, rewards, mask = fixed_inputs()
    adv = trl_advantages(rewards, scale)
    ours = rlkit_loss(algo, aggregation, new, old, adv, mask)
    assert ours == pytest.approx(trl_loss(loss_type, new, old, adv, mask), rel=1e-12, abs=1e-12)


def test_clip_higher_matches_trl_epsilon_high():
    new, old, rewards, mask = fixed_inputs()
    adv = trl_advantages(rewards, "group")
    ours = rlkit_loss("dapo", None, new, old, adv, mask)          # dapo: (0.2, 0.28), token-mean
    theirs = trl_loss("dapo", new, old, adv, mask, eps_low=0.2, eps_high=0.28)
    assert ours == pytest.approx(theirs, rel=1e-12)
    # and the clip binds on these inputs: with a wider clip the value changes
    assert abs(theirs - trl_loss("dapo", new, old, adv, mask, eps_low=0.2, eps_high=10.0)) > 1e-3


def test_advantages_equal_trl_scaling_up_to_the_documented_zeta():
    _, _, rewards, _ = fixed_inputs()
    trl_group, trl_none = trl_advantages(rewards, "group"), trl_advantages(rewards, "none")
    assert grpo_advantages(rewards, G, scale="std", eps=1e-4).tolist() == pytest.approx(trl_group, rel=1e-12)
    assert sequence_advantages(rewards, "dr_grpo", G).tolist() == pytest.approx(trl_none, abs=1e-12)
    # rlkit's trainer uses zeta = 1e-6 (RLConfig does not expose it): a relative difference below 2e-4 here
    ours = sequence_advantages(rewards, "grpo", G).tolist()
    assert ours == pytest.approx(trl_group, rel=2e-4) and ours != pytest.approx(trl_group, rel=1e-8)


def test_dapo_normaliser_is_per_minibatch_in_rlkit():
    """The deliberate difference: with two minibatches TRL's dapo divides each half by the WHOLE batch's
    active tokens (after rescaling by steps_per_generation); rlkit's token-mean divides by the half's own."""
    new, old, rewards, mask = fixed_inputs()
    adv = trl_advantages(rewards, "group")
    halves = [slice(0, 4), slice(4, 8)]
    ours = []
    for h in halves:
        cfg = RLConfig(algo="grpo", aggregation="token-mean", group_size=G).resolved()
        a = torch.as_tensor(adv, dtype=torch.float64)[h, None].expand(4, T) * mask[h]
        ours.append(float(policy_loss(cfg, new[h], old[h], a, mask[h])[0]))
    tok_sum = [sum(trl_token_loss(new, old, adv, i, t, 0.2, 0.2) * float(mask[i, t])
                   for i in range(h.start, h.stop) for t in range(T)) for h in halves]
    total = float(mask.sum())
    trl_dapo = [s / (total / 2) for s in tok_sum]             # normaliser: all active tokens / 2 steps
    own = [s / float(mask[h].sum()) for s, h in zip(tok_sum, halves)]
    assert ours == pytest.approx(own, rel=1e-12)              # = TRL's bnpo on each minibatch
    assert ours != pytest.approx(trl_dapo, rel=1e-3)          # not TRL's dapo when the halves differ in tokens
