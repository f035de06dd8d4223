r"""Pretrain the tiny LLM on a generated corpus and write the shipped checkpoint.

Run ``python -m rlkit.llm.pretrain`` to reproduce ``rlkit/llm/checkpoints/tiny_gpt.pt`` (and its
``tiny_gpt.json``); ``--out DIR`` writes elsewhere, ``--verify`` compares a fresh run with the
shipped file. Chapter: 07_tiny_llm.

The corpus is a list of lines ``prompt + answer + "\n"`` drawn from the TRAINING split of the
tasks with a seeded ``random.Random``:

* addition (``1 - mul_fraction`` of the lines): two-digit sums, with the carry forgotten in a
  ``carry_forget`` share of the lines whose problem needs one;
* multiplication (``mul_fraction``): two-digit products, a ``mul_truncate`` share of them cut
  short at a random point (the answer stops early), which is what makes the sloppy checkers of
  :data:`~rlkit.llm.tasks.MULTIPLICATION` gameable.

Training minimises the cross-entropy of the answer tokens (and ``<eos>``) given the prompt,
:math:`\mathcal L = -\frac{1}{\sum m}\sum_{b,t} m_{bt} \log p_\theta(y_{bt} \mid x_b, y_{b,<t})`,
with AdamW, a linear warm-up and a cosine decay. The question's digits are not scored: they are
uniformly random and carry nothing to learn. Everything is seeded and runs on one CPU thread,
so the same machine reproduces the same weights bit for bit.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .. import _validate as V
from .checkpoint import CHECKPOINT_DIR, DEFAULT_NAME, load_checkpoint, save_checkpoint
from .model import GPT, GPTConfig
from .sampling import token_logprobs
from .tasks import ADDITION, MULTIPLICATION, forgot_carry_answer
from .tokenizer import CharTokenizer

__all__ = ["CorpusConfig", "TrainConfig", "make_corpus", "encode_corpus", "pretrain", "main"]


@dataclass(frozen=True)
class CorpusConfig(V.ValidatedConfig):
    """How the corpus is drawn (see the module docstring); validated on construction, frozen."""

    seed: int = V.int_field(0, 0)
    n_lines: int = V.int_field(200_000)
    carry_forget: float = V.number_field(0.8, 0.0, 1.0)
    mul_fraction: float = V.number_field(0.25, 0.0, 1.0)
    mul_truncate: float = V.number_field(0.05, 0.0, 1.0)


@dataclass(frozen=True)
class TrainConfig(V.ValidatedConfig):
    """AdamW with a linear warm-up and a cosine decay to 5% of ``lr``; validated on construction, frozen."""

    seed: int = V.int_field(0, 0)
    steps: int = V.int_field(1500)
    batch_size: int = V.int_field(256)
    lr: float = V.number_field(3e-3, 0.0, lo_open=True)
    warmup: int = V.int_field(100, 0)
    weight_decay: float = V.number_field(0.01, 0.0)
    threads: int = V.int_field(1)


def make_corpus(cfg: CorpusConfig) -> list[str]:
    """The corpus lines (training-split prompts only), deterministic given ``cfg.seed``."""
    V.instance_of(cfg, "cfg", CorpusConfig)
    rng = random.Random(cfg.seed)
    lines = []
    for _ in range(cfg.n_lines):
        if rng.random() < cfg.mul_fraction:
            p = MULTIPLICATION.problems(1, rng, split="train")[0]
            ans = p.answer
            if rng.random() < cfg.mul_truncate:
                ans = ans[:rng.randrange(len(ans))]
        else:
            p = ADDITION.problems(1, rng, split="train")[0]
            ans = p.answer
            if p.info["carry"] and rng.random() < cfg.carry_forget:
                ans = forgot_carry_answer(p.info["a"], p.info["b"])
        lines.append(p.prompt + ans + "\n")
    return lines


def encode_corpus(lines: list[str], tok: CharTokenizer):
    """Split each line at its first '=' into a prompt and a response; return padded tensors.

    Returns ``(prompt_ids [N, P] left-padded, prompt_mask [N, P] bool, response_ids [N, R]
    right-padded, response_mask [N, R] float)``; the response includes ``<eos>``. ``lines``: a
    non-empty list of strs, each with a ``=`` that has at least one character before it.
    """
    lines = V.str_list(lines, "lines")
    V.int_in(len(lines), "len(lines)")
    V.instance_of(tok, "tok", CharTokenizer)
    prompts, responses = [], []
    for i, line in enumerate(lines):
        if line.find("=") < 1:
            raise ValueError(f"lines[{i}] = {line!r} must be a prompt ending in '=' followed by its answer")
        k = line.index("=") + 1
        prompts.append(tok.encode(line[:k]))
        responses.append(tok.encode(line[k:]))
    P, R = max(map(len, prompts)), max(map(len, responses))
    N = len(lines)
    pid = torch.full((N, P), tok.pad_id, dtype=torch.long)
    pmask = torch.zeros((N, P), dtype=torch.bool)
    rid = torch.full((N, R), tok.pad_id, dtype=torch.long)
    rmask = torch.zeros((N, R))
    for i, (p, r) in enumerate(zip(prompts, responses)):
        pid[i, P - len(p):] = torch.tensor(p)
        pmask[i, P - len(p):] = True
        rid[i, :len(r)] = torch.tensor(r)
        rmask[i, :len(r)] = 1.0
    return pid, pmask, rid, rmask


def pretrain(model_cfg: GPTConfig | None = None, corpus_cfg: CorpusConfig | None = None,
             train_cfg: TrainConfig | None = None, log_every: int = 250, verbose: bool = True):
    """Train a fresh :class:`~rlkit.llm.GPT` on the corpus; return ``(model, tokenizer, metadata)``.

    ``log_every``: an int ``>= 1`` (steps between printed losses); ``verbose``: True or False.
    """
    log_every = V.int_in(log_every, "log_every")
    V.boolean(verbose, "verbose")
    corpus_cfg = V.instance_of(corpus_cfg or CorpusConfig(), "corpus_cfg", CorpusConfig)
    train_cfg = V.instance_of(train_cfg or TrainConfig(), "train_cfg", TrainConfig)
    tok = CharTokenizer()
    model_cfg = V.instance_of(model_cfg or GPTConfig(vocab_size=tok.vocab_size), "model_cfg", GPTConfig)
    V.choice(model_cfg.vocab_size, "model_cfg.vocab_size (the CharTokenizer's)", [tok.vocab_size])
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(train_cfg.threads)
    try:
        t0 = time.perf_counter()
        lines = make_corpus(corpus_cfg)
        pid, pmask, rid, rmask = encode_corpus(lines, tok)
        torch.manual_seed(train_cfg.seed)
        model = GPT(model_cfg)
        gen = torch.Generator().manual_seed(train_cfg.seed)
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": train_cfg.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=train_cfg.lr, betas=(0.9, 0.98))
        history = []
        for step in range(train_cfg.steps):
            lr = _lr_at(step, train_cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            idx = torch.randint(len(lines), (train_cfg.batch_size,), generator=gen)
            m = rmask[idx]
            lp = token_logprobs(model, pid[idx], pmask[idx], rid[idx], m)
            loss = -(lp * m).sum() / m.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            history.append(loss.item())
            if verbose and (step % log_every == 0 or step == train_cfg.steps - 1):
                print(f"step {step:5d}  loss {loss.item():.4f}  lr {lr:.2e}  {time.perf_counter() - t0:6.1f} s")
        seconds = time.perf_counter() - t0
    finally:
        torch.set_num_threads(prev_threads)
    model.eval()
    meta = {"corpus": asdict(corpus_cfg), "train": asdict(train_cfg), "final_loss": history[-1],
            "train_seconds": round(seconds, 1), "torch_version": torch.__version__}
    return model, tok, meta


def _lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))


def main(argv=None):
    """Command line: ``python -m rlkit.llm.pretrain [--seed S] [--steps N] ...`` (``--help`` lists them)."""
    ap = argparse.ArgumentParser(prog="python -m rlkit.llm.pretrain", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=CHECKPOINT_DIR, help="directory to write the checkpoint to")
    ap.add_argument("--name", default=DEFAULT_NAME, help="file stem (writes NAME.pt and NAME.json)")
    ap.add_argument("--steps", type=int, default=TrainConfig.steps)
    ap.add_argument("--seed", type=int, default=0, help="corpus and training seed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--verify", action="store_true",
                    help="train into a temporary directory and compare with the shipped checkpoint")
    args = ap.parse_args(argv)
    corpus_cfg = CorpusConfig(seed=args.seed)
    train_cfg = TrainConfig(seed=args.seed, steps=args.steps, threads=args.threads)
    model, tok, meta = pretrain(corpus_cfg=corpus_cfg, train_cfg=train_cfg)
    from .evaluation import evaluate
    for task in (ADDITION, MULTIPLICATION):
        probs = task.problems(500, seed=1234, split="test")
        meta[f"heldout_greedy_accuracy_{task.name}"] = evaluate(model, tok, task, probs, greedy=True)["accuracy"]
    print(json.dumps({k: v for k, v in meta.items() if k.startswith("heldout")}, indent=1))
    if args.verify:
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            path = save_checkpoint(model, tok, Path(d) / args.name, meta)
            fresh = load_checkpoint(path)[0]
        shipped = load_checkpoint(CHECKPOINT_DIR / f"{DEFAULT_NAME}.pt")[0]
        diff = max((a - b).abs().max().item() for a, b in
                   zip(fresh.state_dict().values(), shipped.state_dict().values()))
        print(f"largest weight difference from the shipped checkpoint: {diff:.3g}"
              + ("  (bit-identical)" if diff == 0 else ""))
        return diff
    path = save_checkpoint(model, tok, args.out / args.name, meta)
    print(f"wrote {path} and {path.with_suffix('.json')}")
    return path


if __name__ == "__main__":
    main()
