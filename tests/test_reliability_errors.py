"""Errors that name the caller's argument, and bad values that are refused instead of accepted (reliability
review of rlkit 0.2, sections 1.2, 2.3 and 3; issue 20).

Two parts:

* the review's reproducers, one test each (the 38 staleness messages that named the inner helper's
  ``logp_a``/``logp_b``, the persisting unclear errors, the new ones, the NaN-returning checker, the
  deferred acceptances);
* a sweep over the public functions of ``rlkit.staleness``, ``rlkit.estimators``, ``rlkit.tabular``,
  ``rlkit.controllers``, ``rlkit.llm.rl`` and ``rlkit.llm.sampling``: every tensor argument is replaced in
  turn by a Python list, a tensor of the wrong dtype and a tensor of the wrong shape, and the call must
  raise ``TypeError``/``ValueError`` whose message names that argument. A few replacements are valid
  input by design (a 0/1 mask of any real dtype, an argument of any shape); each is listed with its reason.
"""
import math
import random
import re

import numpy as np
import pytest
import torch

import rlkit.tabular as T
from rlkit import estimators as E
from rlkit import staleness as S
from rlkit.algos import PPOConfig, train_ppo
from rlkit.controllers import AdaptiveKLController, KLLearningRateController, KLTriggeredLR
from rlkit.llm import GPT, CharTokenizer, GPTConfig, Problem, RLConfig, Task, train
from rlkit.llm import rl as L
from rlkit.llm import sampling as SA
from rlkit.llm.dro import group_mixture
from rlkit.llm.hierarchy import Option, SubGoal, run_plan, smallest_first_planner
from rlkit.llm.multiturn import RetryTask
from rlkit.llm.tasks import ADDITION, addition_problem
from rlkit.nets import CategoricalPolicy
from rlkit.rollout import RolloutCollector, make_vec_env, sample_episodes

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------------ the sweep

def names(message: str, arg: str) -> bool:
    """Whether ``message`` names ``arg`` as a word (``pi`` is not found in ``pi_old``)."""
    return re.search(rf"(?<![\w]){re.escape(arg)}(?![\w])", message) is not None


def mutations(x: torch.Tensor, nan: bool = False):
    """``(kind, bad value)``: a list, the wrong dtype, the wrong shape (and a NaN entry)."""
    yield "list", x.tolist()
    yield "dtype", x.float() if (x.dtype == torch.bool or not x.is_floating_point()) else x.long()
    yield "shape", torch.cat([x, x[:1]]) if x.dim() and x.shape[0] else x[None]
    if nan and x.is_floating_point() and x.numel():
        y = x.clone()
        y.view(-1)[0] = math.nan
        yield "nan", y


def assert_sweep_clean(name: str, problems: list[str]) -> None:
    assert problems == [], name


def sweep(fn, args: dict, valid: dict = (), nan: bool = False) -> list[str]:
    """Call ``fn(**args)`` with each tensor argument mutated; return what went wrong.

    ``valid`` maps ``(arg, kind)`` to the reason that mutation is valid input (the call may succeed). A NaN
    entry may propagate (NaN in, NaN out); if the call refuses it, the message must name the argument.
    """
    fn(**args)                                   # the unmutated call is valid
    problems = []
    for arg, value in args.items():
        if not isinstance(value, torch.Tensor):
            continue
        for kind, bad in mutations(value, nan):
            if (arg, kind) in dict(valid):
                continue
            try:
                fn(**{**args, arg: bad})
            except (TypeError, ValueError) as e:
                if not names(str(e), arg):
                    problems.append(f"{arg}={kind}: {type(e).__name__} does not name {arg}: {e}")
                continue
            except Exception as e:                # noqa: BLE001 - a raw error is what the sweep looks for
                problems.append(f"{arg}={kind}: raw {type(e).__name__}: {e}")
                continue
            if kind != "nan":
                problems.append(f"{arg}={kind}: accepted")
    return problems


MASK_DTYPE = "a mask is bool or 0/1 of any real dtype"
ANY_SHAPE = "any shape is valid here"


# ------------------------------------------------------------------------------------- rlkit.staleness

def _staleness_cases():
    g = torch.Generator().manual_seed(0)
    lp = [torch.log_softmax(torch.randn(4, 3, generator=g, dtype=torch.float64), -1)[:, 0] for _ in range(3)]
    mask = torch.tensor([True, True, False, True])
    ages = torch.tensor([0, 1, 1, 2])
    arch = S.PolicyArchive(3)
    for v in range(3):
        arch.push(v, torch.nn.Linear(1, 1))

    def put(version, logp, obs):
        S.VersionedBuffer().put(version, logp, obs=obs)

    return {
        "half_abs_ratio_diff": (S.half_abs_ratio_diff, dict(logp_a=lp[0], logp_b=lp[1], logp_behav=lp[2], mask=mask),
                                {("mask", "dtype"): MASK_DTYPE}),
        "update_shift": (S.update_shift, dict(logp_new=lp[0], logp_prox=lp[1], logp_behav=lp[2], mask=mask),
                         {("mask", "dtype"): MASK_DTYPE}),
        "staleness": (S.staleness, dict(logp_prox=lp[1], logp_behav=lp[2], mask=mask),
                      {("mask", "dtype"): MASK_DTYPE}),
        "staleness_filter": (S.staleness_filter, dict(logp_prox=lp[1], logp_behav=lp[2], eps_stale=0.5, mask=mask),
                             {("mask", "dtype"): MASK_DTYPE}),
        "version_window": (S.version_window, dict(versions=ages, current=3, window=2),
                           {("versions", "shape"): ANY_SHAPE}),
        "age_clip_radius": (S.age_clip_radius, dict(eps=0.2, ages=ages),
                            {("ages", "shape"): ANY_SHAPE, ("ages", "dtype"): "integer or float ages"}),
        "mean_by_age": (S.mean_by_age, dict(values=lp[0], ages=ages, mask=mask), {("mask", "dtype"): MASK_DTYPE}),
        "geppo_clip_radius": (S.geppo_clip_radius, dict(eps=0.2, version_weights=torch.tensor([0.5, 0.25, 0.25])),
                              {("version_weights", "list"): "a list of weights is documented input",
                               ("version_weights", "dtype"): "integer weights are numbers too"}),
        "PolicyArchive.behaviour_versions": (arch.behaviour_versions, dict(current=2, lags=ages),
                                             {("lags", "shape"): ANY_SHAPE}),
        "VersionedBuffer.put": (put, dict(version=ages, logp=lp[0], obs=torch.zeros(4, 2)),
                                {("obs", "dtype"): "a field may have any dtype"}),
    }


STALENESS = _staleness_cases()


@pytest.mark.parametrize("name", sorted(STALENESS))
def test_staleness_errors_name_the_callers_argument(name):
    # review 1.2: update_shift(logp_new=int64) said "logp_a must have a floating dtype" (36 such messages)
    fn, args, valid = STALENESS[name]
    assert sweep(fn, args, valid, nan=True) == []


def test_update_shift_and_staleness_never_name_the_inner_helpers_arguments():
    x = torch.zeros(4)
    bad_logp = (x.long(), torch.zeros(5), [0.0] * 4, torch.ones(4, dtype=torch.bool), x.double())
    bad_mask = (torch.zeros(5), [1.0] * 4, torch.full((4,), 2.0))
    calls = [(lambda a: S.update_shift(a, x, x), bad_logp), (lambda a: S.update_shift(x, a, x), bad_logp),
             (lambda a: S.staleness(a, x), bad_logp), (lambda a: S.staleness(x, a), bad_logp),
             (lambda a: S.update_shift(x, x, x, mask=a), bad_mask), (lambda a: S.staleness(x, x, mask=a), bad_mask)]
    for call, bads in calls:
        for bad in bads:
            with pytest.raises((TypeError, ValueError)) as e:
                call(bad)
            assert not names(str(e.value), "logp_a") and not names(str(e.value), "logp_b"), str(e.value)
    with pytest.raises(TypeError, match=r"^logp_new must have a floating dtype"):
        S.update_shift(x.long(), x, x)
    with pytest.raises(ValueError, match=r"^mask has shape \(5,\) but must have the shape of logp_prox"):
        S.staleness(x, x, mask=torch.ones(5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^dim must be an int in \[-1, 0\], got 1"):
        S.update_shift(x, x, x, dim=1)


def test_versioned_buffer_refuses_a_field_of_another_shape_at_put():
    # review 1.2: the second put was accepted and take() ended in torch.cat's raw RuntimeError
    buf = S.VersionedBuffer()
    buf.put(0, torch.zeros(3), obs=torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"^obs has shape \[n, 5\].*earlier puts stored \[n, 2\]"):
        buf.put(1, torch.zeros(3), obs=torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"^logp has shape \[n, 4\]"):
        buf.put(1, torch.zeros(3, 4), obs=torch.zeros(3, 2))
    buf.put(1, torch.ones(2), obs=torch.ones(2, 2))           # the buffer is intact: both good puts come back
    out = buf.take(1)
    assert out["obs"].tolist() == [[0.0, 0.0]] * 3 + [[1.0, 1.0]] * 2
    assert out["version"].tolist() == [0, 0, 0, 1, 1]


@pytest.mark.parametrize("bad", ["0.3", None, [0.3], torch.ones(2)])
def test_monitor_update_refuses_a_metric_that_is_not_a_number_and_records_nothing(bad):
    # review 1.2 (2 probes): float(v) raised "could not convert string to float" / "only one element tensors"
    mon = S.Monitor([S.Threshold("kl", max=0.1)])
    mon.update(0, kl=0.05, loss=1.0)
    with pytest.raises(TypeError, match=r"^Monitor.update: the metric kl must be a real number"):
        mon.update(1, kl=bad, loss=2.0)
    assert mon.steps == [0] and mon.history == {"kl": [0.05], "loss": [1.0]}
    assert mon.update(1, kl=torch.tensor(math.nan), loss=np.float32(2.0))[0].metric == "kl"   # NaN: a violation
    assert mon.history["loss"] == [1.0, 2.0]


# ------------------------------------------------------------------------------------ rlkit.estimators

def _estimator_cases():
    g = torch.Generator().manual_seed(1)
    pol = CategoricalPolicy(4, 3, hidden=(8,))
    return {
        "effective_sample_size": (E.effective_sample_size,
                                  dict(log_weights=torch.randn(2, 5, generator=g),
                                       mask=torch.ones(2, 5, dtype=torch.bool)),
                                  {("mask", "dtype"): MASK_DTYPE, ("log_weights", "shape"): "any batch shape"}),
        "effective_sample_size(weights=)": (E.effective_sample_size,
                                            dict(weights=torch.rand(2, 5, generator=g)),
                                            {("weights", "shape"): "any batch shape"}),
        "importance_weight_variance": (E.importance_weight_variance,
                                       dict(logits_p=torch.randn(3, 4, generator=g),
                                            logits_q=torch.randn(3, 4, generator=g)),
                                       {}),
        "score_sums": (E.score_sums, dict(policy=pol, obs=torch.randn(2, 3, 4, generator=g),
                                          actions=torch.tensor([[0, 1, 2], [2, 1, 0]]),
                                          weights=torch.randn(2, 3, 2, generator=g),
                                          mask=torch.tensor([[True, True, False], [True, True, True]])),
                       {("mask", "dtype"): MASK_DTYPE}),
        "trace_covariance": (E.trace_covariance, dict(samples=torch.randn(5, 3, generator=g)),
                             {("samples", "shape"): "any M >= 2 samples"}),
        "gradient_bias_variance": (E.gradient_bias_variance,
                                   dict(estimates=torch.randn(5, 3, generator=g), reference=torch.randn(3, generator=g),
                                        mean=torch.randn(3, generator=g), mean_noise=0.1),
                                   {("estimates", "shape"): "any M >= 2 estimates"}),
    }


ESTIMATORS = _estimator_cases()


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_estimators_errors_name_the_argument(name):
    fn, args, valid = ESTIMATORS[name]
    assert_sweep_clean(name, sweep(fn, args, valid))


def test_score_sums_refuses_an_action_out_of_range():
    # review 1.2: a raw "index 9 is out of bounds for dimension 2 with size 3" from gather
    pol = CategoricalPolicy(4, 3, hidden=(8,))
    obs, w = torch.randn(2, 3, 4), torch.ones(2, 3, 1)
    for bad in (9, -1, 3):
        actions = torch.tensor([[0, 1, 2], [1, 1, bad]])
        with pytest.raises(ValueError, match=r"^actions must lie in \[0, 3\)"):
            E.score_sums(pol, obs, actions, w)


# -------------------------------------------------------------------------------------- rlkit.tabular

def _tabular_cases():
    g = torch.Generator().manual_seed(2)
    B, S_, A, M, H = 2, 3, 2, 2, 3
    mdp = T.random_mdp(B, S_, A, generator=g)
    pi, mu = T.random_policy(B, S_, A, generator=g), T.random_policy(B, S_, A, generator=g)
    policies = T.random_policy((B, M), S_, A, generator=g)
    alpha, kernel = torch.tensor([0.5, 0.5], dtype=torch.float64), T.trajectory_kernel(M)
    fh = T.random_finite_horizon_mdp(B, H, S_, A, generator=g)
    fpi, fmu = T.random_policy((B, H), S_, A, generator=g), T.random_policy((B, H), S_, A, generator=g)
    adv = T.advantage(mdp, pi)
    traces = T.trace_table("retrace", pi, mu)
    X, Vo = 2, 2
    c = {
        "FiniteMDP": (T.FiniteMDP, dict(P=mdp.P, R=mdp.R, rho0=mdp.rho0, gamma=mdp.gamma),
                      {("gamma", "dtype"): "gamma may be any real tensor"}),
        "perturb_policy": (T.perturb_policy, dict(pi=pi, step=torch.tensor([0.1, 0.2], dtype=torch.float64)),
                           {("pi", "shape"): "any batch of policies",
                            ("step", "dtype"): "step may be any real tensor"}),
        "contextual_bandit": (T.contextual_bandit, dict(rho0=mdp.rho0, R=mdp.R), {}),
        "softmax_step": (T.softmax_step, dict(pi=pi, adv=adv, step=torch.tensor([0.1, 0.2], dtype=torch.float64)),
                         {("step", "dtype"): "step may be any real tensor"}),
        "tv_distance": (T.tv_distance, dict(p=pi, q=mu), {}),
        "expected_advantage": (T.expected_advantage, dict(pi_new=pi, adv=adv), {}),
        "surrogate": (T.surrogate, dict(d_old=T.visitation(mdp, pi), pi_new=pi, adv_old=adv, gamma=mdp.gamma),
                      {("gamma", "dtype"): "gamma may be any real tensor"}),
        "step_kernel": (T.step_kernel, dict(sigma=torch.tensor([[0.2, 0.3]] * B, dtype=torch.float64),
                                            kappa=kernel.expand(B, M, M).clone()), {}),
        "lift_policy": (T.lift_policy, dict(pi=pi, n_versions=M), {("pi", "shape"): "any batch of policies"}),
        "sample_state_actions": (lambda **k: T.sample_state_actions(**k, generator=torch.Generator().manual_seed(0)),
                                 dict(d=T.visitation(mdp, pi), behaviour=pi, n=4), {}),
        "token_mdp": (T.token_mdp, dict(prompt_probs=torch.tensor([[0.5, 0.5]] * B, dtype=torch.float64),
                                        R=torch.zeros(B, H, X * Vo ** (H - 1), Vo, dtype=torch.float64)), {}),
        "FiniteHorizonMDP": (T.FiniteHorizonMDP, dict(P=fh.P, R=fh.R, rho0=fh.rho0), {}),
        "tight_mixture_example": (T.tight_mixture_example,
                                  dict(old_switches=torch.tensor([0.0, 0.1], dtype=torch.float64)),
                                  {("old_switches", "shape"): "[M] or [B, M]: any M"}),
        "truncated_policy": (T.truncated_policy, dict(pi=pi, mu=mu, rho_bar=1.0), {}),
        "trace_table": (T.trace_table, dict(kind="retrace", pi=pi, mu=mu), {}),
    }
    for f in (T.policy_transition, T.policy_reward, T.value, T.q_value, T.advantage, T.performance, T.visitation):
        c[f.__name__] = (f, dict(mdp=mdp, pi=pi), {})
    c["q_value(V=)"] = (T.q_value, dict(mdp=mdp, pi=pi, V=T.value(mdp, pi)), {})
    for f in (T.performance_difference, T.single_policy_terms):
        c[f.__name__] = (f, dict(mdp=mdp, pi_old=pi, pi_new=mu), {})
    mix = dict(mdp=mdp, policies=policies, alpha=alpha)
    mixv = {("alpha", "shape"): "[M] or [*B, M]"}
    c["augment"] = (T.augment, dict(**mix, kernel=kernel), {**mixv, ("kernel", "shape"): "[M, M] or [*B, M, M]"})
    c["static_mixture_terms"] = (T.static_mixture_terms, dict(**mix, pi_new=mu), mixv)
    for f in (T.dynamic_mixture_terms, T.current_advantage_terms):
        c[f.__name__] = (f, dict(**mix, kernel=kernel, pi_old=pi, pi_new=mu),
                         {**mixv, ("kernel", "shape"): "[M, M] or [*B, M, M]"})
    c["estimate_update_and_staleness"] = (
        lambda **k: T.estimate_update_and_staleness(**k, generator=torch.Generator().manual_seed(0)),
        dict(**mix, kernel=kernel, pi_old=pi, pi_new=mu, n=8), {**mixv, ("kernel", "shape"): "[M, M] or [*B, M, M]"})
    for f in (T.finite_horizon_state_distributions, T.finite_horizon_values, T.finite_horizon_performance):
        c[f.__name__] = (f, dict(mdp=fh, pi=fpi), {})
    c["finite_horizon_terms"] = (T.finite_horizon_terms, dict(mdp=fh, pi_old=fpi, pi_new=fmu), {})
    for f in (T.vtrace_affine, T.vtrace_fixed_point):
        c[f.__name__] = (f, dict(mdp=mdp, pi=pi, mu=mu), {})
    for f in (T.q_trace_affine, T.q_trace_fixed_point):
        c[f.__name__] = (f, dict(mdp=mdp, pi=pi, mu=mu, traces=traces), {})
    return c


TABULAR = _tabular_cases()


@pytest.mark.parametrize("name", sorted(TABULAR))
def test_tabular_errors_name_the_argument(name):
    fn, args, valid = TABULAR[name]
    assert_sweep_clean(name, sweep(fn, args, valid))


@pytest.mark.parametrize("name", [n for n in sorted(TABULAR) if "mdp" in TABULAR[n][1]])
def test_tabular_names_an_mdp_of_the_wrong_type(name):
    fn, args, _ = TABULAR[name]
    with pytest.raises(TypeError, match=r"^mdp must be a rlkit.tabular.Finite(Horizon)?MDP, got dict"):
        fn(**{**args, "mdp": {"P": args["mdp"].P}})


@pytest.mark.parametrize("fn", [T.value, T.q_value, T.advantage, T.performance, T.visitation,
                                T.policy_transition, T.policy_reward])
def test_tabular_refuses_a_float32_policy_on_a_float64_mdp(fn):
    # review 1.2: value(float32 policy) ended in torch.linalg's "expected scalar type Float but found Double";
    # policy_reward computed silently in float64
    mdp = T.random_mdp(2, 3, 2, generator=torch.Generator().manual_seed(0))
    pi = T.random_policy(2, 3, 2, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"^pi has dtype torch.float32 but mdp.P has dtype torch.float64"):
        fn(mdp, pi.float())
    with pytest.raises(TypeError, match=r"^mdp must be a rlkit.tabular.FiniteMDP, got dict"):
        fn({"P": mdp.P}, pi)


# -------------------------------------------------------------------------------------- rlkit.controllers

@pytest.mark.parametrize("ctl", [AdaptiveKLController(), KLLearningRateController(), KLTriggeredLR()],
                         ids=lambda c: type(c).__name__)
def test_controllers_name_kl_and_the_knob(ctl):
    knob = ctl.knob
    value = 1.0 if knob == "beta" else 1e-3
    assert ctl(torch.tensor(0.01), torch.tensor(value)) > 0          # 0-dim tensors are numbers
    for kw, name in ((dict(kl=[0.01], value=value), "kl"), (dict(kl=torch.ones(2), value=value), "kl"),
                     (dict(kl=0.01, value=[value]), knob), (dict(kl=0.01, value=torch.ones(2)), knob),
                     (dict(kl=math.nan, value=value), "kl"), (dict(kl=0.01, value=-value), knob)):
        with pytest.raises((TypeError, ValueError)) as e:
            ctl(**kw)
        assert names(str(e.value), name), str(e.value)


# ------------------------------------------------------------------------------------------- rlkit.rollout

@pytest.fixture()
def collector():
    envs = make_vec_env("CartPole-v1", 2)
    yield RolloutCollector(envs, seed=0)
    envs.close()


def _act(actions=None, logp=None):
    return lambda obs: (torch.zeros(2, dtype=torch.long) if actions is None else actions,
                        torch.zeros(2) if logp is None else logp)


@pytest.mark.parametrize("act_fn, error, match", [
    (3, TypeError, r"^act_fn must be callable"),
    (lambda obs: torch.zeros(2, dtype=torch.long), TypeError, r"^act_fn must return a tuple \(actions \[2\], logp"),
    (lambda obs: (torch.zeros(2, dtype=torch.long),), TypeError, r"^act_fn must return a tuple"),
    (_act(actions=[0, 0]), TypeError, r"^the actions act_fn returned must be a torch.Tensor, got list"),
    (_act(actions=torch.zeros(3, dtype=torch.long)), ValueError, r"^act_fn must return actions .* got shape \(3,\)"),
    (_act(actions=torch.full((2,), 5)), ValueError, r"^act_fn returned actions that are not in the action space"),
    (_act(actions=torch.zeros(2)), ValueError, r"^act_fn returned actions that are not in the action space"),
    (_act(logp=[0.0, 0.0]), TypeError, r"^the log-probs act_fn returned must be a torch.Tensor"),
    (_act(logp=torch.zeros(3)), ValueError, r"^the log-probs act_fn returned must have shape \[num_envs\] = \(2,\)"),
])
def test_rollout_collector_names_what_act_fn_got_wrong(collector, act_fn, error, match):
    # review 1.2 (2 probes): raw IndexError / AssertionError from inside the step, or a wrong batch accepted
    with pytest.raises(error, match=match):
        collector.collect(act_fn, 3)
    with pytest.raises(error, match=match):
        collector.collect_episodes(act_fn)


@pytest.mark.parametrize("value_fn, error, match", [
    (3, TypeError, r"^value_fn must be callable"),
    (lambda obs: 3, TypeError, r"^the values value_fn returned must be a torch.Tensor"),
    (lambda obs: obs, ValueError, r"^the values value_fn returned must have shape \[num_envs, T\] = \(2, 3\)"),
])
def test_rollout_collector_checks_what_value_fn_returns(collector, value_fn, error, match):
    with pytest.raises(error, match=match):
        collector.collect(_act(), 3, value_fn=value_fn)


def test_rollout_collector_checks_its_own_arguments():
    envs = make_vec_env("CartPole-v1", 2)
    with pytest.raises(ValueError, match=r"^device='gpu' is not a device torch knows"):
        RolloutCollector(envs, device="gpu")
    with pytest.raises(TypeError, match=r"^seed must be an int, got str"):
        RolloutCollector(envs, seed="0")
    with pytest.raises(ValueError, match=r"^max_steps must be >= 1"):
        RolloutCollector(envs).collect_episodes(_act(), max_steps=0)
    envs.close()


def test_make_vec_env_names_an_unknown_id_and_a_constructor_that_returns_no_env():
    # review 1.2: gymnasium's NameNotFound; review 1.2 (new): AttributeError "'int' object has no attribute 'metadata'"
    with pytest.raises(ValueError, match=r"^env='NoSuchEnv-v0' is not a registered gymnasium id"):
        make_vec_env("NoSuchEnv-v0", 2)
    with pytest.raises(TypeError, match=r"^env must be .* the callable returned an object of type int"):
        make_vec_env(lambda: 3, 2)


@pytest.mark.parametrize("policy, error, match", [
    (lambda o: [0.0, 0.0], TypeError, r"^the logits policy returned must be a torch.Tensor"),
    (lambda o: torch.zeros(o.shape[0], 3), ValueError, r"^the logits policy returned must have shape \[num_envs, "
                                                         r"n_actions\] = \(4, 2\), got \(4, 3\)"),
    (lambda o: torch.zeros(o.shape[0], 2, dtype=torch.long), TypeError, r"^the logits policy returned must have a "
                                                                          r"floating dtype"),
    (lambda o: torch.full((o.shape[0], 2), math.nan), ValueError, r"^policy returned logits with NaN"),
])
def test_sample_episodes_checks_what_policy_returns(policy, error, match):
    # raw errors before: softmax's TypeError, gymnasium's AssertionError, multinomial's RuntimeError
    with pytest.raises(error, match=match):
        sample_episodes(policy, 4, 0, num_envs=4)
    with pytest.raises(TypeError, match=r"^the value make_env returned must be a gymnasium.vector.VectorEnv, got int"):
        sample_episodes(lambda o: torch.zeros(o.shape[0], 2), 4, 0, num_envs=4, make_env=lambda n: 3)


# ------------------------------------------------------------------------------------------- rlkit.algos

PPO_CFG = PPOConfig(total_steps=512, num_envs=4, num_steps=32, epochs=2)


def test_train_ppo_names_an_unknown_env_id_and_a_constructor_that_returns_no_env():
    with pytest.raises(ValueError, match=r"^env='NoSuchEnv-v0' is not a registered gymnasium id"):
        train_ppo("NoSuchEnv-v0", PPO_CFG, progress=False)
    with pytest.raises(TypeError, match=r"^env must be .* returned an object of type int"):
        train_ppo(lambda: 3, PPO_CFG, progress=False)


def test_train_ppo_refuses_an_unknown_device():
    # review 1.2 (new): a raw torch RuntimeError "Expected one of cpu, cuda, ... device type at start of device string"
    with pytest.raises(ValueError, match=r"^device='gpu' is not a device torch knows; "
                                         r"use one of \['cpu', 'cuda', 'mps'\]"):
        train_ppo("CartPole-v1", PPO_CFG, progress=False, device="gpu")
    with pytest.raises(TypeError, match=r"^device must be a torch.device"):
        train_ppo("CartPole-v1", PPO_CFG, progress=False, device=1.5)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"^device='cuda' but torch.cuda.is_available\(\) is False"):
            train_ppo("CartPole-v1", PPO_CFG, progress=False, device="cuda")


@pytest.mark.parametrize("lr", [-1e-3, 0.0, math.nan, math.inf, "1e-3"])
def test_train_ppo_refuses_a_learning_rate_from_lr_controller_that_is_not_positive_and_finite(lr):
    # review S8: lr_controller returning -1e-3 was applied (Adam ascends the loss); NaN made every weight NaN
    seen = []

    def ctl(kl, cur):
        seen.append(cur)
        return lr

    with pytest.raises((ValueError, TypeError), match=rf"^lr_controller returned {re.escape(repr(lr))}, but the next "
                                                      r"learning rate must be a finite number > 0"):
        train_ppo("CartPole-v1", PPO_CFG.replace(anneal_lr=False), progress=False, lr_controller=ctl)
    assert seen == [PPO_CFG.lr]                # refused after the first iteration, before any step with it


# ----------------------------------------------------------------------------------------- rlkit.llm

@pytest.fixture(scope="module")
def tok():
    return CharTokenizer()


@pytest.fixture(scope="module")
def gpt(tok):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16, block_size=16)).eval()


def _llm_rl_cases():
    g = torch.Generator().manual_seed(3)
    cfg = RLConfig(algo="grpo").resolved()
    lp = torch.log_softmax(torch.randn(2, 3, 4, generator=g), -1)[..., 0]
    return {
        "sequence_advantages": (L.sequence_advantages, dict(rewards=torch.tensor([1.0, 0, 0, 1, 1, 1, 0, 0]),
                                                            algo="grpo", group_size=4), {}),
        "sequence_advantages(reinforce)": (L.sequence_advantages, dict(rewards=torch.tensor([1.0, 0, 0, 1]),
                                                                       algo="reinforce", group_size=2),
                                           {("rewards", "shape"): "reinforce takes any batch"}),
        "policy_loss": (L.policy_loss, dict(cfg=cfg, logp=lp.requires_grad_(), logp_old=lp.detach() + 0.1,
                                            adv=torch.randn(2, 3, generator=g),
                                            mask=torch.tensor([[1.0, 1, 0], [1, 1, 1]])),
                        {("mask", "dtype"): MASK_DTYPE}),
        "policy_loss(gspo)": (L.policy_loss, dict(cfg=RLConfig(algo="gspo").resolved(), logp=lp, logp_old=lp + 0.1,
                                                  adv=torch.randn(2, 3, generator=g),
                                                  mask=torch.tensor([[1.0, 1, 0], [1, 1, 1]])),
                              {("mask", "dtype"): MASK_DTYPE}),
    }


LLM_RL = _llm_rl_cases()


@pytest.mark.parametrize("name", sorted(LLM_RL))
def test_llm_rl_errors_name_the_argument(name):
    fn, args, valid = LLM_RL[name]
    assert sweep(fn, args, valid) == []


@pytest.mark.parametrize("algo", ["reinforce", "rloo", "grpo", "dr_grpo", "dapo", "gspo"])
def test_sequence_advantages_names_integer_rewards(algo):
    # review 1.2: int rewards with reinforce ended in torch's "mean(): could not infer output dtype"
    with pytest.raises(TypeError, match=r"^rewards must have a floating dtype"):
        L.sequence_advantages(torch.tensor([1, 0, 1, 0]), algo, 2)
    with pytest.raises(ValueError, match=r"^algo must be one of"):
        L.sequence_advantages(torch.tensor([1.0, 0, 1, 0]), "ppo", 2)


def test_policy_loss_refuses_a_mask_that_would_broadcast():
    cfg = RLConfig(algo="gspo").resolved()
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"^mask has shape \(1, 3\) but must have the shape of logp"):
        L.policy_loss(cfg, lp, lp, lp, torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"^mask is required"):
        L.policy_loss(cfg, lp, lp, lp, None)


def test_collect_names_arguments_of_the_wrong_type(gpt, tok):
    cfg = RLConfig(algo="rloo", prompts_per_step=1, group_size=2)
    args = dict(model=gpt, tok=tok, task=ADDITION, cfg=cfg, rng=random.Random(0), generator=torch.Generator())
    L.collect(**args)
    for name, bad in (("task", "addition"), ("tok", None), ("cfg", {}), ("rng", 0)):
        with pytest.raises(TypeError, match=rf"^{name} must be"):
            L.collect(**{**args, name: bad})


def _sampling_cases(gpt, tok):
    ids, mask = tok.encode_batch(["1+2=", "37+45="])
    resp = torch.tensor([[5, 6, 1], [7, 1, 0]])
    rmask = torch.tensor([[True, True, True], [True, True, False]])
    logits = torch.randn(2, tok.vocab_size, generator=torch.Generator().manual_seed(4))
    return {
        "sample": (lambda **k: SA.sample(gpt, **k, max_new_tokens=2, generator=torch.Generator().manual_seed(0)),
                   dict(prompt_ids=ids, prompt_mask=mask), {}),
        "token_logprobs": (lambda **k: SA.token_logprobs(gpt, **k),
                           dict(prompt_ids=ids, prompt_mask=mask, response_ids=resp, mask=rmask),
                           {("mask", "dtype"): MASK_DTYPE}),
        "token_logprobs(processor)": (lambda **k: SA.token_logprobs(gpt, **k, logits_processor=lambda i, m, z: z),
                                      dict(prompt_ids=ids, prompt_mask=mask, response_ids=resp, mask=rmask),
                                      {("mask", "dtype"): MASK_DTYPE}),
        "call_model": (lambda **k: SA.call_model(gpt, **k), dict(ids=ids, attention_mask=mask),
                       {("ids", "shape"): ANY_SHAPE + " (then the mask does not fit)"}),
        "sampling_logprobs": (SA.sampling_logprobs, dict(logits=logits, temperature=0.7, top_k=3, top_p=0.9),
                              {("logits", "shape"): ANY_SHAPE}),
        "apply_logits_processor": (lambda **k: SA.apply_logits_processor(lambda i, m, z: z, **k),
                                   dict(context_ids=ids, context_mask=mask, logits=logits), {}),
    }


@pytest.mark.parametrize("name", ["sample", "token_logprobs", "token_logprobs(processor)", "call_model",
                                  "sampling_logprobs", "apply_logits_processor"])
def test_llm_sampling_errors_name_the_argument(name, gpt, tok):
    fn, args, valid = _sampling_cases(gpt, tok)[name]
    problems = sweep(fn, args, valid)
    if name == "call_model":   # a longer ids batch alone is valid; with the mask it must be refused naming both
        problems = [p for p in problems if not p.startswith("ids=shape")]
    assert problems == []


def test_token_logprobs_refuses_a_processor_that_detaches_the_logits(gpt, tok):
    # review 2.3: the log-probs came back without a gradient; the only symptom was a raw RuntimeError at backward()
    ids, mask = tok.encode_batch(["1+2="])
    resp, rmask = torch.tensor([[5, 1]]), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^logits_processor returned logits without a gradient .* at response "
                                         r"position 0"):
        SA.token_logprobs(gpt, ids, mask, resp, rmask, logits_processor=lambda i, m, z: z.detach())
    with pytest.raises(ValueError, match=r"^logits_processor returned logits without a gradient"):
        SA.token_logprobs(gpt, ids, mask, resp, rmask, logits_processor=lambda i, m, z: torch.zeros_like(z.detach()))
    with torch.no_grad():                      # no gradient wanted: the same processor is fine
        SA.token_logprobs(gpt, ids, mask, resp, rmask, logits_processor=lambda i, m, z: z.detach())
    lp = SA.token_logprobs(gpt, ids, mask, resp, rmask,
                           logits_processor=lambda i, m, z: z.masked_fill(torch.arange(z.shape[-1]) == 3, -math.inf))
    lp.sum().backward()                        # a differentiable edit keeps the gradient
    assert next(gpt.parameters()).grad is not None
    gpt.zero_grad()


def test_train_refuses_a_checker_that_returns_nan_before_any_update(gpt, tok):
    # review 2.3: train() kept going and one step later every weight was NaN, with no error
    def half_nan(response, problem):
        return math.nan if response.startswith(("1", "5")) else float(response == problem.answer)

    task = Task("nan-addition", addition_problem, half_nan, max_new_tokens=4)
    before = [p.detach().clone() for p in gpt.parameters()]
    with pytest.raises(ValueError, match=r"^task 'nan-addition''s checker 'exact' returned the reward nan for the "
                                         r"response '[15][^']*' to '\d+\+\d+='"):
        train(gpt, tok, task, RLConfig(steps=2, prompts_per_step=8, group_size=4, seed=0), evaluation=False)
    assert all(torch.equal(a, b) for a, b in zip(before, gpt.parameters()))


@pytest.mark.parametrize("value, error", [(math.inf, ValueError), (None, TypeError), ("1", TypeError)])
def test_task_score_names_the_checker_and_the_response(value, error):
    task = Task("t", addition_problem, lambda r, p: value if r == "bad" else 1.0)
    p = Problem("1+2=", "3")
    with pytest.raises(error, match=r"^task 't''s checker 'exact' (returned the reward inf|must return a real number)"
                                    r".*for the response 'bad' to '1\+2='"):
        task.score(["3", "bad"], [p, p])
    assert task.score(["3"], [p]).tolist() == [1.0]
    assert Task("b", addition_problem, lambda r, p: np.bool_(True)).score(["3"], [p]).tolist() == [1.0]


def test_retry_task_refuses_feedback_outside_the_vocabulary_when_built():
    # review 2.3: RetryTask(feedback='#') was accepted and refused only when a conversation was played
    with pytest.raises(ValueError, match=r"^feedback '#' has characters \['#'\] that are not in the tokenizer's "
                                         r"vocabulary"):
        RetryTask(ADDITION, feedback="#")
    assert RetryTask(ADDITION, feedback="#", chars="0123456789+=#").feedback == "#"
    with pytest.raises(ValueError, match=r"rewards must be finite"):
        RetryTask(Task("n", addition_problem, lambda r, p: math.nan)).check("3", Problem("1+2=", "3"))


@pytest.mark.parametrize("template, arity, match", [
    ("{0}+{1}=", 3, r"uses the arguments \[0, 1\] but arity=3"),
    ("{0}+{1}=", 1, r"uses the arguments \[0, 1\] but arity=1"),
    ("{a}+{b}=", 2, r"must refer to its arguments by position"),
    ("{0}+{1", 2, r"is not a valid format string"),
    ("{0:q}=", 1, r"cannot format 1 integer arguments"),
])
def test_option_refuses_a_template_of_the_wrong_arity_when_built(template, arity, match):
    # review 2.3: accepted at construction, refused (IndexError) or silently ignored when run
    with pytest.raises(ValueError, match=rf"^Option.template .* {match}"):
        Option("o", template, arity, 10, 99, sum)
    assert Option("o", "{}+{}=", 2, 10, 99, sum).prompt((12, 34)) == "12+34="


def test_run_plan_names_an_unknown_option_and_the_known_ones(gpt, tok):
    # review 2.3: a raw KeyError
    with pytest.raises(ValueError, match=r"^planner: the plan of problems\[0\] calls the option 'mul', which is "
                                         r"not in the library; it has \['add'\]"):
        run_plan(gpt, tok, [Problem("12+30=", "42")], lambda p: [SubGoal("mul", (12, 30))])
    with pytest.raises(ValueError, match=r"^sub-goal argument 'x0' must be an int or a reference 's<j>'"):
        SubGoal("add", ("x0", 1)).bind([5])
    assert len(run_plan(gpt, tok, [Problem("12+30+5=", "47")], smallest_first_planner, greedy=True)) == 1


def test_group_mixture_names_a_generator_that_returns_no_problem():
    # review 2.3: AttributeError "'NoneType' object has no attribute 'info'"
    task = group_mixture({"a": addition_problem, "b": lambda rng: None}, {"a": 0.0, "b": 1.0})
    with pytest.raises(TypeError, match=r"^the value groups\['b'\] returned must be a Problem or \(prompt, answer\), "
                                        r"got NoneType"):
        task.problems(1)
    pair = group_mixture({"a": lambda rng: ("1+2=", "3")}, {"a": 1.0}).problems(1, split="all")[0]
    assert (pair.prompt, pair.answer, pair.info["group"]) == ("1+2=", "3", "a")


def test_layout_names_the_argument_an_earlier_call_took_a_size_from():
    from rlkit import _validate as V
    sizes = V.layout("B T", logp=torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"mask has shape \(2, 4\).*T must be 3 \(as in logp\)"):
        V.layout("B T", sizes, mask=torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"as in an earlier argument"):      # a plain dict carries no names
        V.layout("B T", {"B": 2, "T": 3}, mask=torch.zeros(2, 4))


def test_train_names_a_model_verbose_callback_or_eval_problems_of_the_wrong_kind():
    tok = CharTokenizer()
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=1, n_embd=8))
    cfg = RLConfig(steps=1, prompts_per_step=2, group_size=2, eval_problems=2)
    weights = [p.detach().clone() for p in model.parameters()]
    for kw, arg in [(dict(model=object()), "model"), (dict(verbose="yes"), "verbose"),
                    (dict(callback=3), "callback"), (dict(eval_problems="1+2="), "eval_problems"),
                    (dict(eval_problems=[ADDITION.problems(1, seed=0)[0], "1+2="]), r"eval_problems\[1\]")]:
        args = dict(model=model, tok=tok, task=ADDITION, cfg=cfg) | kw
        with pytest.raises(TypeError, match=arg):
            train(**args)
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))      # refused before any update


def test_trainable_params_names_an_argument_that_is_not_iterable():
    from rlkit import _validate as V
    with pytest.raises(TypeError, match="params must be an iterable of tensors"):
        V.trainable_params(3, "params")


def test_token_kl_exact_names_the_reference_model_that_returns_the_wrong_shape():
    from rlkit.llm import sample, token_kl_exact
    tok = CharTokenizer()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=1, n_embd=8))
    ids, mask = tok.encode_batch(["1+2=", "3+4="])
    ro = sample(model, ids, mask, max_new_tokens=3, eos_id=tok.eos_id, pad_id=tok.pad_id)

    def bad_ref(ids, attention_mask=None):
        return torch.zeros(ids.shape[0], tok.vocab_size)

    with pytest.raises(TypeError, match="ref_model must map ids"):
        token_kl_exact(model, bad_ref, ro)
