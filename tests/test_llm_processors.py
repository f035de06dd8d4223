"""Logits processors in sampling, log-prob recomputation and training; the reference model is skipped without a KL term.

Independent computations: a processor that bans a token is checked against a hand-built masked
softmax, the context it receives against the rollout it produced, and the trainer's reference
forward passes are counted with a wrapper model.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rlkit.llm import (
    ADDITION,
    CharTokenizer,
    KLPenalty,
    RLConfig,
    apply_logits_processor,
    encode_prompts,
    load_pretrained,
    sample,
    token_logprobs,
    train,
)


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer()


@pytest.fixture(scope="module")
def model():
    m, _ = load_pretrained()
    m.eval()
    return m


def ban(token_id):
    def processor(ids, mask, logits):
        return logits.masked_fill(torch.arange(logits.shape[-1]) == token_id, float("-inf"))
    return processor


def prompts(tok, n=6):
    probs = ADDITION.problems(n, seed=3, split="test")
    probs[0] = type(probs[0])("7+8=", "15")           # a shorter prompt, so the batch is left-padded
    return encode_prompts(probs, tok)


def test_banned_token_is_never_sampled_and_logprobs_are_the_masked_softmax(tok, model):
    ids, mask = prompts(tok)
    banned = tok.encode("1")[0]
    ro = sample(model, ids, mask, max_new_tokens=5, eos_id=tok.eos_id, pad_id=tok.pad_id,
                generator=torch.Generator().manual_seed(0), logits_processor=ban(banned))
    assert not (ro.response_ids[ro.mask.bool()] == banned).any()
    # by hand: the model's logits with the banned entry at -inf, softmaxed, at each response position
    full = torch.cat([ids, ro.response_ids], 1)
    att = torch.cat([mask, torch.ones_like(ro.response_ids, dtype=torch.bool)], 1)
    P = ids.shape[1]
    with torch.no_grad():
        z = model(full, attention_mask=att)[:, P - 1:-1].clone()
    z[..., banned] = float("-inf")
    hand = F.log_softmax(z, -1).gather(-1, ro.response_ids[..., None]).squeeze(-1) * ro.mask
    assert torch.allclose(ro.logprobs, hand, atol=1e-5)
    raw = F.log_softmax(model(full, attention_mask=att)[:, P - 1:-1], -1)
    assert torch.allclose(ro.model_logprobs, raw.gather(-1, ro.response_ids[..., None]).squeeze(-1) * ro.mask,
                          atol=1e-5)                       # model_logprobs stay unprocessed
    # recomputation with the same processor gives the sampling-time log-probs
    with torch.no_grad():
        again = token_logprobs(model, ids, mask, ro.response_ids, ro.mask, logits_processor=ban(banned))
    assert torch.allclose(again, ro.logprobs, atol=1e-5)


def test_processor_sees_the_sequence_so_far(tok, model):
    ids, mask = prompts(tok, 4)
    seen = []

    def record(ctx, ctx_mask, logits):
        seen.append((ctx.clone(), ctx_mask.clone()))
        return logits

    ro = sample(model, ids, mask, max_new_tokens=4, eos_id=None, pad_id=tok.pad_id,
                generator=torch.Generator().manual_seed(1), logits_processor=record)
    assert len(seen) == 4
    for t, (ctx, ctx_mask) in enumerate(seen):
        assert torch.equal(ctx, torch.cat([ids, ro.response_ids[:, :t]], 1))
        assert torch.equal(ctx_mask[:, :ids.shape[1]], mask) and ctx_mask[:, ids.shape[1]:].all()
    # an identity processor changes nothing: same tokens and log-probs as without one
    plain = sample(model, ids, mask, max_new_tokens=4, eos_id=None, pad_id=tok.pad_id,
                   generator=torch.Generator().manual_seed(1))
    assert torch.equal(plain.response_ids, ro.response_ids) and torch.allclose(plain.logprobs, ro.logprobs)


def test_cached_and_uncached_sampling_agree_with_a_processor(tok, model):
    ids, mask = prompts(tok)
    kw = dict(max_new_tokens=5, eos_id=tok.eos_id, pad_id=tok.pad_id, logits_processor=ban(tok.encode("0")[0]))
    a = sample(model, ids, mask, generator=torch.Generator().manual_seed(2), use_cache=True, **kw)
    b = sample(model, ids, mask, generator=torch.Generator().manual_seed(2), use_cache=False, **kw)
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_gradients_through_a_processor_are_finite_with_banned_tokens_and_padding(tok, model):
    ids, mask = prompts(tok)
    banned = tok.encode("5")[0]
    ro = sample(model, ids, mask, max_new_tokens=5, eos_id=tok.eos_id, pad_id=tok.pad_id,
                generator=torch.Generator().manual_seed(3), logits_processor=ban(banned))
    assert (ro.mask == 0).any()                              # some rows stopped early: padding is scored
    lp, ent = token_logprobs(model, ids, mask, ro.response_ids, ro.mask, with_entropy=True,
                             logits_processor=ban(banned))
    (lp.sum() + ent.sum()).backward()
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.zero_grad(set_to_none=True)


def test_bad_processors_are_refused_with_clear_errors(tok, model):
    ids, mask = prompts(tok, 2)
    kw = dict(max_new_tokens=2, eos_id=tok.eos_id, pad_id=tok.pad_id)
    with pytest.raises(TypeError, match="logits_processor must be a callable"):
        sample(model, ids, mask, logits_processor=3, **kw)
    with pytest.raises(ValueError, match="must return logits of shape"):
        sample(model, ids, mask, logits_processor=lambda i, m, z: z[:, :3], **kw)
    with pytest.raises(ValueError, match="every logit of a row to -inf"):
        sample(model, ids, mask, logits_processor=lambda i, m, z: torch.full_like(z, float("-inf")), **kw)
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        sample(model, ids, mask, logits_processor=lambda i, m, z: z * float("nan"), **kw)
    z = torch.zeros(2, 5)
    assert apply_logits_processor(None, ids, mask, z) is z


class CountingModel(torch.nn.Module):
    """Wraps a model and counts its forward passes."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0
        self.config = inner.config
        self.accepts_attention_mask = True

    def forward(self, ids, attention_mask=None):
        self.calls += 1
        return self.inner(ids, attention_mask=attention_mask)


def test_reference_model_runs_only_when_kl_is_used_or_logged(tok):
    cfg = RLConfig(steps=2, prompts_per_step=4, group_size=4, eval_problems=8, eval_every=2)
    for coef, runs in [(None, False), (0.0, True), (0.1, True)]:   # no KLPenalty; one that only measures; a penalty
        model, _ = load_pretrained()
        ref = CountingModel(load_pretrained()[0])
        res = train(model, tok, ADDITION, cfg, hooks=[] if coef is None else [KLPenalty(coef, ref_model=ref)])
        assert (ref.calls > 0) == runs, (coef, ref.calls)
        assert ("kl" in res.history) == runs, coef                # logged only where the reference runs
        assert all(math.isfinite(v) for v in res.history.get("kl", [])), res.history


def test_training_with_a_shield_never_samples_the_banned_token_and_starts_at_ratio_one(tok):
    model, _ = load_pretrained()
    banned = tok.encode("9")[0]
    seen = []

    def cb(step, hist, evals):
        seen.append(hist["clip_fraction"][-1])

    res = train(model, tok, ADDITION, RLConfig(steps=2, prompts_per_step=4, group_size=4, eval_problems=8,
                                               eval_every=2, minibatches=1), logits_processor=ban(banned),
                callback=cb)
    assert all("9" not in r for _, r, _ in res.samples)
    # one minibatch, one epoch: the new log-probs equal the old ones, so nothing is clipped
    assert seen == [0.0, 0.0]
    with pytest.raises(TypeError, match="logits_processor must be a callable"):
        train(model, tok, ADDITION, RLConfig(steps=1, prompts_per_step=2, group_size=2), logits_processor="no")
