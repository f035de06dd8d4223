"""Benchmarks of the tiny LLM (rlkit.llm): sampling speed, pretraining time, GRPO time to 90%.

    python benchmarks/bench_llm.py                    # all three, 1 torch thread
    python benchmarks/bench_llm.py --skip-pretrain    # sampling and GRPO only (~1 minute)
    python benchmarks/bench_llm.py --seeds 0 1 2      # GRPO over several seeds

What it measures (the targets are those of the issue that introduced rlkit.llm):

1. **KV cache.** Sampling ``--batch`` (64) responses of exactly 15 new tokens (``eos_id=None``,
   so no row stops early) from the shipped model, with and without the cache; best of
   ``--repeats`` runs, alternating the two so that both see the same load. Target: cached
   >= 3x faster. The uncached path reruns the whole sequence every step, which is what a model
   without a cache (or ``use_cache=False``) does.
2. **Pretraining.** ``rlkit.llm.pretrain.pretrain()`` with the shipped settings, timed end to end
   (corpus generation included), and whether the weights equal the shipped checkpoint bit for
   bit. Target: under 5 minutes.
3. **GRPO.** From the shipped model, ``RLConfig(algo="grpo")`` defaults, evaluated every 5
   updates on 256 held-out prompts; reports the base accuracy, the training seconds (sampling +
   updates, evaluation excluded) until greedy AND sampled held-out accuracy first reach 90%,
   and the final accuracies. Target: within 120 s of training on 2 CPU cores.

Timings on a shared machine are inflated by other processes; the script prints the load average.
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from rlkit.llm import ADDITION, RLConfig, load_pretrained, sample, steps_to_reach, train
from rlkit.llm.checkpoint import CHECKPOINT_DIR, DEFAULT_NAME, load_checkpoint


def bench_sampling(batch: int, new_tokens: int, repeats: int) -> dict:
    model, tok = load_pretrained()
    prompts = ADDITION.problems(batch, seed=0, split="test")
    ids, mask = tok.encode_batch([p.prompt for p in prompts])
    times = {True: [], False: []}
    for r in range(repeats):
        for cached in (True, False):
            g = torch.Generator().manual_seed(r)
            t = time.perf_counter()
            ro = sample(model, ids, mask, max_new_tokens=new_tokens, eos_id=None, generator=g, use_cache=cached)
            times[cached].append(time.perf_counter() - t)
            assert ro.response_ids.shape == (batch, new_tokens)
    best = {k: min(v) for k, v in times.items()}
    return {"cached_s": best[True], "uncached_s": best[False], "speedup": best[False] / best[True]}


def bench_pretrain() -> dict:
    from rlkit.llm.pretrain import pretrain
    t = time.perf_counter()
    model, _, _ = pretrain(verbose=False)
    seconds = time.perf_counter() - t
    shipped, _, _ = load_checkpoint(CHECKPOINT_DIR / f"{DEFAULT_NAME}.pt")
    diff = max((a - b).abs().max().item() for a, b in zip(model.state_dict().values(),
                                                          shipped.state_dict().values()))
    return {"seconds": seconds, "max_weight_diff_vs_shipped": diff}


def bench_grpo(seed: int, steps: int) -> dict:
    model, tok = load_pretrained()
    t = time.perf_counter()
    res = train(model, tok, ADDITION, RLConfig(algo="grpo", steps=steps, seed=seed, eval_every=5))
    wall = time.perf_counter() - t
    ev = res.evals
    reach_step, reach_s = steps_to_reach(ev, 0.9)
    return {"seed": seed, "base_greedy": ev["greedy_accuracy"][0], "base_sampled": ev["sampled_accuracy"][0],
            "updates_to_90": reach_step, "train_seconds_to_90": reach_s,
            "final_greedy": ev["greedy_accuracy"][-1], "final_sampled": ev["sampled_accuracy"][-1],
            "train_seconds_total": res.history["train_seconds"][-1], "wall_seconds": wall}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--grpo-steps", type=int, default=150)
    ap.add_argument("--skip-pretrain", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), load average {os.getloadavg()}")

    s = bench_sampling(args.batch, args.new_tokens, args.repeats)
    print(f"[sampling] batch {args.batch} x {args.new_tokens} new tokens: cached {1e3 * s['cached_s']:.1f} ms, "
          f"uncached {1e3 * s['uncached_s']:.1f} ms, speed-up {s['speedup']:.1f}x  (target >= 3x)")

    if not args.skip_pretrain:
        p = bench_pretrain()
        print(f"[pretrain] {p['seconds']:.0f} s (target < 300 s); largest weight difference from the shipped "
              f"checkpoint {p['max_weight_diff_vs_shipped']:.3g}")
        torch.set_num_threads(args.threads)

    for seed in args.seeds:
        g = bench_grpo(seed, args.grpo_steps)
        print(f"[grpo seed {seed}] base held-out accuracy greedy {g['base_greedy']:.3f} "
              f"sampled {g['base_sampled']:.3f}; "
              f">= 90% greedy and sampled after {g['updates_to_90']} updates = {g['train_seconds_to_90']} s of "
              f"training (target <= 120 s); after {args.grpo_steps} updates greedy {g['final_greedy']:.3f} "
              f"sampled {g['final_sampled']:.3f} ({g['train_seconds_total']:.1f} s training, "
              f"{g['wall_seconds']:.1f} s with evaluation)")


if __name__ == "__main__":
    main()
