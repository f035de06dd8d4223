"""Tests of rlkit.llm.dro (chapter 19): group tasks, DRO weights on per-prompt losses, the hook and the wrapper."""
import random

import pytest
import torch

from rlkit.dro import cvar, group_dro_step, kl_dro
from rlkit.llm import ADDITION, GPT, CharTokenizer, GPTConfig, RLConfig, has_carry, sequence_advantages, train
from rlkit.llm.dro import (
    ADDITION_GROUPS,
    DROWeights,
    GroupAccuracy,
    dro_prompt_weights,
    group_accuracy,
    group_mixture,
    group_problems,
    mix_accuracy,
    train_dro,
)
from rlkit.llm.trainer import Hook


def test_group_mixture_draws_the_asked_shares_and_labels_groups():
    task = group_mixture(ADDITION_GROUPS, {"carry": 0.1, "no carry": 0.9})
    probs = task.problems(3000, seed=0)
    share = sum(p.info["group"] == "carry" for p in probs) / len(probs)
    assert abs(share - 0.1) < 0.02
    for p in probs[:200]:
        a, b = p.info["a"], p.info["b"]
        assert (p.info["group"] == "carry") == has_carry(a, b) and p.answer == str(a + b)
        assert not task.is_heldout(p.prompt)
    zero = group_mixture(ADDITION_GROUPS, {"carry": 0.0, "no carry": 1.0}).problems(300, seed=1)
    assert all(p.info["group"] == "no carry" for p in zero)
    with pytest.raises(ValueError, match="mix"):
        group_mixture(ADDITION_GROUPS, {"carry": 0.5})
    with pytest.raises(ValueError, match="mix"):
        group_mixture(ADDITION_GROUPS, {"carry": 0.5, "no carry": 0.6})


def test_group_problems_are_held_out_and_pure():
    ev = group_problems(ADDITION_GROUPS, 50, seed=3)
    task = group_mixture(ADDITION_GROUPS, {"carry": 0.5, "no carry": 0.5})
    for g, probs in ev.items():
        assert len(probs) == 50 and all(p.info["group"] == g and task.is_heldout(p.prompt) for p in probs)


def test_mix_accuracy_is_the_weighted_sum():
    assert mix_accuracy({"carry": 0.2, "no carry": 1.0}, {"carry": 0.9, "no carry": 0.1}) == pytest.approx(0.28)
    with pytest.raises(ValueError, match="mix"):
        mix_accuracy({"carry": 0.2}, {"carry": 0.5, "x": 0.5})


def test_prompt_weights_by_hand_and_against_the_library():
    G = 2
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])           # prompts: rates 0.5, 1, 0
    groups = ["a", "b", "b"]
    assert torch.equal(dro_prompt_weights(r, G, groups, "erm"), torch.ones(6))
    w = dro_prompt_weights(r, G, groups, "group", q={"a": 0.75, "b": 0.25})
    # group a: 1 prompt of 3 -> w = 0.75 * 3 / 1; group b: 2 prompts -> w = 0.25 * 3 / 2
    assert torch.allclose(w, torch.tensor([2.25, 2.25, 0.375, 0.375, 0.375, 0.375]))
    assert float(w.mean()) == pytest.approx(1.0)
    only_b = dro_prompt_weights(r, G, ["b", "b", "b"], "group", q={"a": 0.9, "b": 0.1})
    assert torch.allclose(only_b, torch.ones(6))                # an absent group's weight is not lost
    rate = torch.tensor([0.5, 1.0, 0.0], dtype=torch.float64)
    wk = dro_prompt_weights(r, G, groups, "kl", eps=0.3)
    assert torch.allclose(wk[::2].double(), kl_dro(rate, 0.3).weights * 3, atol=1e-6)
    wc = dro_prompt_weights(r, G, groups, "cvar", alpha=0.5)
    assert torch.allclose(wc[::2].double(), cvar(rate, 0.5).weights * 3, atol=1e-6)
    assert torch.allclose(wc[::2], torch.tensor([1.0, 0.0, 2.0]))
    with pytest.raises(ValueError, match="groups"):
        dro_prompt_weights(r, G, ["a"], "erm")
    with pytest.raises(ValueError, match="method"):
        dro_prompt_weights(r, G, groups, "wasserstein")
    with pytest.raises(ValueError, match="q"):
        dro_prompt_weights(r, G, groups, "group")


def _tiny():
    tok = CharTokenizer()
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16, block_size=16)), tok


def test_weighted_advantages_equal_the_weighted_loss():
    # PPO-clip is linear in a positive advantage scale: min(rho w A, clip(rho) w A) = w min(rho A, clip(rho) A)
    from rlkit.llm import policy_loss
    cfg = RLConfig(algo="dr_grpo").resolved()
    g = torch.Generator().manual_seed(0)
    lp, lo = -torch.rand(4, 3, generator=g), -torch.rand(4, 3, generator=g)
    mask = torch.ones(4, 3)
    adv = torch.randn(4, generator=g)[:, None].expand(4, 3)
    w = torch.tensor([2.0, 0.5, 1.0, 0.5])[:, None]
    weighted, _ = policy_loss(cfg, lp, lo, adv * w, mask)
    per_row = torch.stack([policy_loss(cfg, lp[i:i + 1], lo[i:i + 1], adv[i:i + 1], mask[i:i + 1])[0]
                           for i in range(4)])
    assert torch.allclose(weighted, (w.flatten() * per_row).mean(), atol=1e-6)


def test_train_dro_runs_and_moves_group_weights_towards_the_worse_group():
    model, tok = _tiny()
    task = group_mixture(ADDITION_GROUPS, {"carry": 0.5, "no carry": 0.5})
    ev = {g: p[:8] for g, p in group_problems(ADDITION_GROUPS, 8).items()}
    cfg = RLConfig(algo="dr_grpo", steps=2, prompts_per_step=4, group_size=2)
    res = train_dro(model, tok, task, cfg, method="group", step_size=1.0, eval_groups=ev)
    assert res.evals["step"] == [0, 2] and set(res.evals) == {"step", "train_seconds", "carry", "no carry"}
    assert len(res.group_weights) == 2 and abs(sum(res.group_weights[-1].values()) - 1) < 1e-9
    assert all(0.0 <= a <= 1.0 for g in ev for a in res.evals[g]) and res.method == "group"
    for shares, carry, no_carry in zip(res.history["group_share"], res.history["group_share/carry"],
                                       res.history["group_share/no carry"]):
        assert sum(shares.values()) == pytest.approx(1.0) and carry + no_carry == pytest.approx(1.0)
        assert shares.get("carry", 0.0) == carry and all(x > 0 for x in shares.values())
    assert train_dro(_tiny()[0], tok, task, cfg, eval_groups=ev, eval_every=1).evals["step"] == [0, 1, 2]
    for m in ("erm", "kl", "cvar"):
        r = train_dro(_tiny()[0], tok, task, cfg.replace(steps=1), method=m)
        assert len(r.history["reward"]) == 1 and r.group_weights == [] and r.evals["step"] == []
    with pytest.raises(ValueError, match="dr_grpo"):
        train_dro(model, tok, task, cfg.replace(algo="grpo"))
    with pytest.raises(ValueError, match="method"):
        train_dro(model, tok, task, cfg, method="tv")


@pytest.mark.parametrize("field,value", [("eval_every", 1), ("eval_problems", 8)])
def test_the_wrapper_refuses_the_fields_it_never_read(field, value):
    # rlkit 0.2's train_dro accepted these and ignored them (its own evaluation schedule)
    model, tok = _tiny()
    task = group_mixture(ADDITION_GROUPS, {"carry": 0.5, "no carry": 0.5})
    cfg = RLConfig(algo="dr_grpo", steps=1, prompts_per_step=2, group_size=2)
    with pytest.raises(ValueError, match=f"train_dro does not read RLConfig.{field} "):
        train_dro(model, tok, task, cfg.replace(**{field: value}))
    # rlkit 0.2's KL, critic and dense-reward fields (refused here before) are no longer settings of RLConfig
    with pytest.raises(ValueError, match=r"RLConfig.log_kl .*KLPenalty"):
        cfg.replace(log_kl=False)


class Probe(Hook):
    def __init__(self):
        self.seen = []

    def on_advantages(self, run, step):
        self.seen.append((step.batch, step.adv.clone(), step.rollout.mask.clone()))


@pytest.mark.parametrize("method", ["erm", "group", "kl", "cvar"])
def test_the_hook_scales_each_prompts_group_advantage_by_its_weight(method):
    model, tok = _tiny()
    task = group_mixture(ADDITION_GROUPS, {"carry": 0.5, "no carry": 0.5})
    cfg = RLConfig(algo="dr_grpo", steps=2, prompts_per_step=4, group_size=4)
    hook, probe = DROWeights(method, step_size=2.0, eps=0.3, alpha=0.5, groups=["carry", "no carry"]), Probe()
    q_before = []

    class Q(Hook):                      # the adversary's weights as the hook will find them
        def on_batch(self, run, step):
            q_before.append(dict(hook.q))

    res = train(model, tok, task, cfg, hooks=[Q(), hook, probe], evaluation=False)
    for k, (batch, adv, mask) in enumerate(probe.seen):
        groups = [p.info["group"] for p in batch.problems[::4]]
        q = res.group_weights[k] if method == "group" else None
        w = dro_prompt_weights(batch.rewards, 4, groups, method, q=q, eps=0.3, alpha=0.5)
        want = (sequence_advantages(batch.rewards, "dr_grpo", 4) * w)[:, None] * mask
        assert torch.allclose(adv, want, atol=1e-7)
        if method == "group":              # one exponentiated-gradient step from the previous weights
            prev = q_before[k] if k else {"carry": 0.5, "no carry": 0.5}
            rates = batch.rewards.double().view(-1, 4).mean(1)
            v = torch.tensor([float(rates[[i for i, g in enumerate(groups) if g == h]].mean()) if h in groups
                              else float("nan") for h in ("carry", "no carry")], dtype=torch.float64)
            step = group_dro_step(torch.tensor([prev["carry"], prev["no carry"]], dtype=torch.float64), v, 2.0)
            assert [res.group_weights[k]["carry"], res.group_weights[k]["no carry"]] == pytest.approx(step.tolist())
    assert (res.group_weights == []) == (method != "group")


def test_group_accuracy_is_an_evaluation_and_the_hook_needs_groups():
    model, tok = _tiny()
    ev = {g: p[:4] for g, p in group_problems(ADDITION_GROUPS, 4, seed=2).items()}
    task = group_mixture(ADDITION_GROUPS, {"carry": 0.5, "no carry": 0.5})
    cfg = RLConfig(algo="dr_grpo", steps=2, prompts_per_step=2, group_size=2, eval_every=1)
    res = train(model, tok, task, cfg, hooks=[DROWeights("group")], evaluation=GroupAccuracy(ev))
    assert res.evals["step"] == [0, 1, 2] and res.evals["carry"][-1] == group_accuracy(model, tok, ev)["carry"]
    with pytest.raises(ValueError, match="group"):
        train(_tiny()[0], tok, ADDITION, cfg, hooks=[DROWeights("erm")], evaluation=False)


def test_group_accuracy_matches_a_slow_loop():
    model, tok = _tiny()
    ev = {g: p[:6] for g, p in group_problems(ADDITION_GROUPS, 6, seed=2).items()}
    acc = group_accuracy(model, tok, ev)
    from rlkit.llm import ADDITION, evaluate
    for g, probs in ev.items():
        slow = sum(evaluate(model, tok, ADDITION, [p])["accuracy"] for p in probs) / len(probs)
        assert acc[g] == pytest.approx(slow)
    random.seed(0)
    assert group_dro_step(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]), 1.0)[1] > 0.5
