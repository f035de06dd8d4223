"""Recorded histories of every LLM trainer, so a refactor of the training loop can be checked to the last bit.

Each case below is a short run (2-3 updates) of one trainer, through its public name, with every switch
that changes what the loop does. What is kept of a run: every logged key of ``history`` and ``evals``,
a few scalar extras (a multiplier's final value, probe estimates), and a SHA-256 of the trained weights
(and of a critic's, where there is one). Floats are stored with ``float.hex``, so equality is bitwise.

Record (only on purpose, after a deliberate change of numbers; say which in the commit)::

    python tests/golden_histories.py --record

``tests/test_trainer_golden.py`` runs the same cases in a subprocess with the same environment (one
thread, ATen's default kernels, MKL's compatible code path), so that the numbers depend on as little
of the CPU as possible, and compares. The recording machine's CPU is stored with the numbers.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from rlkit.robustness import cpu_model

DATA = Path(__file__).resolve().parent / "data" / "trainer_histories.json"
ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _digest(module) -> str:
    import torch
    h = hashlib.sha256()
    for name, p in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


def _enc(x):
    """JSON-able, bit-exact: floats as hex strings, containers recursively."""
    import numpy as np
    import torch
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int | np.integer):
        return int(x)
    if isinstance(x, float | np.floating):
        return float(x).hex()
    if isinstance(x, torch.Tensor):
        return _enc(x.tolist())
    if isinstance(x, np.ndarray):
        return _enc(x.tolist())
    if isinstance(x, dict):
        return {str(k): _enc(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_enc(v) for v in x]
    return repr(type(x).__name__)


def _pretrained():
    from rlkit.llm import load_pretrained
    return load_pretrained()


def _common(res, extras=None):
    out = {"history": _enc(dict(res.history)), "evals": _enc(dict(getattr(res, "evals", {}) or {})),
           "model": _digest(res.model) if getattr(res, "model", None) is not None else None}
    critic = getattr(res, "critic", None)
    if critic is not None:
        out["critic"] = _digest(critic)
    if extras:
        out["extras"] = _enc(extras)
    return out


def _strip_time(d: dict) -> dict:
    for part in ("history", "evals"):
        d.get(part, {}).pop("train_seconds", None)
        d.get(part, {}).pop("seconds", None)
    return d


# ----------------------------------------------------------------------------------------------- cases
SMALL = dict(steps=2, prompts_per_step=4, group_size=4, eval_every=1, eval_problems=16, seed=0)


def _train_parts(kw: dict) -> dict:
    """rlkit 0.2's RLConfig shorthands (as the cases were recorded) as the 0.3 components, in the same order."""
    from rlkit.llm.advantages import TokenGAE
    from rlkit.llm.trainer import DenseRewards, KLPenalty
    hooks, gae = [], {}
    kl = {k: kw.pop(k) for k in ("kl_coef", "kl_estimator", "kl_in", "log_kl") if k in kw}
    if kl.get("kl_coef", 0) > 0 or kl.get("log_kl"):
        hooks.append(KLPenalty(kl.get("kl_coef", 0.0), kl.get("kl_estimator", "k3"), kl.get("kl_in", "loss")))
    if kw.pop("token_rewards", False):
        hooks.append(DenseRewards())
    for old, new in (("gamma", "gamma"), ("lam", "lam"), ("value_target", "target"), ("value_nstep", "n"),
                     ("value_lam", "target_lam")):
        if old in kw:
            gae[new] = kw.pop(old)
    out = {"hooks": hooks} if hooks else {}
    if gae:
        out["advantages"] = TokenGAE(**gae)
    return out


def case_train(algo, **kw):
    def run():
        from rlkit.llm import ADDITION, RLConfig, train
        model, tok = _pretrained()
        extra, rest = {}, dict(kw)
        if rest.pop("_shield", False):
            from rlkit.llm.safety import substring_shield
            extra["logits_processor"] = substring_shield(tok, ["13"])
        extra.update(_train_parts(rest))
        res = train(model, tok, ADDITION, RLConfig(algo=algo, **{**SMALL, **rest}), **extra)
        return _common(res, {"samples": [s[2] for s in res.samples]})
    return run


def LagDistribution_uniform(n):
    from rlkit.staleness import LagDistribution
    return LagDistribution.uniform(n)


def case_stale(**kw):
    def run():
        from rlkit.llm import ADDITION, RLConfig
        from rlkit.llm.stale import train_stale_grpo
        from rlkit.staleness import StaleTrainingConfig
        model, tok = _pretrained()
        algo = kw.pop("_algo", "grpo")
        res = train_stale_grpo(model, tok, ADDITION, RLConfig(algo=algo, **{**SMALL, "steps": 3}),
                               StaleTrainingConfig(**kw))
        return _common(res)
    return run


def case_lagged(**kw):
    def run():
        from rlkit.llm import ADDITION, RLConfig
        from rlkit.llm.lagged import LaggedConfig, train_lagged
        from rlkit.staleness import LagDistribution
        model, tok = _pretrained()
        cfg = RLConfig(algo="ppo", **{**SMALL, "steps": 3})                 # LaggedConfig.lam is 1 by default
        lag = LaggedConfig(lag=LagDistribution.uniform(2), probe_every=2, probe_rows=4, probe_continuations=4, **kw)
        res = train_lagged(model, tok, ADDITION, cfg, lag)
        return _common(res, {"probes": res.probes, "target_errors": res.target_errors("vtrace(1)")})
    return run


def case_lagged_pool():
    from rlkit.distributed import ActorPool
    from rlkit.llm import ADDITION, RLConfig
    from rlkit.llm.actors import GroupSampler, tiny_llm
    from rlkit.llm.lagged import LaggedConfig, train_lagged
    model, tok = _pretrained()
    cfg = RLConfig(algo="ppo", steps=3, prompts_per_step=3, group_size=4, minibatches=1, eval_every=3,
                   eval_problems=16, seed=0)
    with ActorPool(tiny_llm, GroupSampler("addition", group_size=4, prompts=1), n_actors=2, backend="simulated",
                   seed=0, lags=2) as pool:
        res = train_lagged(model, tok, ADDITION, cfg, LaggedConfig(target="vtrace"), pool=pool)
    return _common(res, {"consumed": [list(c[1:]) if isinstance(c, tuple) else c for c in res.consumed]})


def case_explore(**kw):
    def run():
        from rlkit.llm import RLConfig
        from rlkit.llm.explore import FACTS, ExploreConfig, facts_format, train_explore
        model, tok = _pretrained()
        cfg = RLConfig(algo="grpo", steps=2, prompts_per_step=2, group_size=4, lr=1e-4)
        res = train_explore(model, tok, FACTS, cfg, ExploreConfig(**kw), logits_processor=facts_format(tok))
        return _common(res)
    return run


def case_constrained(mult, **kw):
    def run():
        from rlkit.llm import RLConfig
        from rlkit.llm.safety import FORBIDDEN_ADDITION, substring_shield, train_constrained
        from rlkit.safety import LagrangeMultiplier, PIDLagrangian
        model, tok = _pretrained()
        m = {"lagrange": lambda: LagrangeMultiplier(budget=0.0, lr=1.0, init=0.5),
             "pid": lambda: PIDLagrangian(0.05, kp=1.0, ki=0.5), "fixed": lambda: 2.0}[mult]()
        extra, rest = {}, dict(kw)
        if rest.pop("_shield", False):
            extra["logits_processor"] = substring_shield(tok, ["13"])
        if "kl_coef" in rest:
            from rlkit.llm.trainer import KLPenalty
            extra["kl"] = KLPenalty(rest.pop("kl_coef"))
        cfg = RLConfig(algo="ppo", steps=3, prompts_per_step=4, group_size=2, minibatches=1, lr=3e-4, **rest)
        res = train_constrained(model, tok, FORBIDDEN_ADDITION, cfg, multiplier=m, **extra)
        return _common(res, {"lam": getattr(res, "lam", None)})
    return run


def case_recipe(**kw):
    def run():
        from rlkit.llm import RLConfig
        from rlkit.llm.recipe import RecipeConfig, forbidden_addition, train_recipe
        model, tok = _pretrained()
        cfg = RLConfig(algo="ppo", steps=3, prompts_per_step=4, group_size=4, lr=2e-4, seed=0)
        res = train_recipe(model, tok, forbidden_addition(), cfg, RecipeConfig(value_lr=1e-3, **kw))   # lam 1
        return _common(res, {"lam": res.lam})
    return run


def case_dro(method, **kw):
    def run():
        from rlkit.llm import RLConfig
        from rlkit.llm.dro import ADDITION_GROUPS, group_mixture, group_problems, train_dro
        model, tok = _pretrained()
        task = group_mixture(ADDITION_GROUPS, {"carry": 0.5, "no carry": 0.5})
        ev = {g: p[:8] for g, p in group_problems(ADDITION_GROUPS, 8).items()}
        # recorded with eval_every=1 in cfg, which train_dro never read (it evaluates at its own eval_every
        # argument, by default only at the end), and now refuses
        cfg = RLConfig(algo="dr_grpo", steps=2, prompts_per_step=4, group_size=2)
        res = train_dro(model, tok, task, cfg, method=method, eval_groups=ev, **kw)
        return _common(res, {"config": res.config, "group_weights": res.group_weights, "method": res.method})
    return run


def case_multiturn():
    import copy

    from rlkit.llm.multiturn import RETRY_ADDITION, MultiTurnConfig, train_multiturn
    model, tok = _pretrained()
    model = copy.deepcopy(model)
    cfg = MultiTurnConfig(gamma=0.5, steps=2, prompts_per_step=2, group_size=4, eval_every=1, format_bonus=0.1)
    res = train_multiturn(model, tok, RETRY_ADDITION, cfg, eval_set=RETRY_ADDITION.problems(8, seed=0, split="test"))
    return _common(res)


def case_executor(reward):
    def run():
        from rlkit.llm.hierarchy import THREE_TERM_ADDITION, HierarchyConfig, smallest_first_planner, train_executor
        model, tok = _pretrained()
        ev = THREE_TERM_ADDITION.problems(16, seed=5, split="test")
        cfg = HierarchyConfig(steps=2, prompts_per_step=2, group_size=4, eval_every=1, seed=3, reward=reward)
        res = train_executor(model, tok, THREE_TERM_ADDITION, smallest_first_planner, cfg, eval_problems=ev)
        return _common(res)
    return run


CASES = {
    "train/grpo": case_train("grpo"),
    "train/grpo-kl-loss-k3": case_train("grpo", kl_coef=0.05),
    "train/grpo-kl-reward-k1": case_train("grpo", kl_coef=0.05, kl_in="reward", kl_estimator="k1"),
    "train/grpo-logkl-temp": case_train("grpo", log_kl=True, temperature=0.8),
    "train/grpo-shield": case_train("grpo", _shield=True),
    "train/grpo-topk": case_train("grpo", top_k=5, epochs=2),
    "train/reinforce": case_train("reinforce"),
    "train/rloo": case_train("rloo"),
    "train/dr_grpo": case_train("dr_grpo"),
    "train/dapo": case_train("dapo"),
    "train/gspo": case_train("gspo"),
    "train/ppo": case_train("ppo"),
    "train/ppo-kl-reward": case_train("ppo", kl_coef=0.05, kl_in="reward", kl_estimator="k1"),
    "train/ppo-dense-nstep": case_train("ppo", token_rewards=True, value_target="nstep", value_nstep=2,
                                        ),
    "train/ppo-lambda-target": case_train("ppo", value_target="lambda", value_lam=0.5, gamma=0.9),
    "train/grpo-dense": case_train("grpo", token_rewards=True),
    "stale/adaptive-lag1": case_stale(method="adaptive", lag=1, eps_stale=0.5),
    "stale/standard-lag2": case_stale(method="standard", lag=2),
    "stale/decoupled-geppo": case_stale(method="decoupled", lag=2, clip_schedule="geppo"),
    "stale/window-filter": case_stale(method="decoupled", lag=LagDistribution_uniform(2), version_window=2,
                                      behav_clip=2.0, filter_level="sequence"),
    "stale/dr_grpo-age": case_stale(_algo="dr_grpo", method="adaptive", lag=2, clip_schedule="age"),
    "lagged/none-v": case_lagged(target="none", critic="v"),
    "lagged/vtrace-q": case_lagged(target="vtrace", critic="q"),
    "lagged/retrace-q": case_lagged(target="retrace", critic="q"),
    "lagged/vtrace-decoupled": case_lagged(target="vtrace", critic="q", method="decoupled", normalize=False),
    "lagged/pool": case_lagged_pool,
    "explore/all": case_explore(entropy_coef=0.01, diversity_coef=0.5, rnd_coef=0.3),
    "explore/none": case_explore(),
    "explore/div-all-kl": case_explore(diversity_coef=0.5, diversity_all=True, kl_coef=0.1),   # k1 in the reward
    "constrained/lagrange": case_constrained("lagrange"),
    "constrained/pid-shield-kl": case_constrained("pid", kl_coef=0.05, _shield=True),
    "constrained/fixed": case_constrained("fixed"),
    "recipe/full": case_recipe(lag=2, judges=("prefix", "contains", "close1"), alpha=2.0, cost_limit=0.0,
                               lambda_lr=1.0),
    "recipe/shield-no-lagrangian": case_recipe(shield=True, lagrangian=False),
    "recipe/no-vtrace": case_recipe(lag=2, vtrace=False),
    "dro/erm": case_dro("erm"),
    "dro/group": case_dro("group", step_size=1.0),
    "dro/kl": case_dro("kl", eps=0.5),
    "dro/cvar": case_dro("cvar", alpha=0.25),
    "multiturn": case_multiturn,
    "executor/subgoal": case_executor("subgoal"),
    "executor/final": case_executor("final"),
}


def run_cases(names=None) -> dict:
    import torch
    torch.set_num_threads(1)
    out = {}
    for name, fn in CASES.items():
        if names and name not in names:
            continue
        try:
            out[name] = _strip_time(fn())
        except Exception as e:                               # a case that errors is recorded as the error
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help=f"write {DATA.relative_to(Path.cwd()) if False else DATA}")
    ap.add_argument("--out", help="write the histories of this run here (JSON)")
    ap.add_argument("cases", nargs="*")
    a = ap.parse_args(argv)
    for k, v in ENV.items():
        if os.environ.get(k) != v:
            raise SystemExit(f"run with {k}={v} (the test's environment); see the module docstring")
    got = run_cases(a.cases)
    doc = {"cpu": cpu_model(), "torch": __import__("torch").__version__, "cases": got}
    if a.record:
        DATA.parent.mkdir(parents=True, exist_ok=True)
        DATA.write_text(json.dumps(doc, indent=0, sort_keys=True) + "\n")
    if a.out:
        Path(a.out).write_text(json.dumps(doc, sort_keys=True))
    bad = [k for k, v in got.items() if "error" in v]
    print(f"{len(got)} cases, {len(bad)} errors: {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
