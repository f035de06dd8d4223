"""Errors name the caller's argument, in the modules the first sweeps did not cover (issue 20, item 7).

Every public name in ``__all__`` of ``rlkit.returns``, ``divergences``, ``trust_region``, ``nets``, ``utils``,
``stats`` and of ``rlkit.llm.credit``, ``guided``, ``offline``, ``safety``, ``recipe``, ``lagged``, ``stale``,
``heads``, ``advantages``, ``samplers``, ``gru``, ``pretrain`` and ``evaluation`` that takes arguments is called
once with valid arguments and then once per probe, each probe replacing ONE argument:

* a tensor: by a Python list, by the wrong dtype (int for float, float for int or bool), by one element more on
  its last dimension, by one dimension more, and (floating tensors) by a copy with a NaN;
* an int: NaN, inf, -1 and a str; a float: NaN, inf, -1.0 and a str; a bool: a str and NaN;
* a str: the int 3; any other object (a model, a tokenizer, a task, a list of problems): an object of no
  use at all, and for a list, the same list with its first item replaced by that object.

The call must raise ``TypeError`` or ``ValueError`` whose message names the argument as the caller spelled it
(``names``), never another exception (a raw ``KeyError``, ``AttributeError``, ``IndexError`` or torch's
``RuntimeError``). A probe may be valid input by design; each such probe is listed in the case's ``valid`` with
its reason, and then the call may succeed. A NaN entry in a data tensor may also propagate (NaN in, NaN out:
the call succeeds and NaN shows in what it returns); a NaN that vanishes into a finite result is reported.

Deterministic and fast: tiny models (a one-layer GPT with 16 channels), two or three problems, one-step
trainers; every case builds its own objects.
"""
from __future__ import annotations

import math
import re

import pytest
import torch

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------------ the sweep

class Useless:
    """An argument of no use to any function: no attributes, not callable, not iterable, not a number."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<useless>"


USELESS = Useless()


def names(message: str, arg: str) -> bool:
    """Whether ``message`` names ``arg`` as a word (``pi`` is not found in ``pi_old``)."""
    return re.search(rf"(?<![\w]){re.escape(arg)}(?![\w])", message) is not None


def has_nan(x) -> bool:
    """Whether a result (a tensor, number, or a tuple/list/dict of them) holds a NaN anywhere."""
    if isinstance(x, torch.Tensor):
        return bool(x.is_floating_point() and torch.isnan(x).any())
    if isinstance(x, float):
        return math.isnan(x)
    if isinstance(x, dict):
        return any(has_nan(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(has_nan(v) for v in x)
    return any(has_nan(v) for v in getattr(x, "__dict__", {}).values())


def probes(x):
    """``(kind, bad value)`` for one argument, by its type (see the module docstring)."""
    if isinstance(x, torch.Tensor):
        yield "list", x.tolist()
        yield "dtype", x.float() if (x.dtype == torch.bool or not x.is_floating_point()) else x.long()
        yield "shape", torch.cat([x, x[..., :1]], -1) if x.dim() and x.shape[-1] else x.reshape(1, *x.shape)
        if x.dim():
            yield "dim", x[None]
        if x.is_floating_point() and x.numel():
            y = x.detach().clone()
            y.view(-1)[0] = math.nan
            yield "nan", y
    elif isinstance(x, bool):
        yield "str", "True"
        yield "nan", math.nan
    elif isinstance(x, int):
        yield from (("nan", math.nan), ("inf", math.inf), ("neg", -1), ("str", str(x)))
    elif isinstance(x, float):
        yield from (("nan", math.nan), ("inf", math.inf), ("neg", -1.0), ("str", str(x)))
    elif isinstance(x, str):
        yield "type", 3
    elif isinstance(x, (list, tuple)):
        yield "type", USELESS
        if x:
            yield "item", type(x)([USELESS, *x[1:]])
    elif x is not None:
        yield "type", USELESS


def sweep(fn, args: dict, valid: dict = (), errors=(TypeError, ValueError)) -> list[str]:
    """Call ``fn(**args)``, then once per probe of each argument; return what went wrong.

    ``valid`` maps ``(arg, kind)`` (or ``(arg, "*")``: every probe of ``arg``) to the reason the probe is valid
    input, which the call may then accept. ``errors`` are the exceptions a refusal may raise.
    """
    fn(**args)                                   # the unmutated call is valid
    valid = dict(valid)
    problems = []
    for arg, value in args.items():
        for kind, bad in probes(value):
            if (arg, kind) in valid or (arg, "*") in valid:
                continue
            try:
                out = fn(**{**args, arg: bad})
            except errors as e:
                if not names(str(e), arg):
                    problems.append(f"{arg}={kind}: {type(e).__name__} does not name {arg}: {e}")
                continue
            except Exception as e:                # noqa: BLE001 - a raw error is what the sweep looks for
                problems.append(f"{arg}={kind}: raw {type(e).__name__}: {e}")
                continue
            if not (kind == "nan" and has_nan(out)):
                problems.append(f"{arg}={kind}: accepted")
    return problems


def count_probes(args: dict, valid: dict = ()) -> int:
    """How many probes :func:`sweep` makes for a case (the valid ones excluded)."""
    valid = dict(valid)
    return sum(1 for arg, value in args.items() for kind, _ in probes(value)
               if (arg, kind) not in valid and (arg, "*") not in valid)


def api(module, name: str):
    """``module.name``; in an older rlkit that lacks it, a function that raises ``ImportError`` when called (so
    that the file runs against rlkit 0.2, whose other functions are then still swept)."""
    try:
        return getattr(module, name)
    except AttributeError:
        def missing(**_):
            raise ImportError(f"{module.__name__} has no {name} (an older rlkit)")
        return missing


MASK = "a mask is bool or 0/1 of any real dtype"
BATCH = "any leading batch dimensions"
PAD = "padding may hold anything (documented)"
NEG = "any real number is valid here"


# ------------------------------------------------------------------------------------------------ the cases
#
# Each group builds its cases afresh: ``{name: (fn, args, valid)}``; ``fn`` is called with ``**args``.

def _returns_cases():
    from rlkit import returns as R
    g = torch.Generator().manual_seed(0)
    r, v, nv = (torch.randn(2, 3, generator=g, dtype=torch.float64) for _ in range(3))
    d = torch.full((2, 3), 0.9, dtype=torch.float64)
    lam = torch.full((2, 3), 0.5, dtype=torch.float64)
    flags = torch.tensor([[False, False, True], [False, False, False]])
    return {
        "discounted_returns": (R.discounted_returns, dict(rewards=r, discounts=d, bootstrap=0.5),
                               {("bootstrap", "neg"): NEG}),
        "discounted_returns(bootstrap=tensor)": (R.discounted_returns,
                                                 dict(rewards=r, discounts=d, bootstrap=torch.zeros(2, dtype=r.dtype)),
                                                 {}),
        "n_step_returns": (R.n_step_returns, dict(rewards=r, discounts=d, next_values=nv, n=2),
                           {("next_values", "nan"): "a 2-step return never reads next_values[..., 0], the NaN"}),
        "lambda_returns": (R.lambda_returns, dict(rewards=r, discounts=d, next_values=nv, lam=0.5), {}),
        "lambda_returns(lam=tensor)": (R.lambda_returns, dict(rewards=r, discounts=d, next_values=nv, lam=lam), {}),
        "gae": (R.gae, dict(rewards=r, values=v, next_values=nv, discounts=d, lam=0.5), {}),
        "gae(lam=tensor)": (R.gae, dict(rewards=r, values=v, next_values=nv, discounts=d, lam=lam), {}),
        "td_errors": (R.td_errors, dict(rewards=r, values=v, next_values=nv, discounts=d), {}),
        "from_gymnasium": (R.from_gymnasium, dict(terminated=flags, truncated=~flags, gamma=0.9,
                                                  dtype=torch.float64), {}),
        "release_workspace": (R.release_workspace, {}, {}),
    }


def _divergences_cases():
    from rlkit import divergences as D
    g = torch.Generator().manual_seed(1)
    lp, lq = (torch.log_softmax(torch.randn(2, 4, generator=g), -1) for _ in range(2))
    c = {f.__name__: (f, dict(logp=lp, logq=lq), {}) for f in (D.kl_k1, D.kl_k2, D.kl_k3)}
    c.update({f.__name__: (f, dict(logits_p=lp, logits_q=lq), {}) for f in (D.kl_categorical, D.tv_categorical)})
    c["entropy_categorical"] = (D.entropy_categorical, dict(logits=lp),
                                {("logits", "shape"): "any number of categories", ("logits", "dim"): BATCH})
    return c


def _trust_region_cases():
    from rlkit import trust_region as TR
    lin = torch.nn.Linear(2, 1)
    x = torch.tensor([[1.0, 2.0], [0.5, -1.0]])
    n = sum(p.numel() for p in lin.parameters())

    def kl_fn():
        return (lin(x) ** 2).mean()

    def evaluate(step):
        return float(((step - 1.0) ** 2).sum()), float(step.abs().mean())

    def flat_grad(**k):
        return TR.flat_grad(**{"y": (lin(x) ** 2).mean(), **k})

    params = list(lin.parameters())
    any_shape = "any shape: Avp (evaluate) is the caller's and decides"
    return {
        "conjugate_gradient": (TR.conjugate_gradient, dict(Avp=lambda p: 2.0 * p, b=torch.ones(3), iters=5, tol=1e-10),
                               {("b", "shape"): any_shape, ("b", "dim"): any_shape}),
        "fisher_vector_product": (TR.fisher_vector_product, dict(kl_fn=kl_fn, params=params, v=torch.ones(n),
                                                                 damping=0.1), {}),
        "backtracking_line_search": (TR.backtracking_line_search,
                                     dict(evaluate=evaluate, full_step=torch.full((3,), 2.0), max_constraint=2.0,
                                          expected_improvement=1.0, backtrack_ratio=0.5, max_backtracks=5,
                                          accept_ratio=0.1),
                                     {("full_step", "shape"): any_shape, ("full_step", "dim"): any_shape,
                                      ("expected_improvement", "neg"): "documented: a value <= 0 turns the "
                                                                       "improvement-ratio test off"}),
        "flat_grad": (TR.flat_grad, dict(y=(lin(x) ** 2).mean(), params=params, create_graph=False,
                                         retain_graph=True),
                      {("y", "shape"): "a one-element tensor is a scalar"}),
        "flat_grad(y fresh)": (flat_grad, dict(params=params, create_graph=True), {}),
    }


def _nets_cases():
    import gymnasium as gym

    from rlkit import nets as N
    torch.manual_seed(0)
    pol, vnet, ac = N.CategoricalPolicy(4, 3, hidden=8, layers=1), N.ValueNet(4, hidden=8, layers=1), \
        N.ActorCritic(4, 3, hidden=8, layers=1)
    obs, actions = torch.randn(2, 4), torch.tensor([0, 2])
    batch = {("obs", "dim"): BATCH}
    return {
        "layer_init": (N.layer_init, dict(layer=torch.nn.Linear(3, 2), std=1.0, bias=0.0), {("bias", "neg"): NEG}),
        "mlp": (N.mlp, dict(in_dim=3, out_dim=2, hidden=8, layers=1, out_std=1.0, activation=torch.nn.Tanh), {}),
        "mlp(hidden=list)": (N.mlp, dict(in_dim=3, out_dim=2, hidden=[4, 5]), {}),
        "CategoricalPolicy": (N.CategoricalPolicy, dict(obs_dim=4, n_actions=3, hidden=8, layers=1), {}),
        "CategoricalPolicy.forward": (pol.forward, dict(obs=obs), batch),
        "CategoricalPolicy.dist": (pol.dist, dict(obs=obs), batch),
        "CategoricalPolicy.act": (pol.act, dict(obs=obs, greedy=False), batch),
        "CategoricalPolicy.act(greedy)": (pol.act, dict(obs=obs, greedy=True), batch),
        "CategoricalPolicy.log_prob": (pol.log_prob, dict(obs=obs, actions=actions), {}),
        "ValueNet": (N.ValueNet, dict(obs_dim=4, hidden=8, layers=1), {}),
        "ValueNet.forward": (vnet.forward, dict(obs=obs), batch),
        "ActorCritic": (N.ActorCritic, dict(obs_dim=4, n_actions=3, hidden=8, layers=1), {}),
        "ActorCritic.forward": (ac.forward, dict(obs=obs), batch),
        "ActorCritic.value": (ac.value, dict(obs=obs), batch),
        "ActorCritic.act": (ac.act, dict(obs=obs, greedy=False), batch),
        "ActorCritic.evaluate": (ac.evaluate, dict(obs=obs, actions=actions), {}),
        "obs_dim_of": (N.obs_dim_of, dict(space=gym.spaces.Box(-1.0, 1.0, (4,))), {}),
        "n_actions_of": (N.n_actions_of, dict(space=gym.spaces.Discrete(3)), {}),
    }


def _utils_cases():
    from rlkit import utils as U
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    lin = torch.nn.Linear(2, 1)

    def clip_grad(**k):
        lin.zero_grad()
        lin(torch.ones(1, 2)).sum().backward()
        return U.clip_grad(**{"params": lin.parameters(), **k})

    def timer(**k):
        with U.timer(**k):
            pass

    return {
        "device": (U.device, dict(prefer="cpu"), {}),
        "seeds": (api(U, "seeds"), dict(n=3, start=0), {}),
        "seed_base": (api(U, "seed_base"), {}, {}),
        "seed_everything": (U.seed_everything, dict(seed=0, threads=1), {("seed", "neg"): "any int seed"}),
        "masked_mean": (U.masked_mean, dict(x=x, mask=mask, dim=1, keepdim=False),
                        {("mask", "dtype"): MASK, ("dim", "neg"): "dim=-1 is the last dimension"}),
        "masked_mean(no mask)": (U.masked_mean, dict(x=x, dim=0, keepdim=True),
                                 {("x", "shape"): "any shape", ("x", "dim"): "any shape",
                                  ("dim", "neg"): "dim=-1 is the last dimension"}),
        "clip_grad": (clip_grad, dict(max_norm=1.0), {("max_norm", "inf"): "documented: inf never clips"}),
        "clip_grad(params)": (U.clip_grad, dict(params=list(lin.parameters()), max_norm=None), {}),
        "full_scale": (U.full_scale, {}, {}),
        "Timer": (U.Timer, {}, {}),
        "timer": (timer, dict(label="x", verbose=False), {}),
    }


def _stats_cases():
    from rlkit import stats as S
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 0.5, 1.0, 1.5, 1.0]
    claim_kw = dict(statement="a beats b", a=a, b=b, kind="greater", arms=("A", "B"), margin=0.1, level=0.95,
                    chapter="ch", check=True)
    return {
        "summary": (S.summary, dict(values=a, level=0.95), {}),
        "summary(tensor)": (S.summary, dict(values=torch.tensor(a)),
                            {("values", "list"): "documented: a list of numbers",
                             ("values", "dtype"): "integers are numbers", ("values", "shape"): "any n >= 2"}),
        "compare": (S.compare, dict(a=a, b=b, paired=False, level=0.95), {}),
        "compare(b=number)": (S.compare, dict(a=a, b=0.5), {("b", "neg"): NEG}),
        "holm": (S.holm, dict(pvalues=[0.01, 0.04]), {}),
        "claim": (S.claim, claim_kw, {}),
        "claim(equivalent)": (S.claim, dict(statement="same", a=a, b=a, kind="equivalent", tol=1.0, paired=True), {}),
        "report": (S.report, dict(statement="a vs b", a=a, b=b, arms=("A", "B")), {}),
        "claim_all": (S.claim_all, dict(statement="ranks", comparisons=[("a beats b", a, b, "greater")], level=0.95,
                                        chapter="ch", check=True), {}),
        "t_cdf": (S.t_cdf, dict(t=1.0, df=3.0), {("t", "neg"): NEG}),
        "t_quantile": (S.t_quantile, dict(q=0.9, df=3.0), {}),
        "recorded_claims": (S.recorded_claims, {}, {}),
    }


# ------------------------------------------------------------------------------------------- rlkit.llm.*

def _llm():
    """A tiny GPT, its tokenizer, two addition problems and a rollout of them (fresh objects each time)."""
    from types import SimpleNamespace

    from rlkit.llm import ADDITION, GPT, CharTokenizer, GPTConfig, sample
    tok = CharTokenizer()
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16, block_size=16)).eval()
    problems = ADDITION.problems(2, seed=0)
    ids, pm = tok.encode_batch([p.prompt for p in problems])
    ro = sample(gpt, ids, pm, max_new_tokens=ADDITION.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                generator=torch.Generator().manual_seed(0))
    return SimpleNamespace(tok=tok, gpt=gpt, task=ADDITION, problems=problems, ro=ro, ids=ids, pm=pm,
                           V=tok.vocab_size)


def _gen():
    return torch.Generator().manual_seed(0)


MODEL = "a model is anything that maps ids to logits"


def _credit_cases():
    from rlkit.llm import ValueHead
    from rlkit.llm import credit as C
    m = _llm()
    ro, T = m.ro, m.ro.mask.shape[1]
    g = torch.Generator().manual_seed(5)
    r = torch.randn(2, T, generator=g)
    v = torch.randn(2, T, generator=g)
    mask = torch.tensor([[1.0] * T, [1.0] * (T - 1) + [0.0]])
    rv = {("mask", "dtype"): MASK}
    critic = ValueHead(m.gpt, m.V)
    return {
        "response_mask": (C.response_mask, dict(mask=mask, ref=r, ref_name="ref", name="mask"),
                          {**rv, ("ref", "nan"): "ref gives only the shape, dtype and device"}),
        "terminal_rewards": (C.terminal_rewards, dict(rewards=torch.tensor([1.0, 0.0]), mask=mask), rv),
        "dense_rewards": (C.dense_rewards, dict(task=m.task, tok=m.tok, response_ids=ro.response_ids, mask=ro.mask,
                                                problems=m.problems, checker="exact"), rv),
        "kl_token_rewards": (C.kl_token_rewards, dict(logp=ro.logprobs, logp_ref=ro.model_logprobs - 0.1,
                                                      mask=ro.mask, beta=0.1, rewards=torch.tensor([1.0, 0.0])),
                             rv),
        "response_discounts": (C.response_discounts, dict(mask=mask, gamma=0.9), {**rv, ("mask", "dim"): BATCH}),
        "response_discounts(like)": (C.response_discounts, dict(mask=mask, gamma=0.9, like=r),
                                     {**rv, ("like", "nan"): "like gives only the shape, dtype and device"}),
        "value_targets": (C.value_targets, dict(rewards=r, values=v, mask=mask, kind="nstep", gamma=0.9, lam=0.5,
                                                n=2),
                          {**rv, ("values", "nan"): "a 2-step target never reads values[:, 0], the NaN"}),
        "value_targets(gae)": (C.value_targets, dict(rewards=r, values=v, mask=mask, kind="gae", n=2), rv),
        "token_advantages": (C.token_advantages, dict(rewards=r, values=v, mask=mask, gamma=0.9, lam=0.5), rv),
        "state_values": (C.state_values, dict(critic=critic, rollout=ro), {}),
        "first_wrong_token": (C.first_wrong_token, dict(tok=m.tok, response_ids=ro.response_ids, mask=ro.mask,
                                                        problems=m.problems), rv),
        "most_negative_token": (C.most_negative_token, dict(advantages=r, mask=mask, tol=0.0), rv),
        "exact_match_values": (C.exact_match_values, dict(model=m.gpt, tok=m.tok, rollout=ro, problems=m.problems),
                               {}),
        "mc_prefix_values": (lambda **k: C.mc_prefix_values(**k, generator=_gen()),
                             dict(model=m.gpt, tok=m.tok, task=m.task, problems=m.problems, prefixes=["", "1"], k=2,
                                  checker="exact", token_checker=False, batch_rows=8), {}),
        "token_kl_exact": (C.token_kl_exact, dict(model=m.gpt, ref_model=m.gpt, rollout=ro), {}),
        "HiddenValueHead": (C.HiddenValueHead, dict(lm=m.gpt, hidden_size=16, freeze_body=False, init=0.0),
                            {("init", "neg"): NEG}),
    }


def _guided_cases():
    from rlkit.llm import guided as G
    m = _llm()
    g = torch.Generator().manual_seed(6)
    ls = torch.log(torch.rand(2, 4, generator=g, dtype=torch.float64))
    logits = torch.randn(2, 4, generator=g, dtype=torch.float64)
    tree, reward = G.random_token_tree(2, 2, generator=torch.Generator().manual_seed(1))
    values = G.tree_values(tree, reward, "soft", 1.0)
    critic = G.SuccessCritic(m.gpt, hidden=8)
    proc = G.GuidedProcessor(critic.log_success, eta=1.0, kind="log_success", top_k=5)
    ctx_ids, ctx_mask = m.ids, m.pm
    vlogits = torch.randn(2, m.V, generator=g)
    any_shape = {("log_success", "shape"): "any number of candidates", ("log_success", "dim"): BATCH}
    return {
        "guidance_term": (G.guidance_term, dict(log_success=ls, kind="soft", eta=1.0), any_shape),
        "guided_logits": (G.guided_logits, dict(logits=logits, next_values=ls, eta=1.0), {}),
        "log_normaliser": (G.log_normaliser, dict(logits=logits, next_values=ls, value=ls[:, 0], eta=1.0), {}),
        "random_token_tree": (lambda **k: G.random_token_tree(**k, dtype=torch.float64),
                              dict(branching=2, depth=2, generator=_gen(), scale=1.5), {}),
        "random_token_tree(dtype)": (G.random_token_tree, dict(branching=2, depth=1, dtype=torch.float32), {}),
        "tree_values": (G.tree_values, dict(logits=tree, reward=reward, kind="soft", beta=1.0), {}),
        "tree_guided_logprobs": (G.tree_guided_logprobs, dict(logits=tree, values=values, eta=1.0, normalise=True),
                                 {}),
        "SuccessCritic": (G.SuccessCritic, dict(lm=m.gpt, hidden=8, vocab_size=m.V, n_embd=16), {}),
        "SuccessCritic.forward": (critic.forward, dict(ids=ctx_ids, attention_mask=ctx_mask), {}),
        "SuccessCritic.features": (critic.features, dict(ids=ctx_ids, attention_mask=ctx_mask), {}),
        "SuccessCritic.log_success": (critic.log_success, dict(context_ids=ctx_ids, context_mask=ctx_mask), {}),
        "fit_success_critic": (G.fit_success_critic, dict(critic=critic, rollout=m.ro, rewards=torch.tensor([1.0, 0.0]),
                                                          steps=2, lr=1e-3, weight_decay=0.0), {}),
        "GuidedProcessor": (G.GuidedProcessor, dict(log_success_fn=critic.log_success, eta=1.0, kind="log_success",
                                                    top_k=5, top_p=0.9), {}),
        "GuidedProcessor.__call__": (proc, dict(context_ids=ctx_ids, context_mask=ctx_mask, logits=vlogits), {}),
        "guided_token_kl": (G.guided_token_kl, dict(model=m.gpt, rollout=m.ro, logits_processor=proc, temperature=1.0,
                                                    top_k=5, top_p=0.9), {}),
        "kl_optimum_binary": (G.kl_optimum_binary, dict(p_success=torch.tensor([0.2, 0.9]), eta=1.0),
                              {("p_success", "shape"): "any shape", ("p_success", "dim"): "any shape"}),
        "best_of_n_binary": (G.best_of_n_binary, dict(p_success=torch.tensor([0.2, 0.9]), n=4),
                             {("p_success", "shape"): "any shape", ("p_success", "dim"): "any shape"}),
    }


def _logs(m):
    from rlkit.llm.offline import collect_logs
    return collect_logs(m.gpt, m.tok, m.task, m.problems, temperatures=(1.0, 0.5), generator=_gen())


def _offline_cases():
    from dataclasses import fields

    from rlkit.llm import offline as O
    m = _llm()
    logs = _logs(m)
    N, T = logs.response_ids.shape
    feats = O.response_features(m.gpt, logs)
    critic = O.TokenCritic(16, m.V, seed=0)
    probe = O.RewardProbe(m.gpt, seed=0)
    proc = O.q_logits_processor(critic, m.gpt)
    ro = m.ro
    pred = dict(prompt_ids=ro.prompt_ids, prompt_mask=ro.prompt_mask, response_ids=ro.response_ids, mask=ro.mask)
    data = {f.name: getattr(logs, f.name) for f in fields(logs)}
    return {
        "LogDataset": (O.LogDataset, data,
                       {("mask", "dtype"): MASK, ("behaviour_logprobs", "nan"): "logged log-probs are data (NaN in, "
                                                                                  "NaN out)",
                        ("rewards", "nan"): "rewards are data (NaN in, NaN out)"}),
        "LogDataset.select": (logs.select, dict(idx=torch.tensor([0, 2])),
                              {("idx", "shape"): "any rows", ("idx", "list"): "documented: a list of ints"}),
        "collect_logs": (lambda **k: O.collect_logs(**k, generator=_gen()),
                         dict(model=m.gpt, tok=m.tok, task=m.task, problems=m.problems, temperatures=(1.0, 0.5),
                              samples_per_temperature=1), {}),
        "response_logprobs": (O.response_logprobs, dict(model=m.gpt, logs=logs, temperature=0.7, batch_size=2), {}),
        "answer_probability": (O.answer_probability, dict(model=m.gpt, tok=m.tok, problems=m.problems,
                                                          temperature=0.7), {}),
        "prompt_baselines": (O.prompt_baselines, dict(logs=logs, leave_one_out=True), {}),
        "train_weighted_bc": (O.train_weighted_bc, dict(model=m.gpt, logs=logs, weights=torch.ones(N), steps=1,
                                                        batch_size=2, lr=1e-4, seed=0, grad_clip=1.0),
                              {("grad_clip", "inf"): "documented: inf never clips"}),
        "train_weighted_bc(token weights)": (O.train_weighted_bc, dict(model=m.gpt, logs=logs,
                                                                       weights=torch.ones(N, T), steps=1), {}),
        "response_features": (O.response_features, dict(model=m.gpt, logs=logs, batch_size=2), {}),
        "TokenCritic": (O.TokenCritic, dict(hidden_size=16, vocab_size=m.V, seed=0), {}),
        "TokenCritic.forward": (critic.forward, dict(z=feats), {("z", "dim"): BATCH}),
        "fit_token_critic": (O.fit_token_critic, dict(critic=critic, features=feats, logs=logs, kappa=0.7,
                                                      cql_alpha=0.1, steps=1, lr=1e-2, gamma=1.0), {}),
        "iql_token_weights": (O.iql_token_weights, dict(critic=critic, features=feats, logs=logs, beta=1 / 3,
                                                        max_weight=100.0),
                              {("max_weight", "inf"): "documented in rlkit.offline.awr_weights: no cap"}),
        "q_logits_processor": (O.q_logits_processor, dict(critic=critic, model=m.gpt), {}),
        "q_logits_processor(...)": (proc, dict(ctx_ids=m.ids, ctx_mask=m.pm, logits=torch.zeros(2, m.V)),
                                    {("logits", "nan"): "the processor replaces the logits by Q: their values are "
                                                        "not read"}),
        "RewardProbe": (O.RewardProbe, dict(model=m.gpt, seed=0), {}),
        "RewardProbe.features": (probe.features, pred, {("mask", "dtype"): MASK}),
        "RewardProbe.predict": (probe.predict, pred, {("mask", "dtype"): MASK}),
        "RewardProbe.fit": (probe.fit, dict(logs=logs, steps=1, lr=0.05, weight_decay=0.0), {}),
    }


def _ppo(evaluated: bool = True):
    """One tiny PPO update: 1 prompt, a group of 2 (evaluated on 2 problems, for the trainers that evaluate)."""
    from rlkit.llm import RLConfig
    evaluation = dict(eval_every=1, eval_problems=2) if evaluated else {}
    return RLConfig(algo="ppo", steps=1, prompts_per_step=1, group_size=2, minibatches=1, lr=1e-4, **evaluation)


def _config_case(cls, **kw):
    """A config class built with every field given (its defaults, or ``kw``): each field is probed."""
    from dataclasses import fields
    return cls, {**{f.name: getattr(cls(), f.name) for f in fields(cls)}, **kw}


def _safety_cases():
    from rlkit.llm import safety as SF
    from rlkit.llm.tasks import exact_match
    from rlkit.safety import LagrangeMultiplier
    m = _llm()
    shield = SF.substring_shield(m.tok, ("13", "14"))
    task = SF.FORBIDDEN_ADDITION
    cfg = _ppo(evaluated=False)
    report = dict(model=m.gpt, tok=m.tok, task=task, problems=m.problems, cost_checker="cost",
                  logits_processor=shield, greedy=False, generator=_gen(), temperature=0.7)
    return {
        "forbidden_substrings": (SF.forbidden_substrings, dict(patterns=("13", "14")), {}),
        "forbidden_task": (api(SF, "forbidden_task"), dict(patterns=("13",), checkers={"judge": exact_match},
                                                           name="t"), {}),
        "substring_shield": (SF.substring_shield, dict(tok=m.tok, patterns=("13", "14"), start="="), {}),
        "substring_shield(...)": (shield, dict(context_ids=m.ids, context_mask=m.pm, logits=torch.zeros(2, m.V)),
                                  {("logits", "shape"): "a model's vocabulary may be wider than the tokenizer's"}),
        "removed_mass": (SF.removed_mass, dict(rollout=m.ro), {}),
        "CostConstraint": (api(SF, "CostConstraint"), dict(checker="cost", multiplier=0.5, when="before",
                                                           whiten=True), {}),
        "CostConstraint(multiplier)": (api(SF, "CostConstraint"), dict(multiplier=LagrangeMultiplier(0.1, lr=1.0),
                                                               when="after"), {}),
        "ShieldRate": (api(SF, "ShieldRate"), {}, {}),
        "RewardCostCritic": (SF.RewardCostCritic, dict(lm=m.gpt, vocab_size=m.V), {}),
        "train_constrained": (SF.train_constrained, dict(model=m.gpt, tok=m.tok, task=task, cfg=cfg, multiplier=0.5,
                                                         cost_checker="cost", logits_processor=shield,
                                                         callback=lambda k, h: False), {}),
        "constraint_report": (SF.constraint_report, report, {}),
    }


def _recipe_cases():
    from rlkit.llm import recipe as RC
    m = _llm()
    task = RC.forbidden_addition()                           # RECIPE_TASK (a new one)
    critic = RC.RewardCostQHead(m.gpt, m.V)
    guide = RC.q_guidance(critic, eta=1.0, lam=0.5)
    cfg_cls, cfg_kw = _config_case(RC.RecipeConfig, value_lr=1e-3)
    recipe = RC.RecipeConfig(lag=1, judges=("exact", "prefix"), alpha=1.0)
    return {
        "ensemble_rewards": (RC.ensemble_rewards, dict(task=task, responses=["3", "40"], problems=m.problems,
                                                       judges=("prefix", "contains")), {}),
        "Judges": (api(RC, "Judges"), dict(judges=("exact", "prefix")), {}),
        "UncertaintyWeight": (api(RC, "UncertaintyWeight"), dict(alpha=1.0), {}),
        "q_guidance": (RC.q_guidance, dict(critic=critic, eta=1.0, lam=0.5), {}),
        "q_guidance(...)": (guide, dict(context_ids=m.ids, context_mask=m.pm, logits=torch.zeros(2, m.V)), {}),
        "RecipeConfig": (cfg_cls, cfg_kw, {}),
        "recipe_parts": (api(RC, "recipe_parts"), dict(tok=m.tok, cfg=_ppo(False), recipe=recipe, task=task), {}),
        "train_recipe": (RC.train_recipe, dict(model=m.gpt, tok=m.tok, task=task, cfg=_ppo(False), recipe=recipe,
                                               verbose=False), {}),
        "evaluate_recipe": (RC.evaluate_recipe, dict(model=m.gpt, tok=m.tok, task=task, problems=m.problems,
                                                     logits_processor=guide, judges=("prefix", "close1")), {}),
        "forbidden_addition": (RC.forbidden_addition, {}, {}),
        "RewardCostQHead": (RC.RewardCostQHead, dict(lm=m.gpt, vocab_size=m.V), {}),
        "shared_truncation": (RC.shared_truncation, dict(checker=next(iter(RC.SLOPPY_JUDGES.values()))), {}),
        "aggregate_judges": (RC.aggregate_judges, dict(judges=RC.SLOPPY_JUDGES, how="min"), {}),
        "current_policy_cost": (RC.current_policy_cost, dict(costs=torch.tensor([0.0, 1.0]), logp_new=torch.zeros(2, 3),
                                                             logp_behav=torch.full((2, 3), -0.1),
                                                             mask=torch.ones(2, 3)), {("mask", "dtype"): MASK}),
        "CurrentCostConstraint": (api(RC, "CurrentCostConstraint"), dict(checker="cost", multiplier=0.5, when="before",
                                                                         whiten=True), {}),
    }


def _lagged_cases():
    from rlkit.llm import lagged as LG
    m = _llm()
    g = torch.Generator().manual_seed(7)
    T = 4
    lr, r, v = (torch.randn(2, T, generator=g, dtype=torch.float64) for _ in range(3))
    nv = torch.cat([v[:, 1:], torch.zeros(2, 1, dtype=v.dtype)], 1)
    d = torch.full((2, T), 0.9, dtype=torch.float64)
    base = dict(log_rhos=lr.clamp(max=0.5), rewards=r, values=v, next_values=nv, discounts=d)
    probe = dict(step=0, age=torch.tensor([0, 1]), mask=torch.ones(2, 3), truth=torch.full((2, 3), 0.5),
                 n=4, estimates={"none": torch.full((2, 3), 0.4)})
    cfg_cls, cfg_kw = _config_case(LG.LaggedConfig, value_lr=1e-3, probe_every=2)
    from rlkit.distributed import ActorPool
    pool = ActorPool(lambda: m.gpt, lambda model, gen: None, n_actors=1)     # not started: only arguments checked
    return {
        "QHead": (LG.QHead, dict(lm=m.gpt, vocab_size=m.V), {}),
        "HeldBack": (LG.HeldBack, dict(pool=pool, delay=2, timeout=10.0, verify=False),
                     {("timeout", "inf"): "inf: wait for as long as it takes"}),
        "LaggedConfig": (cfg_cls, cfg_kw, {}),
        "offpolicy_targets(none)": (LG.offpolicy_targets, dict(target="none", **base, lam=0.9, clip_rho=1.0,
                                                               clip_c=1.0),
                                    {("log_rhos", "nan"): "target='none' does not read log_rhos (uncorrected)"}),
        "offpolicy_targets(vtrace)": (LG.offpolicy_targets, dict(target="vtrace", **base, lam=0.9, clip_rho=1.0,
                                                                 clip_c=1.0), {}),
        "offpolicy_targets(retrace)": (LG.offpolicy_targets, dict(target="retrace", **base, q_taken=v + 0.1, lam=0.9),
                                       {}),
        "continuation_values": (lambda **k: LG.continuation_values(**k, generator=_gen()),
                                dict(model=m.gpt, tok=m.tok, task=m.task, rollout=m.ro, problems=m.problems, n=2,
                                     checker="exact"), {}),
        "target_errors": (api(LG, "target_errors"), dict(probes=[probe], name="none", ages=[0]), {}),
        "ValueProbes": (api(LG, "ValueProbes"), dict(every=2, rows=4, continuations=2), {}),
        "ClippedLoss": (api(LG, "ClippedLoss"), dict(method="standard"), {}),
        "train_lagged": (LG.train_lagged, dict(model=m.gpt, tok=m.tok, task=m.task, cfg=_ppo(),
                                               lagged=LG.LaggedConfig(lag=1), eval_problems=m.problems,
                                               timeout=120.0, verbose=False), {}),
    }


def _stale_cases():
    from rlkit.llm import RLConfig
    from rlkit.llm import stale as ST
    from rlkit.staleness import StaleTrainingConfig
    m = _llm()
    stale = StaleTrainingConfig(lag=1)
    cfg = RLConfig(algo="grpo", steps=1, prompts_per_step=2, group_size=2, minibatches=1, eval_every=1,
                   eval_problems=2)
    return {
        "StaleLoss": (api(ST, "StaleLoss"), dict(stale=stale), {}),
        "StaleControl": (api(ST, "StaleControl"), dict(stale=stale, lr_schedule=lambda k: 1.0), {}),
        "train_stale_grpo": (ST.train_stale_grpo, dict(model=m.gpt, tok=m.tok, task=m.task, cfg=cfg, stale=stale,
                                                       eval_problems=m.problems, eval_sampled=True,
                                                       lr_schedule=lambda k: 1.0, callback=lambda *a: False,
                                                       verbose=False), {}),
    }


def _heads_cases():
    from rlkit.llm import heads as H
    m = _llm()
    head = H.LogitHead(m.gpt, m.V, (2,))
    rows = {("rows", "list"): "documented: a list of row indices", ("rows", "shape"): "a row may be selected twice"}
    return {
        "LogitHead": (H.LogitHead, dict(lm=m.gpt, width=m.V, shape=(2,), features="logits", freeze_body=False,
                                        init=0.0), {("init", "neg"): NEG}),
        "LogitHead(hidden)": (H.LogitHead, dict(lm=m.gpt, width=16, shape=(2, 3), features="hidden"), {}),
        "LogitHead.forward": (head.forward, dict(ids=m.ids, attention_mask=m.pm), {}),
        "LogitHead.at_responses": (head.at_responses, dict(ro=m.ro, rows=torch.tensor([1])), rows),
        "ValueHead": (H.ValueHead, dict(lm=m.gpt, vocab_size=m.V), {}),
        "HiddenValueHead": (H.HiddenValueHead, dict(lm=m.gpt, hidden_size=16, freeze_body=True, init=0.5),
                            {("init", "neg"): NEG}),
        "response_positions": (H.response_positions, dict(net=m.gpt, ro=m.ro, rows=torch.tensor([0, 1])), rows),
    }


def _advantages_cases():
    from rlkit.llm import advantages as A
    from rlkit.llm.heads import ValueHead
    m = _llm()
    return {
        "Group": (A.Group, dict(algo="grpo"), {}),
        "TokenGAE": (A.TokenGAE, dict(critic=ValueHead(m.gpt, m.V), gamma=0.9, lam=0.5, lr=1e-3, coef=1.0,
                                      target="lambda", n=2, target_lam=0.7), {}),
        "OffPolicy": (A.OffPolicy, dict(target="vtrace", critic="q", clip_rho=2.0, clip_c=1.0, normalize=True,
                                        gamma=0.9, lam=0.5, lr=1e-3, coef=1.0), {}),
        "OffPolicy(critic=LogitHead)": (A.OffPolicy, dict(target="none", critic=ValueHead(m.gpt, m.V)), {}),
    }


def _samplers_cases():
    from rlkit.distributed import ActorPool
    from rlkit.llm import samplers as SM
    from rlkit.staleness import LagDistribution
    m = _llm()
    shield_like = lambda i, msk, z: z                       # noqa: E731 - a logits processor
    pool = ActorPool(lambda: m.gpt, lambda model, gen: None, n_actors=1)
    return {
        "Fresh": (SM.Fresh, dict(recompute=True), {}),
        "Lagged": (SM.Lagged, dict(lag=1, processor=shield_like, keep=3), {}),
        "Lagged(LagDistribution)": (SM.Lagged, dict(lag=LagDistribution.uniform(2)), {}),
        "Pool": (SM.Pool, dict(pool=pool, timeout=10.0), {("timeout", "inf"): "inf: wait for as long as it takes"}),
    }


def _gru_cases():
    from rlkit.llm.gru import TinyGRULM
    torch.manual_seed(0)
    lm = TinyGRULM(10, hidden=8)
    return {
        "TinyGRULM": (TinyGRULM, dict(vocab_size=10, hidden=8), {}),
        "TinyGRULM.forward": (lm.forward, dict(ids=torch.tensor([[1, 2, 3], [4, 5, 6]])),
                              {("ids", "shape"): "any number of tokens"}),
    }


def _pretrain_cases():
    from rlkit.llm import GPTConfig
    from rlkit.llm import pretrain as PT
    m = _llm()
    lines = ["12+34=46\n", "5*6=30\n"]
    model_cfg = GPTConfig(vocab_size=m.V, n_layer=1, n_head=2, n_embd=16, block_size=16)
    corpus = PT.CorpusConfig(n_lines=4)
    train = PT.TrainConfig(steps=1, batch_size=2, warmup=0)
    return {
        "CorpusConfig": _config_case(PT.CorpusConfig) + ({},),
        "TrainConfig": _config_case(PT.TrainConfig) + ({},),
        "make_corpus": (PT.make_corpus, dict(cfg=corpus), {}),
        "encode_corpus": (PT.encode_corpus, dict(lines=lines, tok=m.tok), {}),
        "pretrain": (PT.pretrain, dict(model_cfg=model_cfg, corpus_cfg=corpus, train_cfg=train, log_every=1,
                                       verbose=False), {}),
    }


def _evaluation_cases():
    from rlkit.llm import evaluation as EV
    m = _llm()
    return {
        "encode_prompts": (EV.encode_prompts, dict(problems=m.problems, tok=m.tok, device="cpu"), {}),
        "device_of": (api(EV, "device_of"), dict(model=m.gpt),
                      {("model", "type"): "documented: the CPU for a model without parameters"}),
        "evaluate": (EV.evaluate, dict(model=m.gpt, tok=m.tok, task=m.task, problems=m.problems, greedy=False,
                                       temperature=0.7, top_k=5, top_p=0.9, checker="exact", batch_size=1,
                                       generator=_gen(), logits_processor=lambda i, msk, z: z), {}),
    }


GROUPS = {"returns": _returns_cases, "divergences": _divergences_cases, "trust_region": _trust_region_cases,
          "nets": _nets_cases, "utils": _utils_cases, "stats": _stats_cases}
GROUPS.update({"llm.credit": _credit_cases, "llm.guided": _guided_cases})
GROUPS.update({"llm.offline": _offline_cases})
GROUPS.update({"llm.safety": _safety_cases, "llm.recipe": _recipe_cases, "llm.lagged": _lagged_cases,
               "llm.stale": _stale_cases, "llm.heads": _heads_cases, "llm.advantages": _advantages_cases,
               "llm.samplers": _samplers_cases, "llm.gru": _gru_cases, "llm.pretrain": _pretrain_cases,
               "llm.evaluation": _evaluation_cases})


# ------------------------------------------------------------------------------------------------ the tests

#: Public names that are not called by the sweep, and why.
NOT_SWEPT = {
    "rlkit.stats": {"Summary": "a frozen record that summary() fills", "Comparison": "a frozen record that compare() "
                    "fills", "Claim": "a record that claim() fills", "ClaimFailed": "an exception class",
                    "CLAIM_MIME": "a constant"},
    "rlkit.llm.credit": {"VALUE_TARGETS": "a constant"},
    "rlkit.llm.guided": {"GUIDANCE_KINDS": "a constant", "TREE_VALUE_KINDS": "a constant"},
    "rlkit.llm.safety": {"FORBIDDEN": "a constant", "FORBIDDEN_ADDITION": "a constant (a Task)",
                         "ConstrainedResult": "rlkit.llm.RLResult (rlkit.llm.trainer's), a result record"},
    "rlkit.llm.recipe": {"SLOPPY_JUDGES": "a constant", "SHARED_BUG_JUDGES": "a constant",
                         "RECIPE_TASK": "a constant (a Task)",
                         "RecipeResult": "rlkit.llm.RLResult (rlkit.llm.trainer's), a result record"},
    "rlkit.llm.lagged": {"TARGETS": "a constant", "PROBES": "a constant",
                         "LaggedResult": "a result record that train_lagged fills (its target_errors is "
                                         "target_errors, swept)"},
    "rlkit.llm.stale": {"StaleResult": "rlkit.llm.RLResult (rlkit.llm.trainer's), a result record"},
    "rlkit.llm.pretrain": {"main": "the command line: argparse refuses bad arguments (SystemExit with usage); a "
                                   "valid call trains the full model and writes the checkpoint"},
}

#: The module each group sweeps.
MODULES = {g: f"rlkit.{g}" for g in GROUPS}


def _case_names():
    out = []
    for group, build in GROUPS.items():
        try:
            out += [(group, name) for name in build()]
        except Exception as e:                    # noqa: BLE001 - an old rlkit: the test reports it
            out.append((group, f"<cases not built: {type(e).__name__}: {e}>"))
    return out


CASES = _case_names()


@pytest.mark.parametrize("group, name", CASES, ids=[f"{g}:{n}" for g, n in CASES])
def test_errors_name_the_callers_argument(group, name, monkeypatch, capsys):
    from rlkit import stats
    monkeypatch.setattr(stats, "_RECORDED", [])            # claim() records: keep the ledger of this process clean
    monkeypatch.delenv("RLKIT_CLAIMS_FILE", raising=False)
    fn, args, valid = GROUPS[group]()[name]
    assert sweep(fn, args, valid) == []


@pytest.mark.parametrize("group", list(GROUPS))
def test_every_public_name_is_swept(group):
    import importlib
    module = importlib.import_module(MODULES[group])
    swept = {name.split("(")[0].split(".")[0] for name in GROUPS[group]()}
    skipped = NOT_SWEPT.get(MODULES[group], {})
    assert sorted(set(module.__all__) - swept - set(skipped)) == []
    assert sorted(set(skipped) & swept) == []


# ------------------------------------------------------------------------ reproducers of what the sweep found
#
# Each was wrong in rlkit 0.2 (a silent wrong result, or a raw error); the sweep finds them too, these state the
# behaviour against an independent computation.

def test_clip_grad_refuses_a_max_norm_that_is_not_positive_instead_of_flipping_the_gradient():
    # 0.2: max_norm=-1 multiplied the gradient by -1/5 (clip_grad_norm_'s coefficient), NaN made it NaN
    from rlkit.utils import clip_grad
    p = torch.zeros(2, requires_grad=True)
    for bad in (-1.0, 0.0, math.nan, "1.0"):
        p.grad = torch.tensor([3.0, 4.0])
        with pytest.raises((ValueError, TypeError), match=r"^max_norm must be"):
            clip_grad([p], bad)
        assert p.grad.tolist() == [3.0, 4.0]                  # untouched
    assert clip_grad([p], 1.0) == 5.0 and torch.allclose(p.grad, torch.tensor([0.6, 0.8]))   # 3-4-5, scaled to 1
    assert clip_grad([p], math.inf) == pytest.approx(1.0) and torch.allclose(p.grad, torch.tensor([0.6, 0.8]))


def test_categorical_policy_names_obs_when_its_logits_are_nan():
    # 0.2: torch.multinomial's raw RuntimeError "probability tensor contains either inf, nan or element < 0"
    from rlkit.nets import ActorCritic, CategoricalPolicy
    obs = torch.tensor([[0.1, math.nan, 0.0, 0.2], [0.0, 0.1, 0.2, 0.3]])
    for act in (CategoricalPolicy(4, 3).act, ActorCritic(4, 3).act):
        with pytest.raises(ValueError, match=r"^obs gave NaN logits"):
            act(obs)
        a, logp = act(obs, greedy=True)[:2]                   # greedy: NaN in, NaN out
        assert a.shape == (2,) and math.isnan(logp[0]) and not math.isnan(logp[1])


def test_nets_name_layer_out_std_and_activation():
    from rlkit.nets import layer_init, mlp
    with pytest.raises(ValueError, match=r"^layer must have a bias"):          # 0.2: AttributeError from init
        layer_init(torch.nn.Linear(3, 2, bias=False))
    with pytest.raises(ValueError, match=r"^out_std must be a finite number"):  # 0.2: "std must be ..."
        mlp(3, 2, out_std=-1.0)
    with pytest.raises(TypeError, match=r"^activation must be a class such as nn.Tanh"):   # 0.2: forward() missing
        mlp(3, 2, activation=torch.nn.Tanh())
    with pytest.raises(TypeError, match=r"^activation\(\) must be a Module, got int"):
        mlp(3, 2, activation=lambda: 3)
    net = mlp(3, 2, hidden=[4], activation=lambda: torch.nn.ReLU())              # a factory is fine
    assert isinstance(net[1], torch.nn.ReLU)


def test_masked_mean_names_dim_and_keepdim():
    # 0.2: IndexError "tuple index out of range" (no mask) and torch's IndexError (with a mask)
    from rlkit.utils import masked_mean
    x, m = torch.arange(6.0).view(2, 3), torch.tensor([[True, False, True], [True, True, True]])
    for mask in (None, m):
        for bad, err in ((2, ValueError), (-3, ValueError), (0.5, TypeError), ((0, 0), ValueError)):
            with pytest.raises(err, match=r"^dim"):
                masked_mean(x, mask, dim=bad)
        with pytest.raises(TypeError, match=r"^keepdim must be True or False"):
            masked_mean(x, mask, dim=1, keepdim="yes")
    assert masked_mean(x, m, dim=-1).tolist() == [1.0, 4.0]                    # (0 + 2) / 2, (3 + 4 + 5) / 3
    assert masked_mean(x, None, dim=(0, 1)).item() == 2.5


def test_flat_grad_names_y_and_params():
    # 0.2: torch's RuntimeError "grad can be implicitly created only for scalar outputs" / "does not require grad"
    from rlkit.trust_region import flat_grad
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(ValueError, match=r"^y must be a scalar with a graph"):
        flat_grad(w * 3, [w])
    with pytest.raises(ValueError, match=r"^y must be a scalar with a graph"):
        flat_grad(torch.tensor(1.0), [w])
    with pytest.raises(TypeError, match=r"^params must be an iterable of tensors"):
        flat_grad((w ** 2).sum(), 3)
    assert flat_grad((w ** 2).sum(), [w]).tolist() == [2.0, 4.0]                # d/dw sum w^2 = 2w


def test_compare_and_claim_refuse_a_flag_that_is_not_a_bool():
    # rlkit.stats is new in 0.3; a str was truthy: paired="no" ran the paired test, check="no" asserted
    from rlkit import stats
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [1.5, 1.0, 4.0, 3.0, 6.0]
    with pytest.raises(TypeError, match=r"^paired must be True or False"):
        stats.compare(a, b, paired="no")
    with pytest.raises(TypeError, match=r"^check must be True or False"):
        stats.claim("s", a, b, check="no")
    with pytest.raises(TypeError, match=r"^comparisons must be a sequence"):
        stats.claim_all("s", 3)
    with pytest.raises(TypeError, match=r"^comparisons\[0\] \(its a\)\[1\] must be a real number"):
        stats.claim_all("s", [("t", [1.0, "x", 2.0], b, "greater")])
    with pytest.raises(TypeError, match=r"^pvalues must be a sequence of p-values"):
        stats.holm(0.5)


def test_log_dataset_checks_every_field():
    # 0.2: response_ids one column wider than the log-probs, float prompt indices, a float idx were accepted
    from dataclasses import fields

    m = _llm()
    logs = _logs(m)
    data = {f.name: getattr(logs, f.name) for f in fields(logs)}
    from rlkit.llm.offline import LogDataset
    wide = torch.cat([logs.response_ids, logs.response_ids[:, :1]], 1)
    with pytest.raises(ValueError, match=r"^LogDataset.response_ids must have shape"):
        LogDataset(**{**data, "response_ids": wide})
    with pytest.raises(TypeError, match=r"^LogDataset.prompt_index must be a torch.Tensor of dtype int64"):
        LogDataset(**{**data, "prompt_index": logs.prompt_index.float()})
    with pytest.raises(ValueError, match=r"^LogDataset.temperature must hold finite numbers in \(0.0, inf\]"):
        LogDataset(**{**data, "temperature": torch.zeros(len(logs))})
    with pytest.raises(TypeError, match=r"^idx must be a torch.Tensor of dtype int64"):   # 0.2: rows 0 and 1
        logs.select(torch.tensor([0.9, 1.2]))
    assert logs.select([3, 0]).response_ids.tolist() == [logs.response_ids[3].tolist(), logs.response_ids[0].tolist()]


def test_target_errors_names_an_unknown_estimate_instead_of_a_key_error():
    from rlkit.llm.lagged import target_errors
    probe = dict(step=0, age=torch.tensor([0, 1]), mask=torch.ones(2, 1), truth=torch.tensor([[0.5], [0.0]]), n=3,
                 estimates={"none": torch.tensor([[0.75], [0.5]])})
    with pytest.raises(ValueError, match=r"^name='vtrace\(1\)' is not an estimate of probes\[0\]"):  # 0.2: KeyError
        target_errors([probe], "vtrace(1)")
    with pytest.raises(ValueError, match=r"^probes\[0\] lacks the keys \['truth'\]"):
        target_errors([{k: v for k, v in probe.items() if k != "truth"}], "none")
    # by hand: row 0 (age 0) (0.75 - 0.5)^2 - 0.5 * 0.5 / 2 = -0.0625; row 1 (0.5 - 0)^2 - 0 = 0.25
    assert target_errors([probe], "none") == (pytest.approx((0.25 - 0.0625) / 2), 2)
    assert target_errors([probe], "none", ages=[1]) == (pytest.approx(0.25), 1)


def test_kl_token_rewards_and_offpolicy_targets_name_the_callers_log_probs():
    # 0.2: "the log-probs at real tokens must be finite" and "traces must be finite" named neither argument
    from rlkit.llm.credit import kl_token_rewards
    from rlkit.llm.lagged import offpolicy_targets
    lp, mask = torch.tensor([[-0.5, math.nan]]), torch.tensor([[1.0, 1.0]])
    with pytest.raises(ValueError, match=r"^logp \(at real tokens\) must be finite"):
        kl_token_rewards(lp, torch.zeros(1, 2), mask, 0.1)
    with pytest.raises(ValueError, match=r"^logp_ref \(at real tokens\) must be finite"):
        kl_token_rewards(torch.zeros(1, 2), lp, mask, 0.1)
    out = kl_token_rewards(lp, torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), 0.1)     # NaN at padding is fine
    assert torch.allclose(out, torch.tensor([[0.05, 0.0]]))                             # -0.1 * (-0.5 - 0)
    x = torch.zeros(1, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^log_rhos must not hold NaN"):
        offpolicy_targets("retrace", lp.double(), x, x, x, x, q_taken=x)


def test_stale_grpo_refuses_a_learning_rate_multiplier_that_is_not_a_finite_number():
    # 0.2: lr_schedule returning NaN set the learning rate to NaN and every weight became NaN, with no error
    from rlkit.llm import RLConfig
    from rlkit.llm.stale import train_stale_grpo
    from rlkit.staleness import StaleTrainingConfig
    m = _llm()
    before = [p.detach().clone() for p in m.gpt.parameters()]
    cfg = RLConfig(algo="grpo", steps=2, prompts_per_step=2, group_size=2, eval_every=1, eval_problems=2)
    for bad in (math.nan, -1.0, "1"):
        with pytest.raises((ValueError, TypeError), match=r"^the learning-rate multiplier lr_schedule returned"):
            train_stale_grpo(m.gpt, m.tok, m.task, cfg, StaleTrainingConfig(), eval_problems=m.problems,
                             lr_schedule=lambda k, bad=bad: bad)
        assert all(torch.equal(a, b) for a, b in zip(before, m.gpt.parameters()))


def test_llm_functions_name_a_model_or_critic_that_cannot_be_called():
    # 0.2: "'int' object is not callable" or "'int' object has no attribute 'parameters'"
    from rlkit.llm import evaluate
    from rlkit.llm.credit import state_values, token_kl_exact
    from rlkit.llm.offline import collect_logs
    m = _llm()
    with pytest.raises(TypeError, match=r"^ref_model must be callable"):
        token_kl_exact(m.gpt, 3, m.ro)
    with pytest.raises(TypeError, match=r"^model must be callable"):
        collect_logs(3, m.tok, m.task, m.problems)
    with pytest.raises(TypeError, match=r"^model must be callable"):
        evaluate(3, m.tok, m.task, m.problems)
    with pytest.raises(ValueError, match=r"^the values critic returned must have shape \[N, P \+ T\]"):
        state_values(lambda ids, attention_mask: torch.zeros(ids.shape[0], 3), m.ro)


def test_critics_and_the_line_search_name_an_argument_that_does_not_fit_the_model():
    # a width or n_embd other than the model's gave torch's "mat1 and mat2 shapes cannot be multiplied"; an
    # evaluate returning something else than two numbers gave "cannot unpack" or float()'s TypeError
    from rlkit.llm.guided import SuccessCritic
    from rlkit.llm.heads import LogitHead
    from rlkit.trust_region import backtracking_line_search
    m = _llm()
    with pytest.raises(ValueError, match=rf"^width={m.V + 1} does not match lm, whose logits have {m.V} features"):
        LogitHead(m.gpt, m.V + 1)(m.ids, m.pm)
    with pytest.raises(ValueError, match=r"^width=15 does not match lm, whose hidden states have 16 features"):
        LogitHead(m.gpt, 15, features="hidden")(m.ids, m.pm)
    with pytest.raises(ValueError, match=r"^n_embd=8 does not match lm, whose hidden states have 16 features"):
        SuccessCritic(m.gpt, n_embd=8).log_success(m.ids, m.pm)
    for out in (1.0, (1.0,), ([1.0, 2.0], 0.0), (torch.ones(2), 0.0)):
        with pytest.raises(TypeError, match=r"^evaluate must return two numbers \(loss, constraint\)"):
            backtracking_line_search(lambda s, out=out: out, torch.ones(2), 0.1)
    ok, frac, info = backtracking_line_search(lambda s: (float(((s - 0.5) ** 2).sum()), float(s.abs().max())),
                                              torch.ones(2), 0.6)
    assert (ok, frac, info["n_evals"]) == (True, 0.5, 3)       # f = 1 breaks the constraint, f = 0.5 is exact
