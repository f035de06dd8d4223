"""Problem set 2, instructor's side: GRPO from scratch on the tiny language model (chapters 4, 7, 8).

The reference solution (one function per task, written as a student would, from tensors and the
chapter-7 sampler up), :func:`reference_namespace`, and the hidden tests ``HIDDEN`` (fresh seeds,
other shapes, padding, groups of equal reward, a learning test on new seeds). The visible tests are
in :mod:`rlkit.exercises.problem_sets.ps2`; the rubric of the written part in
``book/instructor/ps2_rubric.md``.
"""
from __future__ import annotations

import torch

from rlkit.exercises.problem_sets import Test
from rlkit.exercises.problem_sets.ps2 import (
    LEARN_GAIN,
    LEARN_LR,
    LEARN_STEPS,
    assert_close,
    greedy_accuracy,
    random_batch,
    tiny_model,
)

__all__: list[str] = []   # instructor data (the reference and the hidden tests), not library API


# ------------------------------------------------------------------------------------------------
# The reference solution (the answer cells' contents)
# ------------------------------------------------------------------------------------------------

def group_advantages(rewards, group_size, eps=1e-6):
    """GRPO's advantage of each response: (r_i - mean of its group) / (std of its group + eps).

    rewards: [N] float, the responses to one prompt consecutive (N = prompts x group_size).
    The std is the sample std (divide by group_size - 1); a group of equal rewards gets 0.
    Returns [N], same dtype.
    """
    if group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"group_size must be >= 2 and divide len(rewards) = {rewards.numel()}, got {group_size}")
    g = rewards.reshape(-1, group_size)
    centred = g - g.mean(-1, keepdim=True)
    centred = torch.where(g.amax(-1, keepdim=True) == g.amin(-1, keepdim=True), torch.zeros_like(centred), centred)
    return (centred / (g.std(-1, keepdim=True) + eps)).reshape(rewards.shape)


def response_logprobs(model, prompt_ids, prompt_mask, response_ids, mask):
    """log pi(y_t | x, y_<t) of every response token, differentiable, 0 where mask is 0.

    prompt_ids [B, P] (LEFT-padded), prompt_mask [B, P] bool, response_ids [B, T], mask [B, T] (1 at real
    tokens, <eos> included). One forward pass over prompt + response: the logits at position P - 1 + t
    score response token t. Returns [B, T] float.
    """
    P, T = prompt_ids.shape[1], response_ids.shape[1]
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    att = torch.cat([prompt_mask.bool(), torch.ones_like(response_ids, dtype=torch.bool)], dim=1)
    logits = model(ids, attention_mask=att)[:, P - 1:P - 1 + T]
    real = mask.bool()
    logits = logits.masked_fill(~real[..., None], 0.0)          # padding cannot leak NaN/inf into the loss
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, response_ids[..., None]).squeeze(-1)
    return torch.where(real, logp, torch.zeros((), dtype=logp.dtype))


def grpo_loss(logp, logp_old, logp_ref, adv, mask, clip_eps=0.2, beta=0.04):
    """GRPO's loss on a batch of responses, to minimise (a 0-dim tensor).

    logp [B, T] under the policy being trained (with grad); logp_old [B, T] under the policy that
    sampled; logp_ref [B, T] under the frozen reference; adv [B], one advantage per response; mask [B, T].
    Per token: -(min(r A, clip(r, 1 - eps, 1 + eps) A) - beta k3), r = exp(logp - logp_old),
    k3 = exp(logp_ref - logp) - (logp_ref - logp) - 1. Mean over each response's tokens, then over the
    responses that have a token. Masked positions (whatever they hold) do not count.
    """
    real = mask.bool()
    zero = torch.zeros((), dtype=logp.dtype)
    log_r = torch.where(real, logp - logp_old.detach(), zero)
    ratio = torch.exp(log_r)
    a = adv.detach()[:, None].to(logp.dtype)
    surrogate = torch.minimum(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)
    d = torch.where(real, logp_ref.detach() - logp, zero)
    k3 = torch.exp(d) - d - 1
    per_token = torch.where(real, -(surrogate - beta * k3), zero)
    count = real.sum(-1)
    per_seq = per_token.sum(-1) / count.clamp(min=1)
    return per_seq.sum() / (count > 0).sum().clamp(min=1)


def grpo_train(model, tok, task, steps, seed, prompts_per_step=16, group_size=8, lr=1e-4, epochs=1,
               minibatches=2, clip_eps=0.2, beta=0.0, grad_clip=1.0):
    """Train ``model`` in place with GRPO; return the history {"reward", "zero_var_share", "kl"} (one entry per update).

    Each update: draw ``prompts_per_step`` training prompts, sample ``group_size`` responses to each
    (temperature 1, rlkit.llm.sample), score them with the task's exact-match checker, compute the group
    advantages and the old and reference log-probs, then ``epochs`` passes over the groups in random
    order, ``minibatches`` Adam steps per pass on grpo_loss (gradient norm clipped to ``grad_clip``).
    ``kl`` is the per-token k3 estimate of KL(pi_old || pi_ref) on the update's samples.
    """
    import copy
    import random

    from rlkit.llm import sample

    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    history = {"reward": [], "zero_var_share": [], "kl": []}
    for _ in range(steps):
        problems = task.problems(prompts_per_step, rng, split="train")
        rows = [p for p in problems for _ in range(group_size)]
        ids, pmask = tok.encode_batch([p.prompt for p in rows])
        model.eval()
        with torch.no_grad():
            ro = sample(model, ids, pmask, max_new_tokens=task.max_new_tokens, eos_id=tok.eos_id,
                        pad_id=tok.pad_id, generator=gen)
            rewards = task.score(tok.decode_batch(ro.response_ids), rows)
            adv = group_advantages(rewards, group_size)
            old = response_logprobs(model, ids, pmask, ro.response_ids, ro.mask)
            lref = response_logprobs(ref, ids, pmask, ro.response_ids, ro.mask)
            d = (lref - old) * ro.mask
            kl = ((torch.exp(d) - d - 1) * ro.mask).sum() / ro.mask.sum().clamp(min=1)
        flat = rewards.view(-1, group_size)
        history["reward"].append(rewards.mean().item())
        history["zero_var_share"].append((flat.amax(1) == flat.amin(1)).float().mean().item())
        history["kl"].append(kl.item())
        model.train()
        for _ in range(epochs):
            order = torch.randperm(prompts_per_step, generator=gen)
            for chunk in order.chunk(minibatches):
                r = (chunk[:, None] * group_size + torch.arange(group_size)).flatten()
                logp = response_logprobs(model, ids[r], pmask[r], ro.response_ids[r], ro.mask[r])
                loss = grpo_loss(logp, old[r], lref[r], adv[r], ro.mask[r], clip_eps, beta)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
                opt.step()
        model.eval()
    return history


#: The functions whose source makes each answer cell (a solution notebook, and the tests that fill the skeleton).
ANSWER_CELLS = {"group_advantages": ("group_advantages",), "response_logprobs": ("response_logprobs",),
                "grpo_loss": ("grpo_loss",), "grpo_train": ("grpo_train",)}


def reference_namespace() -> dict:
    """The reference answers, as the grader's namespace of a submission holds them."""
    return {"group_advantages": group_advantages, "response_logprobs": response_logprobs,
            "grpo_loss": grpo_loss, "grpo_train": grpo_train}


# ------------------------------------------------------------------------------------------------
# Hidden tests (fresh seeds and inputs)
# ------------------------------------------------------------------------------------------------

def _h_adv_shapes(ns):
    f = ns["group_advantages"]
    g = torch.Generator().manual_seed(9173)
    for G, n, dtype in [(3, 5, torch.float32), (16, 2, torch.float64), (2, 7, torch.float64)]:
        r = torch.randint(0, 3, (n * G,), generator=g).to(dtype) * 0.5
        got = f(r, G)
        assert isinstance(got, torch.Tensor) and got.shape == r.shape, \
            f"group_size {G}: expected shape {tuple(r.shape)}, got {getattr(got, 'shape', type(got))}"
        assert got.dtype == dtype, f"the advantages should keep the rewards' dtype {dtype}, got {got.dtype}"
        assert_close(got, group_advantages(r, G), f"group_size {G}, {n} groups", atol=1e-4)


def _h_adv_equal(ns):
    f = ns["group_advantages"]
    r = torch.tensor([0.3] * 6 + [1.0, 0.0, 1.0, 1.0, 0.0, 0.0] + [-2.0] * 6, dtype=torch.float64)
    got = f(r, 6)
    assert torch.isfinite(got).all(), "groups of equal rewards gave NaN/inf"
    assert got[:6].abs().max() < 1e-9 and got[12:].abs().max() < 1e-9, \
        f"a group whose rewards are all equal must get advantage 0, got {got[:6].tolist()} and {got[12:].tolist()}"
    assert_close(got[6:12], group_advantages(r, 6)[6:12], "the mixed group between two equal ones", atol=1e-5)


def _h_logprobs_padding(ns):
    f = ns["response_logprobs"]
    model = tiny_model(31)
    ids, pmask, resp, mask = random_batch(4242, B=7, P=6, T=5, vocab=model.config.vocab_size, min_prompt=1)
    mask[3] = 0                                             # a row with no response token at all
    resp_garbage = resp.clone()
    resp_garbage[mask == 0] = 0
    got = f(model, ids, pmask, resp_garbage, mask)
    want = response_logprobs(model, ids, pmask, resp_garbage, mask)
    assert got.shape == want.shape, f"expected shape {tuple(want.shape)}, got {tuple(got.shape)}"
    assert torch.isfinite(got).all(), "NaN/inf in the log-probs (a row without tokens, or padding)"
    assert (got[mask == 0] == 0).all(), "positions where mask is 0 must hold 0"
    assert_close(got, want, "left-padded prompts of lengths 1..6, a row without tokens", atol=1e-4)


def _h_loss_padding(ns):
    f = ns["grpo_loss"]
    g = torch.Generator().manual_seed(5150)
    B, T = 6, 9
    logp = (-3 * torch.rand(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    old = logp.detach() + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lref = logp.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = (torch.arange(T)[None] < torch.tensor([9, 1, 4, 0, 7, 2])[:, None]).to(torch.float64)
    old2, lref2 = old.clone(), lref.clone()
    old2[mask == 0] = -1e4                                  # garbage where nothing was sampled
    lref2[mask == 0] = 1e4
    got = f(logp, old2, lref2, adv, mask, 0.15, 0.1)
    want = grpo_loss(logp, old, lref, adv, mask, 0.15, 0.1)
    assert torch.isfinite(got), f"the loss is {got.item()} when padded positions hold huge log-probs"
    assert_close(got, want, "rows of 9, 1, 4, 0, 7, 2 tokens (one row empty), clip 0.15, beta 0.1", atol=1e-8)
    (gg,) = torch.autograd.grad(got, logp)
    (gw,) = torch.autograd.grad(want, logp)
    assert torch.isfinite(gg).all() and (gg[mask == 0] == 0).all(), "padded positions must get a zero gradient"
    assert_close(gg, gw, "the gradient on rows of different lengths", atol=1e-8)


def _h_train_learns(ns):
    """Fresh seeds 101 and 202: each run raises the held-out greedy accuracy by >= LEARN_GAIN (credit per seed)."""
    from rlkit.llm import ADDITION, load_pretrained

    base_model, tok = load_pretrained()
    test = ADDITION.problems(160, seed=777, split="test")
    base = greedy_accuracy(base_model, tok, ADDITION, test)
    ok = 0
    gains = []
    for seed in (101, 202):
        model, _ = load_pretrained()
        torch.manual_seed(seed)
        hist = ns["grpo_train"](model, tok, ADDITION, steps=LEARN_STEPS, seed=seed, lr=LEARN_LR)
        assert len(hist["reward"]) == LEARN_STEPS, f"history['reward'] has {len(hist['reward'])} entries"
        gain = greedy_accuracy(model, tok, ADDITION, test) - base
        gains.append(round(gain, 3))
        ok += gain >= LEARN_GAIN
    assert ok > 0, f"held-out greedy accuracy gains {gains} on seeds 101, 202 (expected >= {LEARN_GAIN:g} on each)"
    return ok / 2


HIDDEN: tuple[Test, ...] = (
    Test("hidden_advantages_shapes_dtypes", "group_advantages", 2.0, _h_adv_shapes),
    Test("hidden_advantages_equal_groups", "group_advantages", 2.0, _h_adv_equal),
    Test("hidden_logprobs_padding", "response_logprobs", 4.0, _h_logprobs_padding),
    Test("hidden_loss_padding_and_empty_rows", "grpo_loss", 4.0, _h_loss_padding),
    Test("hidden_train_learns_fresh_seeds", "grpo_train", 8.0, _h_train_learns, timeout=180.0),
)
