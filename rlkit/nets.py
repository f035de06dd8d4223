r"""Small networks for the gymnasium chapters (Part I): MLP policies and value functions.

Everything here is deliberately plain PyTorch so that a reader can see the whole model:

* :func:`layer_init` - orthogonal weight initialisation with a chosen gain, zero bias.
* :func:`mlp` - a tanh multilayer perceptron whose last layer has its own gain.
* :class:`CategoricalPolicy` - :math:`\pi_\theta(a \mid s) = \mathrm{softmax}(f_\theta(s))_a` for a
  discrete action space.
* :class:`ValueNet` - :math:`V_\phi(s)`, a scalar per observation.
* :class:`ActorCritic` - a policy and a value network with *separate* bodies (no shared trunk),
  the layout of the PPO implementations the book compares against.

Orthogonal initialisation (chapter 4, "implementation details"): hidden layers use gain
:math:`\sqrt 2`, the policy's output layer gain 0.01 (so the initial policy is close to uniform,
with maximal entropy) and the value output gain 1.0. Shapes: observations are ``[..., obs_dim]``
(any leading batch dimensions, including none or an empty batch), floating, with the network's
dtype and device; actions are int64 ``[...]``, exactly the leading shape of the observations
(never broadcast); logits ``[..., n_actions]``, values ``[...]``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributions import Categorical

from . import _validate as V

__all__ = ["layer_init", "mlp", "CategoricalPolicy", "ValueNet", "ActorCritic", "obs_dim_of", "n_actions_of"]


def layer_init(layer: nn.Linear, std: float = math.sqrt(2.0), bias: float = 0.0) -> nn.Linear:
    r"""Orthogonally initialise ``layer.weight`` with gain ``std`` and set the bias to ``bias``
    (chapter 04_kl_trpo_ppo, the PPO implementation details).

    An orthogonal matrix :math:`W` (:math:`W W^\top = I` on the smaller side) keeps the norm of
    activations and gradients through a layer; the gain rescales it, :math:`W W^\top = \mathrm{std}^2 I`.

    Args:
        layer: a ``torch.nn.Linear`` with a bias (one built with ``bias=False`` is refused).
        std: the gain, a finite number >= 0.
        bias: the constant bias, a finite number.

    Returns:
        The same layer, for chaining.
    """
    V.instance_of(layer, "layer", nn.Linear, "torch.nn.Linear")
    if layer.bias is None:
        raise ValueError("layer must have a bias (it was built with bias=False), since layer_init sets it")
    std = V.real_in(std, "std", 0.0)
    bias = V.real_in(bias, "bias")
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, out_dim: int, hidden: int | Sequence[int] = 64, layers: int = 2,
        out_std: float = 1.0, activation: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    r"""A multilayer perceptron ``in_dim -> hidden -> ... -> out_dim`` with orthogonal init.

    Args:
        in_dim, out_dim: input and output sizes, ints >= 1.
        hidden: one width used for ``layers`` hidden layers, or an explicit sequence of widths
            (then ``layers`` is ignored); widths are ints >= 1.
        layers: the number of hidden layers when ``hidden`` is an int, >= 0.
        out_std: the output layer's gain (hidden layers get :math:`\sqrt 2`), a finite number >= 0.
        activation: the class of the nonlinearity between layers, such as ``nn.Tanh`` (or any callable
            returning a fresh ``torch.nn.Module``; an instance is refused).

    Returns:
        an ``nn.Sequential`` mapping ``[..., in_dim]`` to ``[..., out_dim]``.
    """
    V.int_in(in_dim, "in_dim")
    V.int_in(out_dim, "out_dim")
    if isinstance(hidden, int) and not isinstance(hidden, bool):
        widths = [V.int_in(hidden, "hidden")] * V.int_in(layers, "layers", 0)
    else:
        V.instance_of(hidden, "hidden", (list, tuple), "list of ints (or an int)")
        widths = [V.int_in(w, f"hidden[{i}]") for i, w in enumerate(hidden)]
    V.real_in(out_std, "out_std", 0.0)
    V.is_callable(activation, "activation")
    if isinstance(activation, nn.Module):
        raise TypeError(f"activation must be a class such as nn.Tanh (called once per layer), not the module "
                        f"instance {activation!r}")
    mods: list[nn.Module] = []
    prev = in_dim
    for w in widths:
        mods += [layer_init(nn.Linear(prev, w)), V.instance_of(activation(), "activation()", nn.Module)]
        prev = w
    mods.append(layer_init(nn.Linear(prev, out_dim), std=out_std))
    return nn.Sequential(*mods)


class CategoricalPolicy(nn.Module):
    r""":math:`\pi_\theta(a \mid s) = \mathrm{softmax}(f_\theta(s))_a` for a discrete action space.

    ``forward(obs)`` returns logits ``[..., n_actions]``; ``dist(obs)`` a
    ``torch.distributions.Categorical``; ``act(obs)`` samples actions and returns
    ``(actions [...], log_probs [...])``; ``log_prob(obs, actions)`` evaluates
    :math:`\log \pi_\theta(a \mid s)`. Chapter 1 derives the score-function gradient that trains it.

    Args:
        obs_dim: the observation size, n_actions: the number of actions (ints >= 1).
        hidden, layers: the body's widths, as in :func:`mlp`.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: int | Sequence[int] = 64, layers: int = 2):
        super().__init__()
        self.obs_dim = V.int_in(obs_dim, "obs_dim")
        self.n_actions = V.int_in(n_actions, "n_actions")
        self.net = mlp(obs_dim, n_actions, hidden, layers, out_std=0.01)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        V.feature_tensor(obs, "obs", self.obs_dim, like=self.net[0].weight)
        return self.net(obs)

    def dist(self, obs: torch.Tensor) -> Categorical:
        return Categorical(logits=self(obs), validate_args=False)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample (or, with ``greedy``, take the most likely) actions and their log-probabilities.

        The same numbers as ``Categorical(logits=self(obs))``'s ``sample()`` and ``log_prob``,
        without building a distribution object at every environment step (rollouts call this
        once per step, so the object's overhead was a noticeable share of a CartPole run).
        Sampling from NaN logits (NaN in ``obs`` or in the weights) raises ``ValueError``; the greedy
        action is then arbitrary and its log-probability NaN.
        """
        V.instance_of(greedy, "greedy", bool)
        logits = self(obs)
        logp_all = logits - logits.logsumexp(-1, keepdim=True)
        if not greedy and logp_all.numel() and bool(torch.isnan(logp_all).any()):
            raise ValueError("obs gave NaN logits, from which no action can be sampled (NaN in obs or in "
                             "the policy's parameters)")
        if greedy:
            a = logits.argmax(-1)
        else:
            probs = torch.softmax(logp_all, -1)
            a = torch.multinomial(probs.reshape(-1, self.n_actions), 1, True).T.reshape(probs.shape[:-1])
        return a, logp_all.gather(-1, a[..., None]).squeeze(-1)

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        r""":math:`\log \pi_\theta(a \mid s)`: ``obs [..., obs_dim]``, ``actions [...]`` int64 -> ``[...]``."""
        d = self.dist(obs)
        V.index_tensor(actions, "actions", shape=obs.shape[:-1], shape_of="obs.shape[:-1]", n=self.n_actions)
        return d.log_prob(actions)


class ValueNet(nn.Module):
    r""":math:`V_\phi(s)`: observations ``[..., obs_dim]`` -> values ``[...]`` (the last dim is squeezed)."""

    def __init__(self, obs_dim: int, hidden: int | Sequence[int] = 64, layers: int = 2):
        super().__init__()
        self.obs_dim = V.int_in(obs_dim, "obs_dim")
        self.net = mlp(obs_dim, 1, hidden, layers, out_std=1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        V.feature_tensor(obs, "obs", self.obs_dim, like=self.net[0].weight)
        return self.net(obs).squeeze(-1)


class ActorCritic(nn.Module):
    """A :class:`CategoricalPolicy` (``.actor``) and a :class:`ValueNet` (``.critic``), no shared trunk.

    ``act(obs) -> (actions, log_probs, values)`` for rollouts, ``evaluate(obs, actions) ->
    (log_probs, entropy, values, logits)`` for updates.  All outputs have the leading shape of ``obs``.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: int | Sequence[int] = 64, layers: int = 2):
        super().__init__()
        self.actor = CategoricalPolicy(obs_dim, n_actions, hidden, layers)
        self.critic = ValueNet(obs_dim, hidden, layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, logp = self.actor.act(obs, greedy=greedy)
        return a, logp, self.critic(obs)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor):
        logits = self.actor(obs)
        V.index_tensor(actions, "actions", shape=obs.shape[:-1], shape_of="obs.shape[:-1]",
                       n=self.actor.n_actions)
        d = Categorical(logits=logits, validate_args=False)
        return d.log_prob(actions), d.entropy(), self.critic(obs), logits


def obs_dim_of(space) -> int:
    """Flat observation size of a gymnasium ``Box`` space (raises for other spaces)."""
    import gymnasium as gym
    V.instance_of(space, "the observation space", gym.spaces.Box, "gymnasium Box")
    V.int_in(len(space.shape), "the number of dimensions of the observation space", 1, 1)
    return int(space.shape[0])


def n_actions_of(space) -> int:
    """Number of actions of a gymnasium ``Discrete`` space (raises for other spaces)."""
    import gymnasium as gym
    V.instance_of(space, "the action space", gym.spaces.Discrete, "gymnasium Discrete (discrete actions)")
    return int(space.n)
