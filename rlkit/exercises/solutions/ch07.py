r"""Checkers for the exercises of chapter 7, ``lessons/07_tiny_llm.ipynb``.

* ``response_logprob(logits, response_ids, mask)``: the log-probability of each response,
  :math:`\log\pi(y\mid x) = \sum_t m_t \log\mathrm{softmax}(z_t)_{y_t}`, ``[B, T, V]`` -> ``[B]``.
* ``min_p_logprobs(logits, min_p)``: the log-probabilities of min-p sampling: keep the tokens whose
  probability is at least ``min_p`` times the largest one, renormalise over them, ``-inf`` elsewhere.
  (The chapter displays ``rlkit.llm.sampling_logprobs``, which does top-k and top-p; this is the rule
  it does not have.)
* ``group_advantages_by_prompt(rewards, prompt_ids)``: GRPO's group-normalised advantages,
  :math:`(r_i - \bar r_g)/(\mathrm{std}_g + \zeta)`, :math:`\zeta = 10^{-6}`, with the sample standard
  deviation, for groups given by prompt ids: in any order and of any size (a group of one gets 0).
  (The chapter displays ``rlkit.llm.sequence_advantages``, which needs consecutive groups of one size.)
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


# ------------------------------------------------------------------- 2. min_p_logprobs

def _min_p_keep(logp, min_p):
    """The kept tokens of min-p: log pi(v) >= log pi_max + log(min_p) (all of them when min_p = 0)."""
    top = logp.max(dim=-1, keepdim=True).values
    if min_p == 0.0:
        return torch.ones_like(logp, dtype=torch.bool)
    return logp >= top + torch.log(torch.as_tensor(min_p, dtype=logp.dtype))


def _minp_cases():
    g = torch.Generator().manual_seed(11)
    banned = torch.randn(3, 8, generator=g) * 2
    banned[:, 5] = float("-inf")                                  # a token the model may never emit
    return [
        Case(args=(torch.log(torch.tensor([0.05, 0.5, 0.15, 0.3])), 0.5),
             label="p = [0.05, 0.5, 0.15, 0.3], min_p = 0.5 keeps 0.5 and 0.3 (threshold 0.25)"),
        Case(args=(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), 0.2),
             label="min_p = 0.2: threshold 0.1 keeps three"),
        Case(args=(torch.tensor([3.0, 0.0, -1.0, -4.0]), 0.0), label="min_p = 0 keeps every token"),
        Case(args=(torch.tensor([2.0, 2.0, 1.0]), 1.0), label="min_p = 1 keeps the two tied top tokens"),
        Case(args=(torch.randn(4, 10, generator=g) * 2, 0.1), label="a batch of 4 rows, min_p = 0.1"),
        Case(args=(banned, 0.05), label="a token at -inf stays at -inf"),
        Case(args=(torch.randn(2, 6, generator=g, dtype=torch.float64) * 60, 0.3),
             label="large logits (float64): probabilities far below float range"),
    ]


@exercise(chapter=7, cases=_minp_cases, atol=1e-5, description="min-p sampling distribution")
def min_p_logprobs(logits, min_p):
    """Min-p sampling distribution, log space; logits [..., V] -> [..., V] with -inf outside."""
    V.has_categories(logits, "logits")
    min_p = V.real_in(min_p, "min_p", 0.0, 1.0)
    logp = torch.log_softmax(logits, dim=-1)
    return torch.log_softmax(logp.masked_fill(~_min_p_keep(logp, min_p), float("-inf")), dim=-1)


@mistake(min_p_logprobs, "you compared with min_p itself: the threshold is RELATIVE, min_p times the "
         "probability of the most likely token")
def _minp_absolute(logits, min_p):
    logp = torch.log_softmax(logits, dim=-1)
    keep = logp.exp() >= min_p
    keep = keep | (logp == logp.max(-1, keepdim=True).values)      # (the top token is kept either way)
    return torch.log_softmax(logp.masked_fill(~keep, float("-inf")), dim=-1)


@mistake(min_p_logprobs, "you compared logits (z_v >= min_p * z_max); min-p compares probabilities, "
         "pi(v) >= min_p * max pi, that is log pi(v) >= log pi_max + log(min_p)")
def _minp_on_logits(logits, min_p):
    logp = torch.log_softmax(logits, dim=-1)
    keep = logits >= min_p * logits.max(-1, keepdim=True).values
    return torch.log_softmax(logp.masked_fill(~keep, float("-inf")), dim=-1)


@mistake(min_p_logprobs, "the kept tokens were not renormalised (their probabilities must sum to 1)")
def _minp_not_renormalised(logits, min_p):
    logp = torch.log_softmax(logits, dim=-1)
    return logp.masked_fill(~_min_p_keep(logp, float(min_p)), float("-inf"))


@mistake(min_p_logprobs, "you kept min_p of the MASS (a top-p rule with p = min_p); min-p keeps every token "
         "whose probability is at least min_p times the largest")
def _minp_as_top_p(logits, min_p):
    logp = torch.log_softmax(logits, dim=-1)
    if min_p == 0.0:
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    probs = sorted_logp.exp()
    keep_sorted = (probs.cumsum(-1) - probs) < min_p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return torch.log_softmax(logp.masked_fill(~keep, float("-inf")), dim=-1)


# ------------------------------------------------------------------- 3. group_advantages_by_prompt

def _group_stats(rewards, prompt_ids, unbiased=True):
    """Per response: the deviation from its group's mean and its group's standard deviation."""
    _, inv = torch.unique(prompt_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1
    zeros = torch.zeros(n_groups, dtype=rewards.dtype)
    count = zeros.index_add(0, inv, torch.ones_like(rewards))
    mean = zeros.index_add(0, inv, rewards) / count
    dev = rewards - mean[inv]
    var = zeros.index_add(0, inv, dev * dev) / ((count - 1).clamp_min(1) if unbiased else count)
    return dev, var.sqrt()[inv], count[inv]


def _gbp_cases():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 5, (30,), generator=g) * 7 + 2          # ids 2, 9, ..., 30 in random order
    return [
        Case(args=(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])),
             label="two consecutive groups of 4"),
        Case(args=(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), torch.tensor([5, 3, 5, 3, 5, 3])),
             label="two interleaved groups of 3 (ids 5 and 3)"),
        Case(args=(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0]),
                   torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])),
             label="groups of sizes 3, 2, 4; the first all correct: advantages 0, not NaN"),
        Case(args=(torch.tensor([0.7, 1.0, 0.0, 0.3]), torch.tensor([4, 1, 1, 9])),
             label="two groups of ONE response (ids 4 and 9): advantage 0"),
        Case(args=(torch.rand(30, generator=g, dtype=torch.float64), ids),
             label="30 continuous rewards (float64), 5 prompts in random order and of random sizes"),
    ]


@exercise(chapter=7, cases=_gbp_cases, atol=1e-5,
          description="GRPO's group-normalised advantages for groups given by prompt ids")
def group_advantages_by_prompt(rewards, prompt_ids):
    """(r - group mean) / (group sample std + zeta), zeta = 1e-6; groups by prompt id, any order, any size;
    a group of one response gets 0. rewards [N] float, prompt_ids [N] int64 -> [N]."""
    V.layout("N", floating=True, rewards=rewards)
    V.index_tensor(prompt_ids, "prompt_ids", shape=rewards.shape, shape_of="[N]")
    dev, std, _ = _group_stats(rewards, prompt_ids)
    return dev / (std + 1e-6)


@mistake(group_advantages_by_prompt, "use the sample standard deviation (divide by m - 1 for a group of m, "
         "torch's default)")
def _gbp_population_std(rewards, prompt_ids):
    dev, std, _ = _group_stats(rewards, prompt_ids, unbiased=False)
    return dev / (std + 1e-6)


@mistake(group_advantages_by_prompt, "you normalised over the whole batch; GRPO normalises within each "
         "prompt's group (the responses that share a prompt id)")
def _gbp_batch(rewards, prompt_ids):
    return (rewards - rewards.mean()) / (rewards.std() + 1e-6)


@mistake(group_advantages_by_prompt, "you started a new group wherever the id changes between neighbours: "
         "the responses of one prompt need not be consecutive; group by the id's value")
def _gbp_runs(rewards, prompt_ids):
    starts = torch.ones_like(prompt_ids, dtype=torch.bool)
    starts[1:] = prompt_ids[1:] != prompt_ids[:-1]
    runs = torch.cumsum(starts.long(), 0)
    dev, std, _ = _group_stats(rewards, runs)
    return dev / (std + 1e-6)


@mistake(group_advantages_by_prompt, "you subtracted the mean of the OTHER responses of the group (RLOO's "
         "leave-one-out baseline); GRPO subtracts the group's mean including r_i")
def _gbp_leave_one_out(rewards, prompt_ids):
    dev, std, count = _group_stats(rewards, prompt_ids)
    loo = torch.where(count > 1, dev * count / (count - 1).clamp_min(1), torch.zeros_like(dev))
    return loo / (std + 1e-6)


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
