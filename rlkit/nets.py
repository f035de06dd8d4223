"""Small networks for the gymnasium chapters (Part I): MLP policies and value functions.

Everything here is deliberately plain PyTorch so that a reader can see the whole model:

* :func:`layer_init` - orthogonal weight initialisation with a chosen gain, zero bias.
* :func:`mlp` - a tanh multilayer perceptron whose last layer has its own gain.
* :class:`CategoricalPolicy` - pi(a | s) = softmax(logits(s)) for a discrete action space.
* :class:`ValueNet` - V(s), a scalar per observation.
* :class:`ActorCritic` - a policy and a value network with *separate* bodies (no shared trunk),
  the layout of the PPO implementations the book compares against.

Orthogonal initialisation (chapter 4, "implementation details"): hidden layers use gain sqrt(2),
the policy's output layer gain 0.01 (so the initial policy is close to uniform, with maximal
entropy) and the value output gain 1.0.  Shapes: observations are ``[..., obs_dim]`` (any leading
batch dimensions), logits ``[..., n_actions]``, values ``[...]``.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn
from torch.distributions import Categorical

__all__ = ["layer_init", "mlp", "CategoricalPolicy", "ValueNet", "ActorCritic", "obs_dim_of", "n_actions_of"]


def layer_init(layer: nn.Linear, std: float = math.sqrt(2.0), bias: float = 0.0) -> nn.Linear:
    """Orthogonally initialise ``layer.weight`` with gain ``std`` and set the bias to ``bias``.

    An orthogonal matrix W (W W^T = I on the smaller side) keeps the norm of activations and
    gradients through a layer; the gain rescales it.  Returns the same layer (for chaining).
    Chapter 4 lists it among the PPO implementation details.
    """
    if not isinstance(layer, nn.Linear):
        raise TypeError(f"layer must be a torch.nn.Linear, got {type(layer).__name__}")
    if not (isinstance(std, (int, float)) and std >= 0):
        raise ValueError(f"std must be a non-negative number, got {std!r}")
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, out_dim: int, hidden: int | Sequence[int] = 64, layers: int = 2,
        out_std: float = 1.0, activation: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    """A multilayer perceptron ``in_dim -> hidden -> ... -> out_dim`` with orthogonal init.

    ``hidden`` is either one width used for ``layers`` hidden layers, or an explicit sequence of
    widths (then ``layers`` is ignored).  Hidden layers get gain sqrt(2); the output layer gets
    ``out_std``.  Input ``[..., in_dim]`` -> output ``[..., out_dim]``.
    """
    for name, v in (("in_dim", in_dim), ("out_dim", out_dim)):
        if not (isinstance(v, int) and v > 0):
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if isinstance(hidden, int):
        if hidden <= 0 or not (isinstance(layers, int) and layers >= 0):
            raise ValueError(f"hidden must be > 0 and layers >= 0, got hidden={hidden!r}, layers={layers!r}")
        widths = [hidden] * layers
    else:
        widths = list(hidden)
        if not all(isinstance(w, int) and w > 0 for w in widths):
            raise ValueError(f"hidden must be an int or a sequence of positive ints, got {hidden!r}")
    mods: list[nn.Module] = []
    prev = in_dim
    for w in widths:
        mods += [layer_init(nn.Linear(prev, w)), activation()]
        prev = w
    mods.append(layer_init(nn.Linear(prev, out_dim), std=out_std))
    return nn.Sequential(*mods)


def _check_obs(obs: torch.Tensor, obs_dim: int) -> None:
    if not isinstance(obs, torch.Tensor):
        raise TypeError(f"obs must be a torch.Tensor, got {type(obs).__name__}")
    if obs.ndim < 1 or obs.shape[-1] != obs_dim:
        raise ValueError(f"obs must have shape [..., {obs_dim}], got {tuple(obs.shape)}")


class CategoricalPolicy(nn.Module):
    """pi_theta(a | s) = softmax(f_theta(s))_a for a discrete action space.

    ``forward(obs)`` returns logits ``[..., n_actions]``; ``dist(obs)`` a
    ``torch.distributions.Categorical``; ``act(obs)`` samples actions and returns
    ``(actions [...], log_probs [...])``; ``log_prob(obs, actions)`` evaluates log pi(a|s).
    Chapter 1 derives the score-function gradient that trains it.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: int | Sequence[int] = 64, layers: int = 2):
        super().__init__()
        self.obs_dim, self.n_actions = obs_dim, n_actions
        self.net = mlp(obs_dim, n_actions, hidden, layers, out_std=0.01)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        _check_obs(obs, self.obs_dim)
        return self.net(obs)

    def dist(self, obs: torch.Tensor) -> Categorical:
        return Categorical(logits=self(obs), validate_args=False)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self(obs)
        d = Categorical(logits=logits, validate_args=False)
        a = logits.argmax(-1) if greedy else d.sample()
        return a, d.log_prob(a)

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.dist(obs).log_prob(actions)


class ValueNet(nn.Module):
    """V_phi(s): observations ``[..., obs_dim]`` -> values ``[...]`` (the last dim is squeezed)."""

    def __init__(self, obs_dim: int, hidden: int | Sequence[int] = 64, layers: int = 2):
        super().__init__()
        self.obs_dim = obs_dim
        self.net = mlp(obs_dim, 1, hidden, layers, out_std=1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        _check_obs(obs, self.obs_dim)
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
        d = Categorical(logits=logits, validate_args=False)
        return d.log_prob(actions), d.entropy(), self.critic(obs), logits


def obs_dim_of(space) -> int:
    """Flat observation size of a gymnasium ``Box`` space (raises for other spaces)."""
    import gymnasium as gym
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise TypeError(f"the observation space must be a 1-D gymnasium Box, got {space!r}")
    return int(space.shape[0])


def n_actions_of(space) -> int:
    """Number of actions of a gymnasium ``Discrete`` space (raises for other spaces)."""
    import gymnasium as gym
    if not isinstance(space, gym.spaces.Discrete):
        raise TypeError(f"the action space must be gymnasium Discrete (these trainers are for discrete "
                        f"actions), got {space!r}")
    return int(space.n)
