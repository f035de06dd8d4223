"""GRPO with rlkit and with TRL's ``GRPOTrainer`` on the same Hugging Face model, task, reward and batch shape.

    "$BENCH_ENV/bin/python" benchmarks/bench_trl.py                           # timing, 30 updates each
    "$BENCH_ENV/bin/python" benchmarks/bench_trl.py --to90 --max-updates 150  # also updates/seconds to 90%

TRL is a benchmark-only dependency, like Stable Baselines3: benchmarks/README.md pins the versions
and installs them into an environment of their own, ``$BENCH_ENV``. Without ``trl`` the script runs
the rlkit contenders and says that TRL was not measured. TRL's ``output_dir`` is a fresh folder
under the system's temporary directory.

**The model.** rlkit's shipped tiny GPT (``load_pretrained()``), its weights copied into an HF
``GPT2LMHeadModel`` by :func:`rlkit.llm.hf.gpt_to_hf` (logits equal to the tiny GPT's; checked at
start), with a ``PreTrainedTokenizerFast`` holding the same character ids
(:func:`rlkit.llm.hf.char_tokenizer_to_hf`). Contenders, each in a fresh Python process, one torch
thread, CPU:

* ``rlkit-hf``: :func:`rlkit.llm.train` on ``HFCausalLM(gpt2)`` with the HF tokenizer behind
  :class:`rlkit.llm.hf.HFTokenizer` (the bridge; issue 14's goal is measured on this one);
* ``rlkit-gpt``: :func:`rlkit.llm.train` on the tiny GPT itself (the reference of the issue);
* ``trl``: ``trl.GRPOTrainer`` on the same GPT-2.

**The same batch shape and loss.** 16 prompts x 8 completions per update, completions of at most
``ADDITION.max_new_tokens`` = 5 tokens (EOS included), temperature 1, no top-k/top-p, one
optimisation step per batch (rlkit ``minibatches=1, epochs=1``; TRL ``steps_per_generation=1,
num_iterations=1, gradient_accumulation_steps=1``), Adam lr 1e-4 constant (TRL: AdamW with
weight decay 0, constant schedule, no warm-up), gradient clipping at norm 1. The reward is
exact match of the answer (rlkit's ``ADDITION`` checker in both). The defaults of both libraries
(printed by the script) and what is matched:

=====================  ================================  ================================  ==========
setting                TRL 1.16 default                  rlkit default (``algo="grpo"``)   used here
=====================  ================================  ================================  ==========
loss aggregation       ``loss_type="dapo"`` (token mean  ``seq-mean-token-mean`` (TRL's    token mean
                       over the generation batch)        ``grpo``)                         (``dapo``)
reward scaling         ``scale_rewards="group"``         std of the group (+1e-6)          group std
beta (KL coefficient)  0.0                               no ``KLPenalty`` hook (no         0
                                                         reference pass)
clip epsilon           0.2 (``epsilon_high`` = 0.2)      0.2                               0.2
steps per batch        ``steps_per_generation`` = grad.  ``minibatches=2``                 1
                       accumulation steps (1)
learning rate          1e-6, linear decay                1e-4, constant                    1e-4 const
=====================  ================================  ================================  ==========

**What it reports.** Seconds per update (sampling + scoring + one optimiser step; evaluations
excluded), the median over the updates after ``--warmup`` (5); start-up seconds, from launching
the process to the start of the first update (imports, model load, trainer construction); with
``--to90``, the number of updates and training seconds until held-out greedy accuracy (256 test
prompts, evaluated every 5 updates with rlkit's :func:`~rlkit.llm.evaluate` on the policy, outside
the timing) first reaches 90%. TRL/rlkit ratios are printed as measured. The machine's load
average is printed: on a shared machine every wall-clock number moves with it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TO90_EVERY = 5


def _setup():
    import torch
    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from rlkit.llm import load_pretrained
    from rlkit.llm.hf import HFCausalLM, char_tokenizer_to_hf, gpt_to_hf
    gpt, tok = load_pretrained()
    hf = gpt_to_hf(gpt)
    ids, mask = tok.encode_batch(["37+45=", "1+2="])
    with torch.no_grad():
        diff = (gpt(ids, attention_mask=mask) - HFCausalLM(hf)(ids, attention_mask=mask))[mask].abs().max().item()
    assert diff < 1e-4, diff
    return gpt, tok, hf, char_tokenizer_to_hf(tok)


def run_rlkit(which: str, updates: int, to90: bool, launched: float, seed: int) -> dict:
    from rlkit.llm import ADDITION, RLConfig, train
    from rlkit.llm.hf import HFCausalLM, HFTokenizer
    gpt, tok, hf, hf_tok = _setup()
    if which == "rlkit-hf":
        model, rtok = HFCausalLM(hf), HFTokenizer(hf_tok)
    else:
        model, rtok = gpt, tok
    cfg = RLConfig(algo="grpo", steps=updates, prompts_per_step=16, group_size=8, lr=1e-4, minibatches=1,
                   epochs=1, aggregation="token-mean", clip_eps=0.2, grad_clip=1.0,   # no KLPenalty: beta 0
                   eval_every=TO90_EVERY if to90 else 10 ** 6, eval_problems=256, seed=seed)
    first = {}
    stamps = []

    def cb(step, hist, evals):
        stamps.append(hist["train_seconds"][-1])
        if to90 and evals["greedy_accuracy"] and evals["greedy_accuracy"][-1] >= 0.9 and evals["step"][-1] > 0:
            return True
        return False

    # the evaluation before the first update runs inside train(); start-up ends where training starts
    first["t"] = time.time()
    res = train(model, rtok, ADDITION, cfg, callback=cb)
    per = [b - a for a, b in zip([0.0] + stamps[:-1], stamps)]
    out = {"per_update_s": per, "startup_s": first["t"] - launched}
    ev = res.evals
    hit = [(s, t) for s, t, g in zip(ev["step"], ev["train_seconds"], ev["greedy_accuracy"]) if g >= 0.9 and s > 0]
    out["to90"] = hit[0] if hit else None
    out["final_greedy"] = ev["greedy_accuracy"][-1]
    return out


def run_trl(updates: int, to90: bool, launched: float, seed: int) -> dict:
    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from rlkit.llm import ADDITION, evaluate
    from rlkit.llm.hf import HFCausalLM
    gpt, tok, hf, hf_tok = _setup()
    n_prompts = 16 * (updates + 2)
    train_probs = ADDITION.problems(n_prompts, seed=seed, split="train")
    answers = {p.prompt: p for p in train_probs}
    import pyarrow as pa
    # an explicit fingerprint: datasets 5.2 cannot hash a pyarrow 26 table (a dill PicklingError)
    ds = Dataset(pa.table({"prompt": [p.prompt for p in train_probs]}), fingerprint=f"bench-trl-{seed}-{updates}")

    def reward(prompts, completions, **kw):
        resp = [c.split(tok.EOS)[0] for c in completions]
        return ADDITION.score(resp, [answers[p] for p in prompts], "exact").tolist()

    args = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_"), per_device_train_batch_size=128, num_generations=8,
        max_completion_length=ADDITION.max_new_tokens, steps_per_generation=1, num_iterations=1,
        gradient_accumulation_steps=1, learning_rate=1e-4, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        temperature=1.0, top_p=1.0, top_k=0, max_steps=updates, logging_steps=10 ** 6, save_strategy="no",
        report_to="none", use_cpu=True, bf16=False, seed=seed, disable_dropout=True, shuffle_dataset=False,
        dataloader_num_workers=0, log_completions=False)
    defaults = trl.GRPOConfig(output_dir=tempfile.mkdtemp(prefix="bench_trl_defaults_"), report_to="none", use_cpu=True)
    eval_probs = ADDITION.problems(256, seed=10_000 + seed, split="test")
    stamps, evals = [], []

    class Clock(TrainerCallback):
        def __init__(self):
            self.t = None
            self.train_s = 0.0

        def on_step_begin(self, a, state, control, **kw):
            self.t = time.perf_counter()
            if not stamps and "first" not in first:
                first["first"] = time.time()

        def on_step_end(self, a, state, control, **kw):
            self.train_s += time.perf_counter() - self.t
            stamps.append(self.train_s)
            if to90 and state.global_step % TO90_EVERY == 0:
                acc = evaluate(HFCausalLM(kw["model"], dtype=None), tok, ADDITION, eval_probs)["accuracy"]
                evals.append((state.global_step, self.train_s, acc))
                if acc >= 0.9:
                    control.should_training_stop = True

    first = {}
    trainer = trl.GRPOTrainer(model=hf, reward_funcs=reward, args=args, train_dataset=ds, processing_class=hf_tok,
                              callbacks=[Clock()])
    torch.manual_seed(seed)
    trainer.train()
    # TRL's generation happens inside the step: on_step_begin -> on_step_end spans sample + loss + optimiser step
    per = [b - a for a, b in zip([0.0] + stamps[:-1], stamps)]
    hit = [(s, t) for s, t, a in evals if a >= 0.9]
    return {"per_update_s": per, "startup_s": first["first"] - launched, "to90": hit[0] if hit else None,
            "final_greedy": evals[-1][2] if evals else None, "version": trl.__version__,
            "defaults": {"loss_type": defaults.loss_type, "scale_rewards": defaults.scale_rewards,
                         "beta": defaults.beta, "epsilon": defaults.epsilon, "epsilon_high": defaults.epsilon_high,
                         "learning_rate": defaults.learning_rate, "lr_scheduler_type": str(defaults.lr_scheduler_type),
                         "num_iterations": defaults.num_iterations}}


def child(args) -> None:
    launched = float(os.environ["BENCH_LAUNCHED"])
    if args.one == "trl":
        out = run_trl(args.updates, args.to90, launched, args.seed)
    else:
        out = run_rlkit(args.one, args.updates, args.to90, launched, args.seed)
    print("RESULT " + json.dumps(out))


def launch(name: str, args) -> dict | None:
    cmd = [sys.executable, __file__, "--one", name, "--updates", str(args.max_updates if args.to90 else args.updates),
           "--seed", str(args.seed)] + (["--to90"] if args.to90 else [])
    env = dict(os.environ, BENCH_LAUNCHED=repr(time.time()), OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not lines:
        print(f"  {name} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
        return None
    return json.loads(lines[-1][7:])


def rlkit_defaults() -> dict:
    from rlkit.llm import RLConfig
    c = RLConfig(algo="grpo").resolved()
    return {"aggregation": c.aggregation, "reward scaling": "group std (+1e-6)",
            "KL penalty": "none (no KLPenalty hook)", "clip_eps": (c.clip_eps, c.clip_eps_high),
            "minibatches": c.minibatches, "lr": c.lr}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--one", choices=["rlkit-hf", "rlkit-gpt", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--updates", type=int, default=30, help="updates per contender for the timing (>= warmup + 20)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--to90", action="store_true", help="train until 90%% greedy held-out accuracy instead")
    ap.add_argument("--max-updates", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=1, help="repeat the three contenders, interleaved")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.one:
        return child(args)
    try:
        import trl  # noqa: F401
        have_trl = True
    except ImportError:
        have_trl = False
        print("trl is not importable: TRL not measured (see benchmarks/README.md for how it was installed)")
    print(f"load average before: {os.getloadavg()}")
    print(f"rlkit defaults (algo='grpo'): {rlkit_defaults()}")
    names = ["rlkit-hf", "rlkit-gpt"] + (["trl"] if have_trl else [])
    results = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names:
            out = launch(n, args)
            if out is not None:
                results[n].append(out)
                if n == "trl" and r == 0:
                    print(f"TRL {out['version']} defaults: {out['defaults']}")
        print(f"round {r}: load average {os.getloadavg()}")
    summary = {}
    for n, outs in results.items():
        if not outs:
            continue
        per = [x for o in outs for x in o["per_update_s"][args.warmup:]] if not args.to90 else \
              [x for o in outs for x in o["per_update_s"][1:]]
        summary[n] = {"median_ms": 1000 * statistics.median(per), "n_updates": len(per),
                      "startup_s": statistics.median(o["startup_s"] for o in outs),
                      "to90": [o["to90"] for o in outs], "final_greedy": [o["final_greedy"] for o in outs]}
        print(f"{n:10s} median {summary[n]['median_ms']:.1f} ms/update over {len(per)} updates; start-up "
              f"{summary[n]['startup_s']:.2f} s; to 90%: {summary[n]['to90']}; "
              f"final greedy {summary[n]['final_greedy']}")
    if "trl" in summary:
        for n in ("rlkit-hf", "rlkit-gpt"):
            if n in summary:
                print(f"TRL/{n}: {summary['trl']['median_ms'] / summary[n]['median_ms']:.2f} per update, "
                      f"{summary['trl']['startup_s'] / summary[n]['startup_s']:.2f} start-up")
    print(f"load average after: {os.getloadavg()}")
    print("JSON " + json.dumps(summary))


if __name__ == "__main__":
    main()
