r"""The tiny LLM: a character-level GPT, verifiable tasks, a sampler with log-probs, and one RL training loop.

Chapter: 07_tiny_llm introduces it; Parts II and III train it, each chapter adding a part to the one loop.

Quick start::

    from rlkit.llm import load_pretrained, ADDITION, RLConfig, train, evaluate

    model, tok = load_pretrained()                      # 0.1 M parameters, ships with rlkit
    test = ADDITION.problems(256, seed=0, split="test")
    evaluate(model, tok, ADDITION, test)["accuracy"]    # ~0.55: most carries are forgotten
    result = train(model, tok, ADDITION, RLConfig(algo="grpo", steps=100))
    result.evals["greedy_accuracy"][-1]                 # ~0.95+

The pieces, top to bottom:

* **Model** (:mod:`rlkit.llm.model`): :class:`GPTConfig`, :class:`GPT` (nanoGPT-style, pre-norm,
  tied embeddings, a :class:`KVCache` for sampling, left padding via ``attention_mask``).
  The *LM protocol* the rest needs is only ``model(ids [B, T]) -> logits [B, T, V]``;
  :class:`TinyGRULM` is a second model class that follows it.
* **Tokenizer** (:mod:`rlkit.llm.tokenizer`): :class:`CharTokenizer`, ``<pad>`` = 0,
  ``<eos>`` = 1, then one id per character; ``encode_batch`` left-pads prompts.
* **Sampling** (:mod:`rlkit.llm.sampling`): :func:`sample` returns a :class:`Rollout` with
  ``response_ids``, ``mask``, ``logprobs`` (log q: the temperature / top-k / top-p distribution
  actually sampled from) and ``model_logprobs`` (log p: the unmodified model);
  :func:`token_logprobs` recomputes differentiable log-probs (and entropies) in one forward pass;
  :func:`sampling_logprobs` is the filtered, renormalised distribution.
* **Tasks** (:mod:`rlkit.llm.tasks`): :class:`Task`, :class:`Problem`, checkers
  (:func:`exact_match`, the sloppy :func:`prefix_match` and :func:`contains_answer`),
  :data:`~rlkit.llm.tasks.ADDITION` (the corpus forgets 80% of carries) and
  :data:`~rlkit.llm.tasks.MULTIPLICATION` (too hard for the model; its ``"prefix"`` checker is
  gamed by answering nothing). New task: a function
  ``rng -> Problem`` and ``Task(name, fn)``.
* **Evaluation** (:mod:`rlkit.llm.evaluation`): :func:`evaluate` (greedy or sampled accuracy).
* **Checkpoints** (:mod:`rlkit.llm.checkpoint`): :func:`load_pretrained`,
  :func:`load_checkpoint` (validates config, hash and tensors), :func:`save_checkpoint`;
  ``python -m rlkit.llm.pretrain`` reproduces the shipped weights.
* **The loop** (:mod:`rlkit.llm.trainer`): :func:`train` runs one RL loop built from four parts,
  a sampler (:mod:`rlkit.llm.samplers`: :class:`Fresh`, :class:`Lagged` versions, an actor
  :class:`Pool`), an advantage estimator (:mod:`rlkit.llm.advantages`: :class:`Group`,
  :class:`TokenGAE`, :class:`OffPolicy`), a policy loss (:class:`PolicyLoss`) and a list of
  :class:`Hook` objects (a :class:`KLPenalty`, :class:`DenseRewards`, and each Part III chapter's
  own). :class:`Run` is the shell every trainer shares (optimiser, generators, log, evaluations,
  clock), :class:`RLResult` what it returns; the module docstring has the table of logged keys.
* **Algorithms and settings** (:mod:`rlkit.llm.rl`): :class:`RLConfig` (frozen, checked field by field;
  ``cfg.replace(steps=50)`` is a checked copy) for ``algo`` in ``"reinforce", "rloo", "grpo",
  "dr_grpo", "dapo", "gspo", "ppo"``, with the loop's settings only (a KL penalty is a
  :class:`KLPenalty` hook, a critic's settings belong to :class:`TokenGAE` or :class:`OffPolicy`);
  :func:`sequence_advantages` and :func:`policy_loss`.
* **Critics** (:mod:`rlkit.llm.heads`): :class:`LogitHead`, one zero-initialised linear head of an
  LM's logits (or hidden states) of any output shape; :class:`ValueHead` is PPO's.
* **Credit over tokens** (:mod:`rlkit.llm.credit`, chapter 14): per-token rewards
  (:func:`terminal_rewards`, :func:`dense_rewards` with :func:`digit_rewards`,
  :func:`kl_token_rewards`), critic targets (:func:`value_targets`) and GAE advantages
  (:func:`token_advantages`) over responses, exact and Monte Carlo prefix values
  (:func:`exact_match_values`, :func:`mc_prefix_values`), and :class:`HiddenValueHead`.
* **Turns as steps** (:mod:`rlkit.llm.multiturn`, chapter 15): :class:`RetryTask` (answer, the
  checker replies, retry up to :math:`K` turns), :func:`rollout_turns` (per-turn masks, rewards
  and behaviour log-probs in one token row per conversation), per-turn returns and advantages
  (:func:`turn_returns`, :func:`token_discounts`, :func:`turn_advantages`), the turn-level trainer
  :func:`train_multiturn` and the format warm start :func:`retry_warm_start`.
* **Part III, one module per chapter**, each holding the chapter's hooks and tasks:
  :mod:`rlkit.llm.stale` (12: staleness control), :mod:`rlkit.llm.lagged` (16: off-policy targets,
  value probes), :mod:`rlkit.llm.actors` (16: an actor pool's sampler), :mod:`rlkit.llm.safety`
  (18: the cost constraint, shields), :mod:`rlkit.llm.dro` (19: robust weights),
  :mod:`rlkit.llm.guided` (20: value-guided decoding), :mod:`rlkit.llm.offline` (21),
  :mod:`rlkit.llm.explore` (22: bonuses), :mod:`rlkit.llm.hierarchy` (23),
  :mod:`rlkit.llm.recipe` (24: the recipe as a list of hooks), :mod:`rlkit.llm.hf` (25: Hugging Face models).
"""
from .advantages import Group, OffPolicy, TokenGAE
from .checkpoint import CheckpointError, load_checkpoint, load_pretrained, save_checkpoint
from .credit import (
    VALUE_TARGETS,
    HiddenValueHead,
    dense_rewards,
    exact_match_values,
    first_wrong_token,
    kl_token_rewards,
    mc_prefix_values,
    most_negative_token,
    response_discounts,
    response_mask,
    state_values,
    terminal_rewards,
    token_advantages,
    token_kl_exact,
    value_targets,
)
from .evaluation import encode_prompts, evaluate
from .gru import TinyGRULM
from .heads import LogitHead
from .model import GPT, GPTConfig, KVCache
from .multiturn import (
    RETRY_ADDITION,
    MultiTurnConfig,
    MultiTurnResult,
    MultiTurnRollout,
    RetryTask,
    episode_layout,
    multiturn_metrics,
    retry_corpus,
    retry_warm_start,
    rollout_turns,
    token_discounts,
    train_multiturn,
    turn_advantages,
    turn_logprobs,
    turn_returns,
    well_formed,
)
from .rl import ALGOS, RLConfig, ValueHead, collect, policy_loss, sequence_advantages
from .samplers import Fresh, Lagged, Pool
from .sampling import (
    Rollout,
    apply_logits_processor,
    call_model,
    sample,
    sampling_logprobs,
    token_logprobs,
)
from .tasks import (
    ADDITION,
    MULTIPLICATION,
    TASKS,
    Problem,
    Task,
    contains_answer,
    digit_rewards,
    exact_match,
    forgot_carry_answer,
    get_task,
    has_carry,
    numeric_close,
    prefix_match,
)
from .tokenizer import CharTokenizer
from .trainer import DenseRewards, HeldOut, Hook, KLPenalty, PolicyLoss, RLResult, Run, Step, steps_to_reach, train

__all__ = [
    "GPT", "GPTConfig", "KVCache", "TinyGRULM", "CharTokenizer",
    "Rollout", "sample", "sampling_logprobs", "token_logprobs", "call_model",
    "apply_logits_processor",
    "Task", "Problem", "ADDITION", "MULTIPLICATION", "TASKS", "get_task",
    "exact_match", "prefix_match", "contains_answer", "numeric_close", "has_carry", "forgot_carry_answer",
    "evaluate", "encode_prompts",
    "load_pretrained", "load_checkpoint", "save_checkpoint", "CheckpointError",
    "ALGOS", "RLConfig", "RLResult", "ValueHead", "train", "collect", "sequence_advantages", "policy_loss",
    "steps_to_reach", "Step", "Hook", "Run", "PolicyLoss", "KLPenalty", "DenseRewards", "HeldOut",
    "Fresh", "Lagged", "Pool", "Group", "TokenGAE", "OffPolicy", "LogitHead",
    "digit_rewards", "VALUE_TARGETS", "response_mask", "terminal_rewards", "dense_rewards", "kl_token_rewards",
    "response_discounts", "value_targets", "token_advantages", "state_values", "first_wrong_token",
    "most_negative_token", "exact_match_values", "mc_prefix_values", "token_kl_exact", "HiddenValueHead",
    "RetryTask", "RETRY_ADDITION", "MultiTurnRollout", "rollout_turns", "episode_layout", "turn_logprobs",
    "turn_returns", "token_discounts", "turn_advantages", "well_formed", "multiturn_metrics", "MultiTurnConfig",
    "MultiTurnResult", "train_multiturn", "retry_warm_start", "retry_corpus",
]
