"""Problem set 2: GRPO from scratch on the tiny language model (chapters 4, 7, 8). The student's side.

Tasks (answer cells of ``lessons/problem_sets/ps2_grpo_from_scratch.ipynb``):

* ``group_advantages(rewards, group_size, eps=1e-6)``: GRPO's group-relative advantages;
* ``response_logprobs(model, prompt_ids, prompt_mask, response_ids, mask)``: per-token log-probabilities
  of sampled responses under the policy, differentiable, 0 on padding;
* ``grpo_loss(logp, logp_old, logp_ref, adv, mask, clip_eps=0.2, beta=0.04)``: the clipped surrogate
  with a k3 KL term to the reference, per response token-mean then mean over responses;
* ``grpo_train(model, tok, task, steps, seed, ...)``: the outer loop, returning a history dict.

The visible tests below compare against hand-worked cases and against independent compositions of
rlkit's public pieces (``rlkit.llm.token_logprobs``, ``rlkit.objectives.ppo_clip_loss``,
``rlkit.divergences.kl_k3``); no reference solution ships here.
"""
from __future__ import annotations

import torch

from . import ProblemSet, Test, register_problem_set

__all__ = ["PS2", "LEARN_STEPS", "LEARN_LR", "LEARN_GAIN"]

#: The learning tests' budget, in updates and Adam step size (16 prompts x 8 responses per update).
LEARN_STEPS = 20
#: The Adam step size of the learning tests.
LEARN_LR = 3e-4
#: The gain of held-out greedy accuracy (on 160 test problems) a learning test asks of each run.
LEARN_GAIN = 0.10


# ------------------------------------------------------------------------------------------------
# helpers shared with the instructor's hidden tests
# ------------------------------------------------------------------------------------------------

def assert_close(got, want, what: str, atol: float = 1e-5) -> None:
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: expected a tensor, got {type(got).__name__}")
    if got.shape != want.shape:
        raise AssertionError(f"{what}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}")
    g, w = got.detach().double(), want.detach().double()
    if not torch.isfinite(g).all():
        raise AssertionError(f"{what}: the result has NaN or inf")
    err = (g - w).abs().max().item() if g.numel() else 0.0
    if err > atol:
        raise AssertionError(f"{what}: largest error {err:.2e} (allowed {atol:g})")


def tiny_model(seed: int):
    """A small random GPT of chapter 7's architecture (fast; its log-probs are far from uniform)."""
    from rlkit.llm.model import GPT, GPTConfig
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=23, block_size=24, n_layer=1, n_head=2, n_embd=16))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model.eval()


def random_batch(seed: int, B: int, P: int, T: int, vocab: int, min_prompt: int = 1):
    """Left-padded prompts of random lengths in [min_prompt, P] and responses with random lengths >= 1."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_prompt, P + 1, (B,), generator=g)
    pmask = torch.arange(P)[None] >= (P - lens)[:, None]
    ids = torch.randint(2, vocab, (B, P), generator=g).masked_fill(~pmask, 0)
    rlen = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < rlen[:, None]).float()
    resp = torch.randint(1, vocab, (B, T), generator=g)
    return ids, pmask, resp, mask


def greedy_accuracy(model, tok, task, problems) -> float:
    from rlkit.llm import evaluate
    return float(evaluate(model, tok, task, problems, greedy=True)["accuracy"])


# ------------------------------------------------------------------------------------------------
# group_advantages
# ------------------------------------------------------------------------------------------------

def _adv_hand(ns):
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0])
    got = ns["group_advantages"](r, 4)
    want = torch.tensor([1.5, -0.5, -0.5, -0.5] + [3 ** 0.5 / 2] * 2 + [-(3 ** 0.5) / 2] * 2)
    if isinstance(got, torch.Tensor) and got.shape == r.shape:
        g = got.detach().double()
        if torch.allclose(g, torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0]).double() - 0.375, atol=1e-3):
            raise AssertionError("you subtracted the mean of the whole batch: GRPO's baseline is each group's own mean")
        if torch.allclose(g[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]).double(), atol=1e-3):
            raise AssertionError("the advantages are not divided by the group's standard deviation")
        if torch.allclose(g[:4], torch.tensor([3 ** 0.5, -1 / 3 ** 0.5, -1 / 3 ** 0.5, -1 / 3 ** 0.5]).double(),
                          atol=1e-3):
            raise AssertionError("you divided by the population std (by G); GRPO uses the sample std (by G - 1, "
                                 "torch's default)")
    assert_close(got, want, "rewards [1,0,0,0 | 1,1,0,0] in groups of 4 (hand-worked: 1.5, -0.5, ..., ±0.866)",
                  atol=1e-4)


def _adv_equal(ns):
    r = torch.tensor([1.0] * 4 + [0.0] * 4 + [0.5, 0.5, 0.5, 0.5])
    got = ns["group_advantages"](r, 4)
    assert isinstance(got, torch.Tensor) and torch.isfinite(got).all(), \
        "groups whose rewards are all equal gave NaN/inf (their std is 0: add eps, or treat them apart)"
    assert got.abs().max().item() < 1e-6, \
        f"a group of equal rewards must get advantage 0 everywhere, got {got.tolist()}"


def _adv_random(ns):
    from rlkit.objectives import grpo_advantages
    g = torch.Generator().manual_seed(3)
    r = torch.rand(40, generator=g, dtype=torch.float64)
    assert_close(ns["group_advantages"](r, 8), grpo_advantages(r, 8), "40 random rewards in groups of 8", 1e-5)


# ------------------------------------------------------------------------------------------------
# response_logprobs
# ------------------------------------------------------------------------------------------------

def _lp_case(seed, padded):
    from rlkit.llm import token_logprobs
    model = tiny_model(seed)
    ids, pmask, resp, mask = random_batch(seed, B=5, P=5, T=4, vocab=model.config.vocab_size,
                                           min_prompt=1 if padded else 5)
    return model, ids, pmask, resp, mask, token_logprobs(model, ids, pmask, resp, mask)


def _lp_unpadded(ns):
    model, ids, pmask, resp, mask, want = _lp_case(11, padded=False)
    got = ns["response_logprobs"](model, ids, pmask, resp, mask)
    if isinstance(got, torch.Tensor) and got.shape == want.shape:
        full = torch.log_softmax(model(torch.cat([ids, resp], 1)), -1)
        P, T = ids.shape[1], resp.shape[1]
        shifted = full[:, P:P + T].gather(-1, resp[..., None]).squeeze(-1) * mask
        if (got.detach() - want).abs().max() > 1e-4 and (got.detach() - shifted).abs().max() < 1e-4:
            raise AssertionError("off by one: the logits at position P - 1 + t score response token t "
                                 "(a position's logits predict the NEXT token)")
    assert_close(got, want, "5 prompts of 5 tokens, responses of 1-4 tokens, a random 1-layer GPT", atol=1e-4)


def _lp_padded(ns):
    model, ids, pmask, resp, mask, want = _lp_case(12, padded=True)
    got = ns["response_logprobs"](model, ids, pmask, resp, mask)
    if isinstance(got, torch.Tensor) and got.shape == want.shape and (got.detach() - want).abs().max() > 1e-4:
        from rlkit.llm import token_logprobs
        nomask = token_logprobs(model, ids, torch.ones_like(pmask), resp, mask)
        if (got.detach() - nomask).abs().max() < 1e-4:
            raise AssertionError("with left-padded prompts, pass the attention mask (prompt_mask, then ones for the "
                                 "response) to the model: padding must be neither attended to nor counted in positions")
    assert_close(got, want, "left-padded prompts of 1-5 tokens", atol=1e-4)


def _lp_masked_and_grad(ns):
    model, ids, pmask, resp, mask, want = _lp_case(13, padded=True)
    got = ns["response_logprobs"](model, ids, pmask, resp, mask)
    assert isinstance(got, torch.Tensor) and got.shape == want.shape, "expected a [B, T] tensor"
    assert (got[mask == 0] == 0).all(), "positions where mask is 0 must hold exactly 0"
    assert got.requires_grad, "the log-probs must be differentiable (no torch.no_grad(), no .detach())"
    (got * mask).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads), "no gradient reached the model's parameters"


# ------------------------------------------------------------------------------------------------
# grpo_loss
# ------------------------------------------------------------------------------------------------

def _loss_inputs(seed, B=6, T=7):
    g = torch.Generator().manual_seed(seed)
    logp = (-2 * torch.rand(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = logp.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lens = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lens[:, None]).to(torch.float64)
    return logp, old, ref, adv, mask


def _independent_loss(logp, old, ref, adv, mask, eps, beta):
    """rlkit's pieces composed: PPO-clip and k3, each a token mean per response, then a mean over responses."""
    from rlkit.divergences import kl_k3
    from rlkit.objectives import aggregate, ppo_clip_loss
    pg, _ = ppo_clip_loss(logp, old, adv[:, None].expand_as(logp), eps=eps, mask=mask,
                          aggregation="seq-mean-token-mean")
    return pg + beta * aggregate(kl_k3(logp, ref), mask, "seq-mean-token-mean")


def _loss_no_kl(ns):
    logp, old, ref, adv, mask = _loss_inputs(21)
    got = ns["grpo_loss"](logp, old, ref, adv, mask, 0.2, 0.0)
    want = _independent_loss(logp, old, ref, adv, mask, 0.2, 0.0)
    if isinstance(got, torch.Tensor) and got.dim() == 0 and abs(got.item() + want.item()) < 1e-8 < abs(want.item()):
        raise AssertionError("the sign is flipped: return the loss to MINIMISE, minus the surrogate")
    assert_close(got, want, "beta = 0: the clipped surrogate, token mean per response then mean over responses",
                  1e-8)


def _loss_kl(ns):
    logp, old, ref, adv, mask = _loss_inputs(22)
    got = ns["grpo_loss"](logp, old, ref, adv, mask, 0.2, 0.3)
    want = _independent_loss(logp, old, ref, adv, mask, 0.2, 0.3)
    k1 = _independent_loss(logp, old, ref, adv, mask, 0.2, 0.0) + 0.3 * ((logp - ref) * mask).sum() / mask.sum()
    if isinstance(got, torch.Tensor) and got.dim() == 0 and abs(got.item() - k1.item()) < 1e-6:
        raise AssertionError("the KL term looks like k1 (log pi - log pi_ref); GRPO's is k3 = e^d - d - 1, "
                             "d = log pi_ref - log pi")
    assert_close(got, want, "beta = 0.3: the clipped surrogate plus beta times k3", 1e-8)


def _loss_clip_gradient(ns):
    logp, old, ref, adv, mask = _loss_inputs(23)
    mask = torch.ones_like(mask)
    adv = torch.ones_like(adv)
    old = logp.detach().clone()
    old[:, :3] -= 0.5                                    # ratio e^0.5 = 1.65 > 1.2 with A > 0: clipped, no gradient
    loss = ns["grpo_loss"](logp, old, ref, adv, mask, 0.2, 0.0)
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0, "grpo_loss must return a 0-dim tensor"
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad[:, :3].abs().max() < 1e-12, \
        "tokens whose ratio is above 1 + eps with a positive advantage must get no gradient (the clip)"
    assert grad[:, 3:].abs().min() > 0, "unclipped tokens (ratio 1) must get a gradient"


def _loss_padding(ns):
    logp, old, ref, adv, mask = _loss_inputs(24)
    old2, ref2 = old.clone(), ref.clone()
    old2[mask == 0] = float("-inf")
    ref2[mask == 0] = float("nan")
    got = ns["grpo_loss"](logp, old2, ref2, adv, mask, 0.2, 0.1)
    want = _independent_loss(logp, old, ref, adv, mask, 0.2, 0.1)
    assert_close(got, want, "padded positions holding -inf and NaN (use torch.where, not a product with the mask)",
                  1e-8)
    (grad,) = torch.autograd.grad(got, logp)
    assert torch.isfinite(grad).all(), "the gradient has NaN/inf: padding leaked into it"


# ------------------------------------------------------------------------------------------------
# grpo_train
# ------------------------------------------------------------------------------------------------

def _train_runs(ns):
    from rlkit.llm import ADDITION, load_pretrained
    model, tok = load_pretrained()
    before = [p.detach().clone() for p in model.parameters()]
    hist = ns["grpo_train"](model, tok, ADDITION, steps=2, seed=0)
    assert isinstance(hist, dict), f"grpo_train must return a dict (the history), got {type(hist).__name__}"
    for key in ("reward", "zero_var_share", "kl"):
        assert key in hist and len(hist[key]) == 2, f"history[{key!r}] must have one entry per update (2)"
    assert all(0.0 <= x <= 1.0 for x in hist["reward"]), f"mean rewards must lie in [0, 1], got {hist['reward']}"
    assert abs(hist["kl"][0]) < 1e-6, f"at the first update the policy IS the reference: KL 0, got {hist['kl'][0]}"
    moved = sum((p.detach() - b).abs().sum().item() for p, b in zip(model.parameters(), before))
    assert moved > 0, "the model's parameters did not change: train the model in place"


def _train_learns(ns):
    """Seeds 0 and 1: each run raises the held-out greedy accuracy by >= LEARN_GAIN (credit per seed)."""
    from rlkit.llm import ADDITION, load_pretrained
    base_model, tok = load_pretrained()
    test = ADDITION.problems(160, seed=2024, split="test")
    base = greedy_accuracy(base_model, tok, ADDITION, test)
    gains = []
    for seed in (0, 1):
        model, _ = load_pretrained()
        torch.manual_seed(seed)
        ns["grpo_train"](model, tok, ADDITION, steps=LEARN_STEPS, seed=seed, lr=LEARN_LR)
        gains.append(greedy_accuracy(model, tok, ADDITION, test) - base)
    ok = sum(g >= LEARN_GAIN for g in gains)
    assert ok > 0, (f"after {LEARN_STEPS} updates at lr {LEARN_LR:g} the held-out greedy accuracy changed by "
                    f"{[round(g, 3) for g in gains]} from {base:.3f} (expected a gain of at least {LEARN_GAIN:g} "
                    f"on each seed)")
    return ok / 2


#: Problem set 2 (GRPO from scratch), with its tasks, visible tests and points, registered under ``"ps2"``.
PS2 = register_problem_set(ProblemSet(
    key="ps2",
    title="GRPO from scratch on the tiny language model",
    chapters=(4, 7, 8),
    notebook="lessons/problem_sets/ps2_grpo_from_scratch.ipynb",
    tasks=("group_advantages", "response_logprobs", "grpo_loss", "grpo_train"),
    visible=(
        Test("advantages_hand_case", "group_advantages", 2.0, _adv_hand),
        Test("advantages_equal_groups", "group_advantages", 1.0, _adv_equal),
        Test("advantages_random", "group_advantages", 1.0, _adv_random),
        Test("logprobs_unpadded", "response_logprobs", 2.0, _lp_unpadded),
        Test("logprobs_left_padded", "response_logprobs", 2.0, _lp_padded),
        Test("logprobs_masked_and_differentiable", "response_logprobs", 2.0, _lp_masked_and_grad),
        Test("loss_without_kl", "grpo_loss", 2.0, _loss_no_kl),
        Test("loss_with_k3", "grpo_loss", 2.0, _loss_kl),
        Test("loss_clip_blocks_gradient", "grpo_loss", 2.0, _loss_clip_gradient),
        Test("loss_padding_does_not_leak", "grpo_loss", 2.0, _loss_padding),
        Test("train_runs_and_logs", "grpo_train", 2.0, _train_runs, timeout=60.0),
        Test("train_learns", "grpo_train", 8.0, _train_learns, timeout=180.0),
    ),
    written_points=32.0,
))
