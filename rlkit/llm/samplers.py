r"""Where a training step's responses come from: the current policy, lagged versions of it, or actors.

Chapters: 07_tiny_llm (:class:`Fresh`), 12_clipping_staleness and 24_pitfalls_recipe (:class:`Lagged`),
16_offpolicy_multistep (:class:`Lagged`, and :class:`Pool` for the actors of :mod:`rlkit.distributed`).

A sampler is called once per update by :func:`rlkit.llm.train` as ``sampler(run) -> Step`` and fills
in what the rest of the loop needs to know about the data (:class:`rlkit.llm.trainer.Step`):

* ``batch``: the problems, the rollout, the checker's reward and the exact-match correctness;
* ``logp_behav`` :math:`\log\mu(y_t)`: the log-probs of the policy that sampled each token;
* ``logp_old`` :math:`\log\pi_k(y_t)`: the same tokens under the learner's current weights, the
  denominator of the ratio (equal to ``logp_behav`` for fresh rows);
* ``age``: how many versions behind the learner each response's sampler was (0 = fresh).

After the update, ``sampler.publish(run)`` makes the new weights available to the next samples.
"""
from __future__ import annotations

import torch

from .. import _validate as V
from ..staleness import LagDistribution, PolicyArchive
from .rl import collect
from .sampling import cat_rollouts, token_logprobs

__all__ = ["Fresh", "Lagged", "Pool"]


class Fresh:
    r"""Sample from the current policy: ``prompts_per_step`` prompts, ``group_size`` responses each.

    The ratio's denominator :math:`\log\pi_{old}` is the sampler's own ``model_logprobs`` when the
    policy is the model at temperature 1 without a processor; the sampling log-probs when a
    processor (and no top-k/top-p) shaped the samples, since the processed model is then the policy;
    otherwise it is recomputed at the training temperature (with the processor, if any).
    DAPO's dynamic sampling (``RLConfig.dynamic_sampling``) happens inside :func:`rlkit.llm.collect`.

    Args:
        recompute: under a processor, recompute :math:`\log\pi_{old}` with the learner's forward pass
            (:func:`rlkit.llm.token_logprobs`) instead of taking the sampling log-probs. Both are
            :math:`\log q`, but the sampler's incremental decoding rounds differently (by about
            :math:`10^{-5}`); chapter 18's shielded runs were made with the recomputed numbers.
    """

    def __init__(self, recompute: bool = False):
        self.recompute = V.instance_of(recompute, "recompute", bool)

    def setup(self, run) -> None:
        pass

    def __call__(self, run):
        from .trainer import Step
        cfg, proc = run.cfg, run.logits_processor
        batch = collect(run.model, run.tok, run.task, cfg, run.rng, run.gen, run.device, logits_processor=proc)
        ro = batch.rollout
        with torch.no_grad():
            if cfg.temperature == 1.0 and proc is None:
                old = ro.model_logprobs                  # = log pi_old of the sampled tokens
            elif proc is not None and cfg.top_k is None and cfg.top_p is None and not self.recompute:
                old = ro.logprobs                        # the processed policy sampled them: log q = log pi_old
            else:
                old = token_logprobs(run.model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask,
                                     temperature=cfg.temperature, logits_processor=proc)
        age = torch.zeros(len(ro), dtype=torch.long, device=ro.mask.device)
        return Step(batch=batch, logp_old=old, logp_behav=old, age=age, mask=ro.mask,
                    rewards=batch.rewards.to(run.device))

    def publish(self, run) -> None:
        run.version += 1


class Lagged:
    r"""Sample each group from an older version of the policy, :math:`k - \ell` with :math:`\ell \sim` ``lag``.

    The sampler keeps the last ``lag.max + 1`` versions in a :class:`rlkit.staleness.PolicyArchive`
    (version 0 is the initial model). At update :math:`k` it draws one lag per prompt from its own
    generator (seeded ``cfg.seed + 1``), clips it to the versions that exist, and asks each version
    for its share of the prompts (:func:`rlkit.llm.collect`, temperature 1). The rows are stacked
    version by version, oldest first. ``logp_old`` is :math:`\log\pi_k` recomputed on every row
    (the sampler's own numbers on fresh rows).

    Under the run's ``logits_processor`` (``train(..., logits_processor=shield)``) the policy is the
    *processed* model, as for :class:`Fresh`: every version samples through the processor,
    ``logp_behav`` is the sampler's processed log-probs ``rollout.logprobs`` and ``logp_old`` is
    :math:`\log\pi_k` recomputed with the processor (chapter 24's shielded recipe).

    ``result.archive`` is the archive after training (its newest ``keep`` versions).

    Args:
        lag: a :class:`rlkit.staleness.LagDistribution` or an int (a fixed lag).
        processor: an optional decode-time logits processor for the actors only (e.g. a shield);
            the learner's ratio still uses the unprocessed model. Not together with the run's
            ``logits_processor``.
        keep: how many versions the archive keeps (at least and by default ``lag.max + 1``; more
            for off-policy checks after training). It changes no sample.
    """

    def __init__(self, lag: LagDistribution | int = 0, processor=None, keep: int | None = None):
        self.lag = lag if isinstance(lag, LagDistribution) else LagDistribution.fixed(lag)
        if processor is not None and not callable(processor):
            raise TypeError(f"processor must be a logits processor (callable) or None, got {type(processor).__name__}")
        self.processor = processor
        self.keep = self.lag.max + 1 if keep is None else V.int_in(keep, "keep", self.lag.max + 1)
        self.archive = None

    def setup(self, run) -> None:
        if self.processor is not None and run.logits_processor is not None:
            raise ValueError("Lagged: give a processor to the sampler (the actors only) or to train's "
                             "logits_processor (the policy), not both")
        self.archive = PolicyArchive(capacity=self.keep)
        self.gen = run.generator(1)
        self.archive.push(0, run.model)

    def reset(self) -> None:
        """Forget the archived versions (a rollback flushes the bad versions' in-flight data)."""
        self.archive = PolicyArchive(capacity=self.keep)

    def __call__(self, run):
        from .trainer import Step
        cfg, dev, proc = run.cfg, run.device, run.logits_processor
        lags = self.lag.sample(cfg.prompts_per_step, self.gen)
        group_versions = self.archive.behaviour_versions(run.version, lags)
        parts, rewards, correct, row_versions, problems, responses = [], [], [], [], [], []
        for v in torch.unique(group_versions).tolist():
            n_v = int((group_versions == v).sum())
            b = collect(self.archive.get(v), run.tok, run.task, cfg, run.rng, run.gen, dev, prompts=n_v,
                        logits_processor=self.processor if proc is None else proc)
            parts.append(b.rollout)
            rewards.append(b.rewards)
            correct.append(b.correct)
            problems += b.problems
            responses += b.responses
            row_versions.append(torch.full((len(b.rollout),), v, dtype=torch.long))
        ro = cat_rollouts(parts, run.tok.pad_id)
        from .rl import Batch
        batch = Batch(problems, ro, torch.cat(rewards), torch.cat(correct), responses, float("nan"))
        age = (run.version - torch.cat(row_versions)).to(dev)
        mask = ro.mask
        with torch.no_grad():
            if proc is None:
                lb = ro.model_logprobs
                lp_k = token_logprobs(run.model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, mask)
            else:                                        # the processed model is the policy
                lb = ro.logprobs
                lp_k = token_logprobs(run.model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, mask,
                                      temperature=cfg.temperature, logits_processor=proc)
            lp_k = torch.where((age == 0)[:, None], lb, lp_k)
        return Step(batch=batch, logp_old=lp_k, logp_behav=lb, age=age, mask=mask, rewards=batch.rewards.to(dev))

    def publish(self, run) -> None:
        run.version += 1
        self.archive.push(run.version, run.model)

    def result(self, run) -> dict:
        return {"archive": self.archive}


def _learner_logprobs(run, ro, age: torch.Tensor) -> torch.Tensor:
    """``log pi_k`` of the sampled tokens under the learner's weights; the behaviour's own numbers on fresh rows."""
    with torch.no_grad():
        lp_k = token_logprobs(run.model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)
        return torch.where((age == 0)[:, None], ro.model_logprobs, lp_k)


class Pool:
    r"""Consume the samples of an :class:`rlkit.distributed.ActorPool`: ``prompts_per_step`` groups per update.

    The pool's actors sample with whatever version of the weights they last picked up, so the lag
    is the pool's (its ``lags`` for the simulated backend, the race between the processes for the
    real ones), not a distribution of the learner's. At set-up the sampler publishes the initial
    weights as version 0; each update takes ``RLConfig.prompts_per_step`` samples with
    ``pool.get`` (waiting at most ``timeout`` seconds), stacks them in the order they came
    (:func:`rlkit.llm.actors.merge_batches`, padded with the run's tokenizer), and after the update
    publishes the new weights as the next version (``pool.publish``).

    Every sample must be one group of ``RLConfig.group_size`` responses (a
    :class:`rlkit.llm.actors.GroupSampler` with ``prompts=1`` and the same ``group_size``), so that a
    minibatch of whole groups is a set of samples. ``logp_behav`` is the actor's
    ``model_logprobs`` (recorded at sampling time), ``logp_old`` :math:`\log\pi_k` recomputed by the
    learner (the actor's own numbers on fresh rows), ``age`` the learner's version minus the row's.

    ``result.consumed`` lists ``(update, actor, seq, version, lag)`` of every consumed sample.

    Args:
        pool: a started :class:`rlkit.distributed.ActorPool` (``with ActorPool(...) as pool``).
        timeout: seconds to wait for an update's samples (``pool.get``).
    """

    def __init__(self, pool, timeout: float = 120.0):
        from ..distributed import ActorPool
        self.pool = V.instance_of(pool, "pool", ActorPool, "a started rlkit.distributed.ActorPool")
        self.timeout = V.real_in(timeout, "timeout", 0.0, lo_open=True)
        self.consumed: list = []

    def setup(self, run) -> None:
        self.consumed = []
        self.pool.publish(run.model.state_dict(), version=run.version)

    def __call__(self, run):
        from .actors import merge_batches
        from .trainer import Step
        cfg, G, dev = run.cfg, run.cfg.group_size, run.device
        got = self.pool.get(cfg.prompts_per_step, timeout=self.timeout)
        self.consumed += [(run.version, x.actor, x.seq, x.version, x.lag) for x in got]
        batch, versions = merge_batches(got, run.tok)
        if len(batch.rollout) != cfg.prompts_per_step * G:
            raise ValueError(f"Pool: the pool's samples gave {len(batch.rollout)} rows; expected one group of "
                             f"RLConfig.group_size = {G} per sample (GroupSampler(group_size={G}, prompts=1))")
        batch.rollout = ro = batch.rollout.to(dev)
        age = (run.version - versions).to(dev)
        lp_k = _learner_logprobs(run, ro, age)
        return Step(batch=batch, logp_old=lp_k, logp_behav=ro.model_logprobs, age=age, mask=ro.mask,
                    rewards=batch.rewards.to(dev))

    def publish(self, run) -> None:
        run.version += 1
        self.pool.publish(run.model.state_dict(), version=run.version)

    def result(self, run) -> dict:
        return {"consumed": list(self.consumed)}
