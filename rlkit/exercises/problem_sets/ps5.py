r"""Problem set 5, "Bug hunt" (chapters 1, 2, 4 and 5): the trainer as shipped, and the visible tests.

Skeleton: ``lessons/problem_sets/ps5_bug_hunt.ipynb``. The notebook ships a complete PPO trainer for
CartPole-v1 that runs without an error and prints plausible numbers. Three of its functions hold one
silent bug each. The tasks are the three functions, fixed (``collect_rollout``, ``gae_advantages``,
``ppo_update``, each an answer cell that starts as the shipped code), and three diagnostics
(``diagnose_rollout``, ``diagnose_gae``, ``diagnose_update``): functions that take an implementation
and raise ``AssertionError`` when it has the bug.

A visible test runs a diagnostic on the shipped function (it must raise ``AssertionError``) and on the
student's fixed one (it must not). The instructor's hidden tests grade the fixed functions themselves,
the diagnostics on a correct implementation, and the trainer's learning on fresh seeds.

:data:`SHIPPED_SOURCE` is the code the notebook ships (the skeleton's answer cells are built from it,
and ``tests/test_problem_sets_ps5.py`` checks that they agree); :data:`TRAIN_SOURCE` is the training
loop (a plain cell of the notebook: it is correct).
"""
from __future__ import annotations

from . import ANSWER_PREAMBLE, ProblemSet, Test, register_problem_set

__all__ = ["PS5", "SHIPPED_SOURCE", "TRAIN_SOURCE", "shipped"]

#: The shipped code of each answer cell, by task (the trainer as handed out, bugs included).
SHIPPED_SOURCE = {
    "collect_rollout": '''\
def collect_rollout(env, policy, value, obs, num_steps):
    """Run the policy for num_steps steps of one gymnasium env (wrapped in RecordEpisodeStatistics).

    Returns a dict of [num_steps] tensors (obs is [num_steps, 4]): obs, actions, logp, rewards, values,
    next_values, terminated, truncated; plus last_obs (where the next rollout starts) and
    episode_returns (the returns of the episodes that ended, in order).
    """
    def as_obs(x):
        return torch.as_tensor(np.asarray(x), dtype=torch.float32)

    obs_l, act_l, logp_l, rew_l, val_l, term_l, trunc_l = [], [], [], [], [], [], []
    final_values = {}                # step -> V(final observation) at the steps where an episode ended
    episode_returns = []
    with torch.no_grad():
        for t in range(num_steps):
            o = as_obs(obs)
            logp_all = torch.log_softmax(policy(o[None])[0], dim=-1)
            a = int(torch.multinomial(logp_all.exp(), 1))
            logp_l.append(float(logp_all[a]))
            val_l.append(float(value(o[None]).reshape(-1)[0]))
            act_l.append(a)
            obs, r, term, trunc, info = env.step(a)
            obs_l.append(as_obs(obs))
            rew_l.append(float(r))
            term_l.append(bool(term))
            trunc_l.append(bool(trunc))
            if term or trunc:
                final_values[t] = float(value(as_obs(obs)[None]).reshape(-1)[0])
                episode_returns.append(float(np.asarray(info["episode"]["r"]).reshape(-1)[0]))
                obs, _ = env.reset()
        last_value = float(value(as_obs(obs)[None]).reshape(-1)[0])
    next_values = [final_values.get(t, val_l[t + 1] if t + 1 < num_steps else last_value) for t in range(num_steps)]
    return {"obs": torch.stack(obs_l), "actions": torch.tensor(act_l), "logp": torch.tensor(logp_l),
            "rewards": torch.tensor(rew_l), "values": torch.tensor(val_l), "next_values": torch.tensor(next_values),
            "terminated": torch.tensor(term_l), "truncated": torch.tensor(trunc_l), "last_obs": obs,
            "episode_returns": episode_returns}
''',
    "gae_advantages": '''\
def gae_advantages(rewards, values, next_values, terminated, truncated, gamma, lam):
    """GAE(gamma, lam) along dim 0: delta_t = r_t + gamma V(s_{t+1}) - V(s_t), A_t = delta_t + gamma lam A_{t+1}."""
    bootstrap = 1.0 - truncated.to(rewards.dtype)      # no value after an episode that was cut off
    carry = 1.0 - terminated.to(rewards.dtype)         # the trace stops where the episode stops
    delta = rewards + gamma * bootstrap * next_values - values
    adv = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = delta[t] + gamma * lam * carry[t] * running
        adv[t] = running
    return adv
''',
    "ppo_update": '''\
def ppo_update(policy, value, optimizer, batch, advantages, returns, epochs=20, eps=0.2, vf_coef=0.5,
               max_grad_norm=0.5):
    """epochs full-batch PPO-clip steps on one rollout; returns the mean losses and the clip fraction."""
    obs, actions = batch["obs"], batch["actions"]
    adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    stats = {"policy_loss": 0.0, "value_loss": 0.0, "clip_frac": 0.0}
    for _ in range(epochs):
        with torch.no_grad():        # the log-probabilities before this step: the "old" policy of the ratio
            logp_old = torch.log_softmax(policy(obs), dim=-1).gather(-1, actions[:, None]).squeeze(-1)
        logp = torch.log_softmax(policy(obs), dim=-1).gather(-1, actions[:, None]).squeeze(-1)
        ratio = torch.exp(logp - logp_old)
        clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps)
        policy_loss = -torch.min(ratio * adv, clipped * adv).mean()
        value_loss = ((value(obs).reshape(-1) - returns) ** 2).mean()
        optimizer.zero_grad()
        (policy_loss + vf_coef * value_loss).backward()
        nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        stats["policy_loss"] += policy_loss.item() / epochs
        stats["value_loss"] += value_loss.item() / epochs
        stats["clip_frac"] += ((ratio.detach() - 1.0).abs() > eps).float().mean().item() / epochs
    return stats
''',
}

#: The training loop the skeleton runs around the three answer cells.
TRAIN_SOURCE = '''\
def train(seed=0, total_steps=10_000, lam=0.8, gamma=0.98, num_steps=256, epochs=20, lr=2e-3, eps=0.2,
          vf_coef=0.5):
    """PPO on CartPole-v1 with collect_rollout, gae_advantages and ppo_update; returns (policy, history)."""
    import gymnasium as gym

    torch.manual_seed(seed)
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))
    obs, _ = env.reset(seed=seed)

    def mlp(n_out):
        return nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_out))

    policy, value = mlp(2), mlp(1)
    optimizer = torch.optim.Adam([*policy.parameters(), *value.parameters()], lr=lr, eps=1e-5)
    iters = max(1, total_steps // num_steps)
    history = {"steps": [], "episode_returns": [], "episode_end_steps": [], "clip_frac": [], "value_loss": [],
               "mean_value": []}
    for it in range(iters):
        frac = 1.0 - it / iters                          # anneal the learning rate and the clip range
        for group in optimizer.param_groups:
            group["lr"] = lr * frac
        batch = collect_rollout(env, policy, value, obs, num_steps)
        obs = batch["last_obs"]
        adv = gae_advantages(batch["rewards"], batch["values"], batch["next_values"], batch["terminated"],
                             batch["truncated"], gamma, lam)
        stats = ppo_update(policy, value, optimizer, batch, adv, adv + batch["values"], epochs, eps * frac, vf_coef)
        steps = (it + 1) * num_steps
        history["steps"].append(steps)
        history["clip_frac"].append(stats["clip_frac"])
        history["value_loss"].append(stats["value_loss"])
        history["mean_value"].append(float(batch["values"].mean()))
        history["episode_returns"].extend(batch["episode_returns"])
        history["episode_end_steps"].extend([steps] * len(batch["episode_returns"]))
    env.close()
    return policy, history
'''


def shipped() -> dict:
    """A fresh namespace with the shipped (buggy) functions and ``train``, as the notebook defines them."""
    ns: dict = {"__name__": "ps5_shipped"}
    exec(compile(ANSWER_PREAMBLE + "".join(SHIPPED_SOURCE.values()) + TRAIN_SOURCE, "<ps5 shipped>", "exec"), ns)
    return ns


def _separates(diag: str, fn: str):
    def test(ns):
        diagnose = ns[diag]
        if fn not in ns:
            raise AssertionError(f"{fn} is not defined: the diagnostic is run on your fixed {fn}")
        try:
            diagnose(shipped()[fn])
        except NotImplementedError:
            raise
        except AssertionError:
            pass
        else:
            raise AssertionError(f"{diag} did not raise AssertionError on the shipped {fn}: it does not expose the bug")
        try:
            diagnose(ns[fn])
        except AssertionError as err:
            raise AssertionError(f"{diag} also fails on your fixed {fn} ({err}): either the fix or the diagnostic "
                                 "is wrong") from None
    return test


#: Problem set 5 (the bug hunt), with its tasks, visible tests and points, registered under ``"ps5"``.
PS5 = register_problem_set(ProblemSet(
    key="ps5",
    title="Bug hunt: three silent bugs in a PPO trainer",
    chapters=(1, 2, 4, 5),
    notebook="lessons/problem_sets/ps5_bug_hunt.ipynb",
    tasks=("collect_rollout", "gae_advantages", "ppo_update", "diagnose_rollout", "diagnose_gae", "diagnose_update"),
    visible=(
        Test("diagnose_rollout_separates", "diagnose_rollout", 4, _separates("diagnose_rollout", "collect_rollout")),
        Test("diagnose_gae_separates", "diagnose_gae", 4, _separates("diagnose_gae", "gae_advantages")),
        Test("diagnose_update_separates", "diagnose_update", 4, _separates("diagnose_update", "ppo_update")),
    ),
    written_points=36.0,
))
