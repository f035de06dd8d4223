r"""Checkers for the exercises of chapter 7, ``lessons/07_tiny_llm.ipynb``.

* ``response_logprob(logits, response_ids, mask)``: the log-probability of each response,
  :math:`\log\pi(y\mid x) = \sum_t m_t \log\mathrm{softmax}(z_t)_{y_t}`, ``[B, T, V]`` -> ``[B]``.
* ``top_p_logprobs(logits, p)``: the log-probabilities of nucleus sampling: keep the most likely
  tokens while the mass *before* a token is below ``p`` (the top token is always kept),
  renormalise over them, ``-inf`` elsewhere.
* ``group_advantages(rewards, group_size)``: GRPO's group-normalised advantages,
  :math:`(r_i - \bar r_g)/(\mathrm{std}_g + \zeta)`, :math:`\zeta = 10^{-6}`, with the sample standard deviation.
* ``sequence_ratio(logp_new, logp_old, mask)``: GSPO's length-normalised sequence ratio,
  :math:`s_i = \exp\big(\frac{1}{|y_i|}\sum_t m_{i,t}(\log\pi_\theta - \log\pi_{\text{old}})\big)`.
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []


def _token_logp(logits, response_ids, log=torch.log_softmax):
    """``log(logits)[..., token]`` at each position: ``[B, T, V]`` -> ``[B, T]``."""
    return log(logits, dim=-1).gather(-1, response_ids[..., None]).squeeze(-1)


# ------------------------------------------------------------------- 1. response_logprob

def _rlp_cases():
    g = torch.Generator().manual_seed(7)
    B, T, V_ = 3, 5, 6
    logits = torch.randn(B, T, V_, generator=g) * 2
    ids = torch.randint(0, V_, (B, T), generator=g)
    mask = torch.tensor([[1., 1., 1., 0., 0.], [1., 1., 1., 1., 1.], [1., 0., 0., 0., 0.]])
    hand = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]]))
    return [
        Case(args=(hand, torch.tensor([[0, 2]]), torch.tensor([[1.0, 1.0]])), label="log(0.5) + log(0.8)"),
        Case(args=(logits, ids, mask), label="3 responses of lengths 3, 5, 1"),
        Case(args=(logits.double() * 30, ids, mask), label="large logits (float64)"),
    ]


@exercise(chapter=7, cases=_rlp_cases, atol=1e-5,
          description="log-probability of whole responses from per-position logits")
def response_logprob(logits, response_ids, mask):
    """Sum over real tokens of log softmax(logits)[token]; logits [B, T, V], ids [B, T], mask [B, T] -> [B]."""
    sizes = V.layout("B T V", floating=True, logits=logits)
    V.index_tensor(response_ids, "response_ids", shape=logits.shape[:-1], shape_of="[B, T]", n=sizes["V"])
    m = V.check_mask(mask, response_ids, "response_ids", as_bool=True)
    logp = _token_logp(logits, response_ids)
    return torch.where(m, logp, torch.zeros((), dtype=logp.dtype)).sum(-1)


@mistake(response_logprob, "you summed raw logits: apply log_softmax over the vocabulary first")
def _rlp_raw_logits(logits, response_ids, mask):
    return (logits.gather(-1, response_ids[..., None]).squeeze(-1) * mask).sum(-1)


@mistake(response_logprob, "padding after <eos> was counted: multiply by (or select with) the mask")
def _rlp_no_mask(logits, response_ids, mask):
    return _token_logp(logits, response_ids).sum(-1)


@mistake(response_logprob, "you averaged over tokens; log pi(y|x) is the SUM of token log-probs")
def _rlp_mean(logits, response_ids, mask):
    return (_token_logp(logits, response_ids) * mask).sum(-1) / mask.sum(-1)


@mistake(response_logprob, "you added probabilities, not log-probabilities")
def _rlp_probs(logits, response_ids, mask):
    return torch.log((_token_logp(logits, response_ids, log=torch.softmax) * mask).sum(-1))


@mistake(response_logprob, "you shifted by one position, as for a Hugging Face model's logits (position t "
         "predicting token t+1); here logits[:, t] already scores response_ids[:, t]: no shift")
def _rlp_hf_shift(logits, response_ids, mask):
    logp = _token_logp(logits[:, :-1], response_ids[:, 1:])
    return torch.where(mask[:, 1:].bool(), logp, torch.zeros((), dtype=logp.dtype)).sum(-1)


# ------------------------------------------------------------------- 2. top_p_logprobs

def _nucleus(logp, keep_sorted):
    """Renormalised log-probabilities of the tokens kept (``keep_sorted`` in descending order of
    probability; the top token always kept), ``-inf`` elsewhere."""
    order = logp.sort(dim=-1, descending=True).indices
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return torch.log_softmax(logp.masked_fill(~keep, float("-inf")), dim=-1)


def _topp_cases():
    g = torch.Generator().manual_seed(11)
    return [
        Case(args=(torch.log(torch.tensor([0.05, 0.5, 0.15, 0.3])), 0.7),
             label="p = [0.05, 0.5, 0.15, 0.3], top_p = 0.7 keeps 0.5 and 0.3"),
        Case(args=(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), 0.85), label="top_p = 0.85 keeps three"),
        Case(args=(torch.tensor([3.0, 0.0, -1.0]), 0.2), label="the top token is always kept"),
        Case(args=(torch.randn(4, 10, generator=g) * 2, 0.9), label="a batch of 4 rows"),
    ]


@exercise(chapter=7, cases=_topp_cases, atol=1e-5, description="nucleus (top-p) sampling distribution")
def top_p_logprobs(logits, p):
    """Nucleus sampling distribution, log space; logits [..., V] -> [..., V] with -inf outside."""
    V.has_categories(logits, "logits")
    p = V.real_in(p, "p", 0.0, 1.0, lo_open=True)
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.sort(dim=-1, descending=True).values.exp()
    before = probs.cumsum(-1) - probs                       # the mass of the tokens before each one
    return _nucleus(logp, before < p)


@mistake(top_p_logprobs, "you stop when the mass INCLUDING the token reaches p; keep a token "
         "while the mass of the tokens before it is below p")
def _topp_including(logits, p):           # keeps while the cumulative mass INCLUDING the token is < p
    logp = torch.log_softmax(logits, dim=-1)
    return _nucleus(logp, logp.sort(dim=-1, descending=True).values.exp().cumsum(-1) < p)


@mistake(top_p_logprobs, "the kept tokens were not renormalised (their probabilities must sum to 1)")
def _topp_not_renormalised(logits, p):
    logp = torch.log_softmax(logits, dim=-1)
    return logp.masked_fill(top_p_logprobs(logits, p) == float("-inf"), float("-inf"))


@mistake(top_p_logprobs, "the cumulative sum must run over tokens sorted by probability, "
         "not in vocabulary order")
def _topp_unsorted(logits, p):            # cumulative sum in vocabulary order
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.exp()
    keep = (probs.cumsum(-1) - probs) < p
    return torch.log_softmax(logp.masked_fill(~keep, float("-inf")), dim=-1)


# ------------------------------------------------------------------- 3. group_advantages

def _ga_cases():
    g = torch.Generator().manual_seed(3)
    return [
        Case(args=(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]), 4), label="two groups of 4"),
        Case(args=(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0]), 3),
             label="an all-correct group and an all-wrong group: advantages 0, not NaN"),
        Case(args=(torch.rand(24, generator=g), 8), label="3 groups of 8, continuous rewards"),
    ]


@exercise(chapter=7, cases=_ga_cases, atol=1e-5, description="GRPO's group-normalised advantages")
def group_advantages(rewards, group_size):
    """(r - group mean) / (group sample std + zeta), zeta = 1e-6; rewards [N], consecutive groups -> [N]."""
    V.layout("N", floating=True, rewards=rewards)
    group_size = V.int_in(group_size, "group_size", 2, max(2, rewards.numel()))
    g = rewards.reshape(-1, group_size)
    return ((g - g.mean(-1, keepdim=True)) / (g.std(-1, keepdim=True) + 1e-6)).reshape(rewards.shape)


@mistake(group_advantages, "use the sample standard deviation (divide by m - 1 for a group of m, torch's default)")
def _ga_population_std(rewards, group_size):
    g = rewards.reshape(-1, group_size)
    return ((g - g.mean(-1, keepdim=True)) / (g.std(-1, keepdim=True, unbiased=False) + 1e-6)).reshape(-1)


@mistake(group_advantages, "you normalised over the whole batch; GRPO normalises within each prompt's group")
def _ga_batch(rewards, group_size):
    return group_advantages(rewards, rewards.numel())


@mistake(group_advantages, "you did not divide by the group's standard deviation (that is Dr. GRPO)")
def _ga_no_std(rewards, group_size):
    g = rewards.reshape(-1, group_size)
    return (g - g.mean(-1, keepdim=True)).reshape(-1)


@mistake(group_advantages, "the completions of one prompt are CONSECUTIVE: reshape to [n_groups, group_size]")
def _ga_interleaved(rewards, group_size):     # groups taken as strided instead of consecutive
    strided = rewards.reshape(group_size, -1).T.reshape(-1)
    return group_advantages(strided, group_size).reshape(-1, group_size).T.reshape(-1)


# ------------------------------------------------------------------- 4. sequence_ratio

def _sr_cases():
    g = torch.Generator().manual_seed(5)
    old = -torch.rand(3, 6, generator=g) * 3
    new = old + 0.3 * torch.randn(3, 6, generator=g)
    mask = torch.tensor([[1., 1., 1., 1., 0., 0.], [1., 1., 1., 1., 1., 1.], [1., 1., 0., 0., 0., 0.]])
    big = old.clone()
    big[:, 0] += 50.0
    return [
        Case(args=(torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.2, -2.4, -5.0]]),
                   torch.tensor([[1.0, 1.0, 0.0]])), label="exp((0.2 + 0.4) / 2) = exp(0.3)"),
        Case(args=(new, old, mask), label="3 responses of lengths 4, 6, 2"),
        Case(args=(big, old, mask), label="a log-ratio of +50 on one token stays finite"),
    ]


@exercise(chapter=7, cases=_sr_cases, atol=1e-5, description="GSPO's length-normalised sequence ratio")
def sequence_ratio(logp_new, logp_old, mask):
    """exp(mean over real tokens of logp_new - logp_old); [B, T] -> [B]."""
    V.matching_floats(logp_new=logp_new, logp_old=logp_old)
    m = V.check_mask(mask, logp_new, "logp_new")
    diff = torch.where(m > 0, logp_new - logp_old, torch.zeros((), dtype=logp_new.dtype))
    return torch.exp(diff.sum(-1) / m.sum(-1).clamp_min(1.0))


@mistake(sequence_ratio, "that is the product of the token ratios; GSPO takes its |y|-th root "
         "(divide the summed log-ratio by the response length)")
def _sr_product(logp_new, logp_old, mask):
    return torch.exp(((logp_new - logp_old) * mask).sum(-1))


@mistake(sequence_ratio, "padding was counted in the length: divide by the number of real tokens")
def _sr_pad_in_mean(logp_new, logp_old, mask):
    return torch.exp(((logp_new - logp_old) * mask).mean(-1))


@mistake(sequence_ratio, "you averaged the token ratios; GSPO averages the LOG-ratios, then "
         "exponentiates (a geometric mean)")
def _sr_mean_of_ratios(logp_new, logp_old, mask):
    return (torch.exp(logp_new - logp_old) * mask).sum(-1) / mask.sum(-1)


@mistake(sequence_ratio, "the ratio is new over old, not old over new")
def _sr_inverted(logp_new, logp_old, mask):
    return 1.0 / sequence_ratio(logp_new, logp_old, mask)


# ------------------------------------------------------------------- 5. grpo_update (the outer loop)

def _grpo_minibatch_loss(theta, old_logp, adv, ref_logits, actions, idx, clip, beta):
    """Mean over the minibatch's samples of -(clipped surrogate - beta * k3)."""
    logp = torch.log_softmax(theta[idx], dim=-1).gather(-1, actions[idx])
    ratio = torch.exp(logp - old_logp[idx])
    a = adv[idx]
    surrogate = torch.minimum(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)
    log_q = torch.log_softmax(ref_logits[idx], dim=-1).gather(-1, actions[idx]) - logp   # log pi_ref/pi
    k3 = torch.exp(log_q) - log_q - 1
    return -(surrogate - beta * k3).mean()


def _group_normalise(rewards):
    return (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-6)


def _grpo_loop(logits, ref_logits, actions, rewards, order, groups_per_minibatch, lr, clip, beta, *,
               fresh_old=False, adv_fn=_group_normalise, batches=None, loss_fn=_grpo_minibatch_loss):
    """The outer loop shared by the reference and the mistakes (each mistake changes one piece)."""
    theta = logits.detach().clone()
    old_logp = torch.log_softmax(theta, dim=-1).gather(-1, actions)
    adv = adv_fn(rewards)
    for perm in order:
        chunks = batches(perm) if batches is not None else perm.split(groups_per_minibatch)
        for idx in chunks:
            if fresh_old:
                old_logp = torch.log_softmax(theta, dim=-1).gather(-1, actions)
            th = theta.clone().requires_grad_(True)
            loss = loss_fn(th, old_logp, adv, ref_logits, actions, idx, clip, beta)
            (grad,) = torch.autograd.grad(loss, th)
            theta = theta - lr * grad
    return theta


def _gu_cases():
    g = torch.Generator().manual_seed(11)
    P, K, G = 6, 5, 4

    def problem(dtype, scale=1.5):
        logits = (torch.randn(P, K, generator=g) * scale).to(dtype)
        ref = (torch.randn(P, K, generator=g) * scale).to(dtype)
        actions = torch.randint(0, K, (P, G), generator=g)
        rewards = (actions % 2 == 0).to(dtype) + 0.1 * torch.rand(P, G, generator=g).to(dtype)
        return logits, ref, actions, rewards

    def orders(epochs):
        return torch.stack([torch.randperm(P, generator=g) for _ in range(epochs)])

    one_group = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    return [
        Case(args=(torch.zeros(1, 3, dtype=torch.float64), torch.zeros(1, 3, dtype=torch.float64),
                   torch.tensor([[0, 1, 2, 2]]), one_group.double(), torch.tensor([[0]]), 1, 0.5, 0.2, 0.0),
             label="one prompt, one step from uniform logits, no KL"),
        Case(args=(*problem(torch.float64), orders(3), 2, 2.0, 0.2, 0.1),
             label="6 prompts, 3 epochs of minibatches of 2 groups, lr 2 (the clip binds)"),
        Case(args=(*problem(torch.float64), orders(2), 3, 0.7, 0.3, 0.5),
             label="2 epochs of minibatches of 3 groups, beta 0.5"),
        Case(args=(*problem(torch.float64), orders(4), 4, 3.0, 0.1, 0.05),
             label="minibatches of 4 and 2 groups (6 is not a multiple of 4)"),
        Case(args=(*problem(torch.float32), orders(2), 1, 1.0, 0.2, 0.2),
             label="float32, one group per minibatch"),
    ]


@exercise(chapter=7, cases=_gu_cases, atol=1e-5,
          description="GRPO's outer loop: frozen old log-probs, epochs of minibatches of whole groups")
def grpo_update(logits, ref_logits, actions, rewards, order, groups_per_minibatch, lr, clip, beta):
    """One GRPO update of a tabular policy (prompt p, response a: pi(a|p) = softmax(logits[p])[a]).

    logits, ref_logits [P, K]; actions [P, G] sampled responses (int64), rewards [P, G]; order [E, P]:
    row e is the order of the prompts in epoch e. Returns the new logits [P, K] after E epochs of
    plain gradient-descent steps (step lr) on minibatches of ``groups_per_minibatch`` whole groups.
    """
    sizes = V.layout("P K", floating=True, logits=logits)
    V.layout("P K", sizes, ref_logits=ref_logits)
    V.matching_floats(logits=logits, ref_logits=ref_logits)
    actions = V.index_tensor(actions, "actions", dim=2, n=sizes["K"])
    if actions.shape[0] != sizes["P"]:
        raise ValueError(f"actions must have shape [P, G] with P = {sizes['P']} (from logits), "
                         f"got {tuple(actions.shape)}")
    V.layout("P G", {"P": sizes["P"], "G": actions.shape[1]}, floating=True, rewards=rewards)
    if actions.shape[1] < 2:
        raise ValueError(f"actions must hold at least 2 responses per prompt (a group), got {actions.shape[1]}")
    order = V.index_tensor(order, "order", dim=2, n=sizes["P"])
    if order.shape[1] != sizes["P"] or not bool((order.sort(-1).values == torch.arange(sizes["P"])).all()):
        raise ValueError(f"order must be [E, P] with each row a permutation of range(P = {sizes['P']})")
    groups_per_minibatch = V.int_in(groups_per_minibatch, "groups_per_minibatch", 1, sizes["P"])
    lr = V.real_in(lr, "lr", 0.0, lo_open=True)
    clip = V.real_in(clip, "clip", 0.0, 1.0, lo_open=True, hi_open=True)
    beta = V.real_in(beta, "beta", 0.0)
    return _grpo_loop(logits, ref_logits, actions, rewards.to(logits.dtype), order, groups_per_minibatch,
                      lr, clip, beta)


@mistake(grpo_update, "the old log-probabilities were recomputed inside the loop: they are frozen once, "
                      "before the first epoch, or the ratio is always 1 and the clip never acts")
def _gu_fresh_old(logits, ref_logits, actions, rewards, order, groups_per_minibatch, lr, clip, beta):
    return _grpo_loop(logits, ref_logits, actions, rewards, order, groups_per_minibatch, lr, clip, beta,
                      fresh_old=True)


@mistake(grpo_update, "you normalised the rewards over the whole batch; GRPO normalises within each prompt's group")
def _gu_batch_adv(logits, ref_logits, actions, rewards, order, groups_per_minibatch, lr, clip, beta):
    return _grpo_loop(logits, ref_logits, actions, rewards, order, groups_per_minibatch, lr, clip, beta,
                      adv_fn=lambda r: (r - r.mean()) / (r.std() + 1e-6))


@mistake(grpo_update, "you took one step per epoch on the whole batch; take one step per minibatch of "
                      "groups_per_minibatch groups")
def _gu_whole_batch(logits, ref_logits, actions, rewards, order, groups_per_minibatch, lr, clip, beta):
    return _grpo_loop(logits, ref_logits, actions, rewards, order, groups_per_minibatch, lr, clip, beta,
                      batches=lambda perm: [perm])


@mistake(grpo_update, "the minibatches ignore `order`: epoch e visits the prompts in the order of row e")
def _gu_no_order(logits, ref_logits, actions, rewards, order, groups_per_minibatch, lr, clip, beta):
    return _grpo_loop(logits, ref_logits, actions, rewards, torch.arange(logits.shape[0]).expand_as(order),
                      groups_per_minibatch, lr, clip, beta)


def _optimistic_loss(theta, old_logp, adv, ref_logits, actions, idx, clip, beta):
    logp = torch.log_softmax(theta[idx], dim=-1).gather(-1, actions[idx])
    ratio = torch.exp(logp - old_logp[idx])
    a = adv[idx]
    surrogate = torch.maximum(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)
    log_q = torch.log_softmax(ref_logits[idx], dim=-1).gather(-1, actions[idx]) - logp
    return -(surrogate - beta * (torch.exp(log_q) - log_q - 1)).mean()


def _kl_rewarded_loss(theta, old_logp, adv, ref_logits, actions, idx, clip, beta):
    return _grpo_minibatch_loss(theta, old_logp, adv, ref_logits, actions, idx, clip, -beta)


def _summed_loss(theta, old_logp, adv, ref_logits, actions, idx, clip, beta):
    n = actions[idx].numel()
    return n * _grpo_minibatch_loss(theta, old_logp, adv, ref_logits, actions, idx, clip, beta)


def _register_loss_mistakes():
    """The mistakes that change only the minibatch loss, each a ``loss_fn`` of :func:`_grpo_loop`."""
    for loss_fn, cause in (
            (_optimistic_loss, "you took the maximum of the clipped and unclipped terms; the surrogate takes the "
                               "MINIMUM (the pessimistic one)"),
            (_kl_rewarded_loss, "the KL term has the wrong sign: the loss must ADD beta * k3, so that moving away "
                                "from the reference is penalised"),
            (_summed_loss, "you summed the per-sample losses; average them over the minibatch's samples")):
        def variant(logits, ref_logits, actions, rewards, order, groups_per_minibatch, lr, clip, beta, _f=loss_fn):
            return _grpo_loop(logits, ref_logits, actions, rewards, order, groups_per_minibatch, lr, clip, beta,
                              loss_fn=_f)
        variant.__name__ = f"_gu{loss_fn.__name__}"
        mistake(grpo_update, cause)(variant)


_register_loss_mistakes()
