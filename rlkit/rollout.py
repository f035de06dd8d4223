r"""Rollouts on gymnasium 1.x vector environments, with autoreset handled correctly (Part I).

The pitfall
-----------
gymnasium >= 1.0 vector environments reset a finished sub-environment on the *next* call to
``step`` by default (``AutoresetMode.NEXT_STEP``): that step ignores the action, returns the first
observation of the new episode and reward 0, and ``infos`` no longer carries the final observation.
A training loop written for gym 0.2x silently learns from those dummy transitions, and it cannot
bootstrap :math:`V(s_{\text{final}})` on a time-limit truncation because :math:`s_{\text{final}}` is gone.

The choice made here
--------------------
Every vector environment is built with ``autoreset_mode=AutoresetMode.SAME_STEP``.  Then a step that
ends an episode returns the *reset* observation of the next episode as ``obs`` and puts the real last
observation in ``infos["final_obs"][i]`` (with ``infos["_final_obs"][i] = True``).  No transition is a
dummy, and we keep the true successor state of every step:

.. math::

    \texttt{next_obs}[i, t] = \begin{cases}
        \texttt{infos["final_obs"]}[i] & \text{if the episode of env } i \text{ ended at step } t,\\
        \text{the obs returned by step } t & \text{otherwise,}
    \end{cases}

so ``next_values[..., t] = V(next_obs[..., t])`` is :math:`V` of the final observation at truncations
(which the advantage estimator needs, since a time limit is not a terminal state) and the ordinary
:math:`V(s_{t+1})` elsewhere.  At a termination the value is multiplied by
:math:`\gamma_t = \gamma\,(1 - \text{terminated}_t) = 0` (``discounts``, see
:func:`rlkit.returns.from_gymnasium`), and at any episode end the :math:`\lambda`-trace is cut, so the
episode boundary inside a row of the batch never leaks credit across episodes.

Shapes follow the library convention, time LAST: per-step tensors are ``[num_envs, T]``,
observations ``[num_envs, T, obs_dim]``.

* :func:`make_vec_env` - a ``SyncVectorEnv`` with SAME_STEP autoreset, from an id or a constructor.
* :class:`Batch` - the tensors of one rollout.
* :class:`RolloutCollector` - steps a vector env with a policy, keeps the per-env episode
  bookkeeping across calls, and logs completed episodes (return, length, env step at which they
  finished).  ``collect(act_fn, T, value_fn)`` gives fixed-length rollouts that continue across
  updates (A2C, PPO, TRPO); ``collect_episodes(act_fn)`` gives one complete episode per env starting
  from a reset (REINFORCE), with a ``mask`` of the real steps.
* :func:`sample_episodes` - many complete episodes of a fixed policy from a natively vectorised
  env (NEXT_STEP autoreset, dummy steps masked), as padded tensors (chapter 2's estimator study).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from . import _validate as V

__all__ = ["make_vec_env", "Batch", "RolloutCollector", "EpisodeLog", "sample_episodes"]


def make_vec_env(env: str | Callable[[], gym.Env], num_envs: int = 8, **make_kwargs) -> gym.vector.SyncVectorEnv:
    """Build a ``SyncVectorEnv`` of ``num_envs`` copies with ``AutoresetMode.SAME_STEP`` autoreset.

    ``env`` is a registered id such as ``"CartPole-v1"`` (``make_kwargs`` go to ``gymnasium.make``)
    or a zero-argument constructor returning a ``gymnasium.Env``.  Synchronous (in-process)
    stepping: for the tiny environments of the book a subprocess per env costs more than it saves.
    Seed it through the first ``reset(seed=...)`` (``RolloutCollector`` does that). An id gymnasium does
    not know raises ``ValueError``; a constructor that returns something other than a ``gymnasium.Env``
    raises ``TypeError`` (both naming ``env``).
    """
    if not (isinstance(num_envs, int) and num_envs >= 1):
        raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
    if isinstance(env, str):
        def make():
            try:
                return gym.make(env, **make_kwargs)
            except gym.error.Error as e:          # NameNotFound, VersionNotFound, ...: not a known id
                raise ValueError(f"env={env!r} is not a registered gymnasium id ({type(e).__name__}: {e}); "
                                 f"pass an id such as 'CartPole-v1' or a constructor") from e
    elif callable(env):
        if make_kwargs:
            raise ValueError("make_kwargs are only used when env is an id string")

        def make():
            out = env()
            if not isinstance(out, gym.Env):
                raise TypeError(f"env must be a gymnasium id (str) or a callable returning a gymnasium.Env; "
                                f"the callable returned an object of type {type(out).__name__}")
            return out
    else:
        raise TypeError(f"env must be a gymnasium id (str) or a callable returning a gymnasium.Env, "
                        f"got {type(env).__name__}")
    return gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)


DEVICE_TYPES = ("cpu", "cuda", "mps")


def check_device(device, name: str = "device") -> torch.device:
    """``device`` (a ``torch.device``, a string such as ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, or a CUDA
    index) as a ``torch.device``, refused with a ``ValueError`` naming ``name`` if torch does not know it or the
    machine does not have it (``"cuda"`` without CUDA). The trainers of :mod:`rlkit.algos` check theirs with it."""
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, int)):
        raise TypeError(f"{name} must be a torch.device, a string such as 'cpu', 'cuda', 'cuda:0' or 'mps', or "
                        f"a CUDA device index, got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"{name}={device!r} is not a device torch knows; use one of {list(DEVICE_TYPES)} "
                         f"(optionally with an index, e.g. 'cuda:0')") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}={device!r} but torch.cuda.is_available() is False; use 'cpu'")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{name}={device!r} but the MPS backend is not available; use 'cpu'")
    return dev


@dataclass
class Batch:
    r"""One rollout.  ``N`` envs, ``T`` steps, time last.

    * ``obs`` ``[N, T, obs_dim]``: :math:`s_t`.
    * ``actions`` ``[N, T]`` (int64): :math:`a_t`.
    * ``logp`` ``[N, T]``: :math:`\log\pi_{old}(a_t \mid s_t)` of the policy that acted.
    * ``rewards`` ``[N, T]``: :math:`r_t`.
    * ``terminated`` ``[N, T]`` (bool): :math:`s_{t+1}` is terminal (its value is 0).
    * ``truncated`` ``[N, T]`` (bool): the episode was cut by a time limit after this step.
    * ``next_obs`` ``[N, T, obs_dim]``: the true :math:`s_{t+1}` (``infos["final_obs"]`` at episode ends).
    * ``mask`` ``[N, T]`` (bool): the real steps (all True for fixed-length rollouts; in
      ``collect_episodes`` the steps after an env's episode ended are False).
    * ``values`` ``[N, T]`` or None: :math:`V(s_t)` (if a ``value_fn`` was given).
    * ``next_values`` ``[N, T]`` or None: :math:`V` of ``next_obs``, i.e. :math:`V(s_{t+1})`, with
      :math:`V` of the final observation at episode ends.
    """
    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    next_obs: torch.Tensor
    mask: torch.Tensor
    values: torch.Tensor | None = None
    next_values: torch.Tensor | None = None

    @property
    def dones(self) -> torch.Tensor:
        """True where an episode ended at this step (``terminated | truncated``)."""
        return self.terminated | self.truncated

    def to(self, device) -> Batch:
        return Batch(**{f.name: (None if getattr(self, f.name) is None else getattr(self, f.name).to(device))
                        for f in fields(self)})


@dataclass
class EpisodeLog:
    """Completed episodes in the order they finished: the env step count when each ended, its
    undiscounted return and its length."""
    steps: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


class RolloutCollector:
    """Steps a SAME_STEP-autoreset vector env with a policy and logs completed episodes.

    Args:
        envs: a ``gymnasium.vector.VectorEnv`` built with ``AutoresetMode.SAME_STEP`` (see
            :func:`make_vec_env`).
        seed: passed to the first ``envs.reset(seed=seed)`` (env i gets ``seed + i``).
        device: where the returned tensors live (the policy's device).

    ``env_steps`` counts transitions handed to the learner (``N * T`` per ``collect``; the masked
    filler steps of ``collect_episodes`` are not counted).  ``episodes`` is an :class:`EpisodeLog`.
    """

    def __init__(self, envs: gym.vector.VectorEnv, seed: int | None = None, device: str | torch.device = "cpu"):
        if not isinstance(envs, gym.vector.VectorEnv):
            raise TypeError(f"envs must be a gymnasium.vector.VectorEnv, got {type(envs).__name__}")
        if seed is not None:
            V.int_in(seed, "seed", 0)
        device = check_device(device)
        mode = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if mode != AutoresetMode.SAME_STEP:
            raise ValueError(f"envs must use autoreset_mode=AutoresetMode.SAME_STEP (got {mode}); "
                             "build them with rlkit.rollout.make_vec_env")
        self.envs, self.device = envs, device
        self.num_envs = envs.num_envs
        obs, _ = envs.reset(seed=seed)
        self.obs = self._t(obs)
        self.ep_return = np.zeros(self.num_envs)
        self.ep_length = np.zeros(self.num_envs, dtype=np.int64)
        self.env_steps = 0
        self.episodes = EpisodeLog()

    def _t(self, x) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x), dtype=torch.float32, device=self.device)

    def _act(self, act_fn: Callable) -> tuple[torch.Tensor, torch.Tensor]:
        """``act_fn(self.obs)``'s actions ``[N]`` and log-probs ``[N]``, checked (the errors name ``act_fn``)."""
        out = act_fn(self.obs)
        N = self.num_envs
        if not isinstance(out, (tuple, list)) or len(out) < 2:
            got = f"a {type(out).__name__} of length {len(out)}" if isinstance(out, (tuple, list)) else \
                f"an object of type {type(out).__name__}"
            raise TypeError(f"act_fn must return a tuple (actions [{N}], logp [{N}], ...), got {got}")
        actions, logp = out[0], out[1]
        V.instance_of(actions, "the actions act_fn returned", torch.Tensor, "torch.Tensor")
        if actions.dim() < 1 or actions.shape[0] != N:
            got = f"shape {tuple(actions.shape)}"
            raise ValueError(f"act_fn must return actions as a tensor with one row per env ([{N}, ...]), got {got}")
        V.float_tensor(logp, "the log-probs act_fn returned", min_dim=0)
        V.exact_shape(logp, "the log-probs act_fn returned", (N,), "[num_envs]")
        return actions, logp

    def _step(self, actions: torch.Tensor):
        """One vector step. Returns (obs_after, true_next_obs, reward, terminated, truncated) as numpy."""
        a = actions.detach().cpu().numpy()
        if not self.envs.action_space.contains(a):
            raise ValueError(f"act_fn returned actions that are not in the action space {self.envs.action_space} "
                             f"(dtype {a.dtype}, values {a.tolist()})")
        obs, reward, term, trunc, infos = self.envs.step(a)
        next_obs = np.array(obs, dtype=np.float32, copy=True)
        done = np.logical_or(term, trunc)
        if done.any():
            has_final = infos.get("_final_obs", np.zeros(self.num_envs, dtype=bool))
            if not np.array_equal(np.asarray(has_final, dtype=bool), done):
                raise RuntimeError("infos['final_obs'] missing for a finished env: is the vector env SAME_STEP?")
            for i in np.flatnonzero(done):
                next_obs[i] = infos["final_obs"][i]
        return obs, next_obs, np.asarray(reward, dtype=np.float64), np.asarray(term, bool), np.asarray(trunc, bool)

    def _log(self, reward, done, live=None):
        """Episode bookkeeping for one vector step; ``live`` marks envs whose step counts."""
        live = np.ones(self.num_envs, dtype=bool) if live is None else live
        self.ep_return += reward * live
        self.ep_length += live
        self.env_steps += int(live.sum())
        for i in np.flatnonzero(done & live):
            self.episodes.steps.append(self.env_steps)
            self.episodes.returns.append(float(self.ep_return[i]))
            self.episodes.lengths.append(int(self.ep_length[i]))
        self.ep_return[done] = 0.0
        self.ep_length[done] = 0

    def collect(self, act_fn: Callable, num_steps: int,
                value_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Batch:
        """Run ``num_steps`` vector steps, continuing from where the previous call stopped.

        ``act_fn(obs [N, obs_dim]) -> (actions [N], logp [N])`` (extra returned items are ignored);
        it is called under ``torch.no_grad()``, and what it returns is checked (a tuple, actions with one
        row per env inside the action space, floating ``logp [N]``; otherwise an error naming ``act_fn``).
        If ``value_fn(obs [..., obs_dim]) -> [...]`` is given, ``values = V(obs)`` and
        ``next_values = V(next_obs)`` are filled in two batched calls after the loop (``next_obs`` holds
        the final observation at episode ends); each must be a floating ``[N, T]`` tensor.
        """
        if not (isinstance(num_steps, int) and num_steps >= 1):
            raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
        self._check_fns(act_fn, value_fn)
        N, T = self.num_envs, num_steps
        steps = []
        with torch.no_grad():
            for _ in range(T):
                actions, logp = self._act(act_fn)
                obs, next_obs, reward, term, trunc = self._step(actions)
                self._log(reward, term | trunc)
                steps.append((self.obs, actions, logp, next_obs, reward, term, trunc))
                self.obs = self._t(obs)
        return self._batch(steps, torch.ones(N, T, dtype=torch.bool, device=self.device), value_fn)

    def _batch(self, steps, mask, value_fn) -> Batch:
        """Stack the per-step tuples ``(obs, actions, logp, next_obs, reward, terminated, truncated)``
        (time becomes dim 1) into a :class:`Batch`; fill values if asked."""
        obs_l, act_l, logp_l, next_l, rew_l, term_l, trunc_l = zip(*steps)
        dev = self.device
        batch = Batch(
            obs=torch.stack(obs_l, 1),
            actions=torch.stack(act_l, 1).to(dev).long(),
            logp=torch.stack(logp_l, 1).to(dev).float(),
            rewards=torch.as_tensor(np.stack(rew_l, 1), dtype=torch.float32, device=dev),
            terminated=torch.as_tensor(np.stack(term_l, 1), device=dev),
            truncated=torch.as_tensor(np.stack(trunc_l, 1), device=dev),
            next_obs=self._t(np.stack(next_l, 1)),
            mask=mask,
        )
        if value_fn is not None:
            with torch.no_grad():
                batch.values = value_fn(batch.obs)
                batch.next_values = value_fn(batch.next_obs)
            for what, x in (("values", batch.values), ("next values", batch.next_values)):
                name = f"the {what} value_fn returned"
                V.exact_shape(V.float_tensor(x, name, min_dim=0), name, tuple(mask.shape), "[num_envs, T]")
        return batch

    @staticmethod
    def _check_fns(act_fn, value_fn) -> None:
        V.is_callable(act_fn, "act_fn")
        if value_fn is not None:
            V.is_callable(value_fn, "value_fn")

    def collect_episodes(self, act_fn: Callable, max_steps: int = 100_000,
                         value_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Batch:
        """Reset every env and run until each has finished ONE episode (Monte Carlo, REINFORCE).

        Returns a :class:`Batch` padded to the longest episode: ``mask[i, t]`` is True for the steps
        of env i's episode and False after it ended (those filler steps come from the autoreset
        episode, are never learned from and are not counted in ``env_steps``).  Every row ends with
        ``terminated`` or ``truncated`` at its last real step, so discounted returns computed with
        ``discounts = gamma * (1 - terminated)`` and zero bootstrap are exact Monte Carlo returns
        (a time-limit truncation is treated as the end of the sample, the usual REINFORCE choice).
        """
        V.int_in(max_steps, "max_steps")
        self._check_fns(act_fn, value_fn)
        N = self.num_envs
        obs, _ = self.envs.reset()
        self.obs = self._t(obs)
        self.ep_return[:] = 0.0
        self.ep_length[:] = 0
        live = np.ones(N, dtype=bool)
        steps, mask_l = [], []
        with torch.no_grad():
            while live.any():
                if len(steps) >= max_steps:
                    raise RuntimeError(f"an episode did not end within max_steps={max_steps}")
                actions, logp = self._act(act_fn)
                obs, next_obs, reward, term, trunc = self._step(actions)
                self._log(reward, term | trunc, live)
                steps.append((self.obs, actions, logp, next_obs, reward * live, term & live, trunc & live))
                mask_l.append(live.copy())
                live = live & ~(term | trunc)
                self.obs = self._t(obs)
        return self._batch(steps, torch.as_tensor(np.stack(mask_l, 1), device=self.device), value_fn)


def _policy_probs(policy, obs: torch.Tensor, env) -> torch.Tensor:
    """``softmax(policy(obs))``, checked: floating logits ``[num_envs, n_actions]`` that give finite probabilities."""
    logits = V.float_tensor(policy(obs), "the logits policy returned", min_dim=0)
    n = getattr(env.single_action_space, "n", None)
    V.exact_shape(logits, "the logits policy returned", (obs.shape[0], logits.shape[-1] if n is None else int(n)),
                  "[num_envs, n_actions]")
    probs = torch.softmax(logits, -1)
    if not bool(torch.isfinite(probs).all()):
        raise ValueError("policy returned logits with NaN or +inf, or a row that is -inf everywhere")
    return probs


def sample_episodes(policy: Callable[[torch.Tensor], torch.Tensor], n_episodes: int, seed: int,
                    num_envs: int = 256, make_env: Callable[[int], gym.vector.VectorEnv] | None = None) -> dict:
    """``n_episodes`` complete episodes of ``policy``, padded to the longest: a dict of tensors.

    The fast path for MANY episodes of a fixed policy (chapter 2 samples tens of thousands): a
    natively vectorised environment (``make_env(num_envs)``; default gymnasium's
    ``CartPoleVectorEnv``) stepped with gymnasium's default ``NEXT_STEP`` autoreset, whose dummy
    step after every episode end (it ignores the action and returns the first observation of the
    next episode) is masked out rather than avoided. Each of the ``num_envs`` copies contributes its
    first ``ceil(n_episodes / num_envs)`` episodes, in copy order, and the first ``n_episodes`` are kept.
    Actions are drawn from ``softmax(policy(obs))`` with a torch generator seeded by ``seed`` (the
    environment is reset with the same seed), so a call is reproducible and leaves the global RNG alone.

    Args:
        policy: a module (or function) ``obs [num_envs, obs_dim] -> logits [num_envs, n_actions]``.
        n_episodes, num_envs: ints ``>= 1``.
        seed: int ``>= 0``.
        make_env: ``num_envs -> VectorEnv`` with ``NEXT_STEP`` autoreset, Box observations and
            Discrete actions (default: ``CartPoleVectorEnv(num_envs=num_envs)``).

    Returns:
        ``obs [n, L, obs_dim]``, ``actions [n, L]`` (int64), ``rewards [n, L]``, ``terminated`` and
        ``truncated [n, L]`` (bool), ``mask [n, L]`` (bool, the real steps) and ``lengths [n]``, with
        ``n = n_episodes`` and ``L`` the longest episode; padding is 0 / False. Unlike
        :meth:`RolloutCollector.collect_episodes` there is no ``logp`` and no ``next_obs``.
    """
    V.int_in(n_episodes, "n_episodes")
    V.int_in(num_envs, "num_envs")
    V.int_in(seed, "seed", 0)
    if not callable(policy):
        raise TypeError(f"policy must be callable obs -> logits, got {type(policy).__name__}")
    if make_env is None:
        from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
        make_env = lambda n: CartPoleVectorEnv(num_envs=n)          # noqa: E731
    elif not callable(make_env):
        raise TypeError(f"make_env must be callable num_envs -> VectorEnv, got {type(make_env).__name__}")
    k = -(-n_episodes // num_envs)                 # take the first k episodes of every copy
    env = make_env(num_envs)
    V.instance_of(env, "the value make_env returned", gym.vector.VectorEnv, "gymnasium.vector.VectorEnv")
    mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if mode != AutoresetMode.NEXT_STEP:
        env.close()
        raise ValueError(f"make_env must build a vector env with NEXT_STEP autoreset (its dummy steps are "
                         f"masked here), got {mode}")
    obs, _ = env.reset(seed=seed)
    gen = torch.Generator().manual_seed(seed)
    O, A, R, TE, TR, VALID = [], [], [], [], [], []
    valid = np.ones(num_envs, dtype=bool)          # False on the dummy step after an episode end
    finished = np.zeros(num_envs, dtype=int)
    with torch.no_grad():
        while finished.min() < k:
            o = torch.as_tensor(obs)
            a = torch.multinomial(_policy_probs(policy, o, env), 1, generator=gen).squeeze(-1)
            obs, r, term, trunc, _ = env.step(a.numpy())
            for store, x in zip((O, A, R, TE, TR, VALID), (o, a, r, term, trunc, valid)):
                store.append(x)
            finished += (term | trunc) & valid
            valid = ~(term | trunc)
    env.close()
    O, A = torch.stack(O, 1), torch.stack(A, 1)
    R, TE, TR, VALID = (np.stack(x, 1) for x in (R, TE, TR, VALID))
    pieces = []                                    # (copy, indices of its steps) for every episode
    for i in range(num_envs):
        steps = np.flatnonzero(VALID[i])
        ends = steps[TE[i, steps] | TR[i, steps]][:k]
        starts = np.concatenate([[steps[0]], ends[:-1] + 1])
        pieces += [(i, steps[(steps >= s) & (steps <= e)]) for s, e in zip(starts, ends)]
    pieces = pieces[:n_episodes]
    n, L = len(pieces), max(len(idx) for _, idx in pieces)
    ep = dict(obs=torch.zeros(n, L, O.shape[-1], dtype=O.dtype), actions=torch.zeros(n, L, dtype=torch.int64),
              rewards=torch.zeros(n, L), terminated=torch.zeros(n, L, dtype=torch.bool),
              truncated=torch.zeros(n, L, dtype=torch.bool), mask=torch.zeros(n, L, dtype=torch.bool))
    for j, (i, idx) in enumerate(pieces):
        m = len(idx)
        ep["obs"][j, :m], ep["actions"][j, :m] = O[i, idx], A[i, idx]
        ep["rewards"][j, :m] = torch.from_numpy(R[i, idx])
        ep["terminated"][j, :m] = torch.from_numpy(TE[i, idx])
        ep["truncated"][j, :m] = torch.from_numpy(TR[i, idx])
        ep["mask"][j, :m] = True
    ep["lengths"] = ep["mask"].sum(1)
    return ep
