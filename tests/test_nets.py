"""Contracts of rlkit.nets: nothing is broadcast, bad arguments are named, empty batches work.

Expected values are computed here from the logits with an explicit log-softmax and gather.
"""
from __future__ import annotations

import math

import pytest
import torch

from rlkit.nets import ActorCritic, CategoricalPolicy, ValueNet, layer_init, mlp


@pytest.fixture
def pol():
    torch.manual_seed(0)
    return CategoricalPolicy(3, 4, hidden=8)


def manual_log_prob(logits, actions):
    """log softmax(logits)[a], one row at a time."""
    flat_l, flat_a = logits.reshape(-1, logits.shape[-1]), actions.reshape(-1)
    out = [flat_l[i, flat_a[i]] - torch.logsumexp(flat_l[i], 0) for i in range(flat_a.numel())]
    return torch.stack(out).reshape(actions.shape) if out else logits.new_zeros(actions.shape)


def test_log_prob_refuses_a_trailing_action_dimension_instead_of_broadcasting(pol):
    obs = torch.randn(5, 3)
    actions = torch.tensor([0, 1, 2, 3, 1])
    assert torch.allclose(pol.log_prob(obs, actions), manual_log_prob(pol(obs), actions), atol=1e-6)
    with pytest.raises(ValueError, match=r"actions has shape \(5, 1\) but shape \(5,\)"):
        pol.log_prob(obs, actions[:, None])                      # used to give a [5, 5] matrix
    with pytest.raises(ValueError, match="actions has shape"):
        pol.log_prob(obs, actions[:1])                           # [1] would broadcast to [5]
    ac = ActorCritic(3, 4, hidden=8)
    with pytest.raises(ValueError, match="actions has shape"):
        ac.evaluate(obs, actions[:, None])


@pytest.mark.parametrize("bad,err,msg", [
    (torch.tensor([0, 1, 4, 0, 0]), ValueError, r"actions must lie in \[0, 4\)"),
    (torch.tensor([0, -1, 0, 0, 0]), ValueError, r"actions must lie in \[0, 4\)"),
    (torch.tensor([0.0, 1.0, 1.0, 0.0, 0.3]), TypeError, "actions must be a torch.Tensor of dtype int64"),
    ([0, 1, 1, 0, 0], TypeError, "actions must be a torch.Tensor"),
])
def test_bad_actions_are_named(pol, bad, err, msg):
    obs = torch.randn(5, 3)
    with pytest.raises(err, match=msg):
        pol.log_prob(obs, bad)
    with pytest.raises(err, match=msg):
        ActorCritic(3, 4, hidden=8).evaluate(obs, bad)


@pytest.mark.parametrize("bad,err,msg", [
    (torch.zeros(4, 5), ValueError, r"obs must have shape \[\.\.\., 3\]"),
    (torch.zeros(()), ValueError, r"obs must have shape \[\.\.\., 3\]"),
    (torch.zeros(4, 3, dtype=torch.long), TypeError, "obs must have a floating dtype"),
    (torch.zeros(4, 3, dtype=torch.float64), ValueError, "obs has dtype torch.float64 but the network"),
    ([0.0, 0.0, 0.0], TypeError, "obs must be a torch.Tensor"),
])
def test_bad_observations_are_named(pol, bad, err, msg):
    for fn in (pol, ValueNet(3, hidden=8), ActorCritic(3, 4, hidden=8).act, pol.act):
        with pytest.raises(err, match=msg):
            fn(bad)


def test_empty_batches_and_unbatched_observations(pol):
    ac = ActorCritic(3, 4, hidden=8)
    empty = torch.zeros(0, 3)
    a, logp, v = ac.act(empty)
    assert a.shape == logp.shape == v.shape == (0,)
    lp, ent, v2, logits = ac.evaluate(empty, torch.zeros(0, dtype=torch.long))
    assert lp.shape == ent.shape == v2.shape == (0,) and logits.shape == (0, 4)
    assert pol.log_prob(torch.zeros(2, 0, 3), torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0)
    one = torch.randn(3)                                        # no batch dimension: a scalar action
    assert pol.log_prob(one, torch.tensor(2)).shape == ()
    assert torch.isclose(pol.log_prob(one, torch.tensor(2)), torch.log_softmax(pol(one), -1)[2])


def test_evaluate_and_act_agree_with_the_logits(pol):
    ac = ActorCritic(3, 4, hidden=8)
    obs = torch.randn(2, 6, 3)
    a, logp, _ = ac.act(obs)
    lp, ent, _, logits = ac.evaluate(obs, a)
    assert torch.allclose(lp, manual_log_prob(logits, a), atol=1e-6) and torch.allclose(lp, logp)
    p = torch.softmax(logits, -1)
    assert torch.allclose(ent, -(p * p.log()).sum(-1), atol=1e-6)
    g, _, _ = ac.act(obs, greedy=True)
    assert torch.equal(g, logits.argmax(-1))
    with pytest.raises(TypeError, match="greedy must be a bool"):
        ac.act(obs, greedy="yes")


@pytest.mark.parametrize("call,err,msg", [
    (lambda: CategoricalPolicy(0, 2), ValueError, "obs_dim must be >= 1"),
    (lambda: CategoricalPolicy(3, 0), ValueError, "n_actions must be >= 1"),
    (lambda: CategoricalPolicy(3.0, 2), TypeError, "obs_dim must be an int"),
    (lambda: ValueNet(-1), ValueError, "obs_dim must be >= 1"),
    (lambda: mlp(3, 2, hidden=0), ValueError, "hidden must be >= 1"),
    (lambda: mlp(3, 2, layers=-1), ValueError, "layers must be >= 0"),
    (lambda: mlp(3, 2, hidden=[4, 0]), ValueError, r"hidden\[1\] must be >= 1"),
    (lambda: mlp(3, 2, hidden="64"), TypeError, "hidden must be a list of ints"),
    (lambda: mlp(3, 2, activation=3), TypeError, "activation must be callable"),
    (lambda: layer_init(torch.nn.Linear(2, 2), std=-1.0), ValueError, "std must be a finite number"),
    (lambda: layer_init(torch.nn.Linear(2, 2), std=math.nan), ValueError, "std must be a finite number"),
    (lambda: layer_init(torch.nn.Linear(2, 2), bias=math.inf), ValueError, "bias must be a finite number"),
    (lambda: layer_init(torch.nn.Conv1d(1, 1, 1)), TypeError, "layer must be a torch.nn.Linear"),
])
def test_bad_constructor_arguments_are_named(call, err, msg):
    with pytest.raises(err, match=msg):
        call()


def test_mlp_layout_and_gains():
    torch.manual_seed(0)
    net = mlp(3, 2, hidden=[16, 8], out_std=0.5)
    assert [type(m).__name__ for m in net] == ["Linear", "Tanh", "Linear", "Tanh", "Linear"]
    W = net[4].weight.detach()                                   # [2, 8]: rows orthogonal, gain 0.5
    assert torch.allclose(W @ W.T, 0.25 * torch.eye(2), atol=1e-5)
    assert len(mlp(3, 2, hidden=5, layers=0)) == 1               # no hidden layer: one linear map
