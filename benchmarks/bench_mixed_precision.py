"""Does one GRPO update land? The share of weights that one step of rlkit's trainer changes, per precision.

    python benchmarks/bench_mixed_precision.py                       # tiny GPT-2 and LLaMA, CPU (and CUDA)
    python benchmarks/bench_mixed_precision.py --model /models/qwen2.5-0.5b-instruct --device cuda

For each model and device: one update of :func:`rlkit.llm.train` (GRPO, 4 prompts x 4 completions,
one minibatch, Adam at ``--lr``, 1e-6 by default: the full fine-tuning rate of book/setup.md) from the
same initial weights and seed, with :class:`rlkit.llm.hf.HFCausalLM` in ``precision="fp32"``,
``"bf16-mixed"`` and ``"bf16"``. Printed: the share of weight entries that changed, the cosine of
the update with fp32's, and the seconds. Adam's first step moves every weight with a nonzero
gradient by about lr, so fp32 changes nearly all of them; a bf16 weight w ignores updates below
about |w|/256, so pure bf16 weights change almost none. The reward (1 for a response of odd length)
varies within groups on any model, so there is a gradient. Nothing is downloaded: ``--model`` is a
local directory. Tiny models are built from a config with random weights (as in tests/test_llm_hf.py).
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from rlkit.llm import ADDITION, CharTokenizer, RLConfig, Task, train  # noqa: E402
from rlkit.llm.hf import HFCausalLM, HFTokenizer  # noqa: E402

ODD = Task("odd-length", ADDITION._generate, lambda response, problem: float(len(response) % 2), max_new_tokens=5)


def tiny(arch: str, tok: CharTokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    if arch == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=tok.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                          bos_token_id=tok.eos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id))
    return LlamaForCausalLM(LlamaConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=32, bos_token_id=None, eos_token_id=tok.eos_id,
                                        pad_token_id=tok.pad_id))


def one_update(make, tok, precision: str, device: str, lr: float):
    lm = HFCausalLM(make().to(device).eval(), precision=precision)
    before = [p.detach().to("cpu", torch.float32, copy=True) for p in lm.parameters()]
    t = time.perf_counter()
    res = train(lm, tok, ODD, RLConfig(algo="grpo", steps=1, prompts_per_step=4, group_size=4, minibatches=1, lr=lr,
                                       eval_every=1, eval_problems=1, seed=0))
    secs = time.perf_counter() - t
    delta = torch.cat([(p.detach().float().cpu() - b).flatten() for b, p in zip(before, lm.parameters())])
    return delta, res.history["reward"][0], secs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a local Hugging Face causal LM directory (default: tiny GPT-2 and LLaMA)")
    ap.add_argument("--device", choices=["cpu", "cuda"], action="append",
                    help="default: cpu, and cuda when available")
    ap.add_argument("--lr", type=float, default=1e-6)
    args = ap.parse_args()
    devices = args.device or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if args.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = HFTokenizer(AutoTokenizer.from_pretrained(args.model, local_files_only=True))
        models = {os.path.basename(args.model.rstrip("/")):
                  lambda: AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True, dtype=torch.float32)}
    else:
        tok = CharTokenizer()
        models = {arch: (lambda a=arch: tiny(a, tok)) for arch in ("gpt2", "llama")}
    print(f"one GRPO update, lr {args.lr:g}; torch {torch.__version__}")
    head = ("model", "device", "precision", "changed", "cos(fp32)", "reward", "s")
    print(" ".join(f"{h:>{w}s}" for h, w in zip(head, (16, 6, 10, 8, 9, 6, 6))))
    for name, make in models.items():
        for device in devices:
            ref = None
            for precision in ("fp32", "bf16-mixed", "bf16"):
                delta, reward, secs = one_update(make, tok, precision, device, args.lr)
                ref = delta if ref is None else ref
                cos = torch.nn.functional.cosine_similarity(delta.double(), ref.double(), dim=0).item()
                print(f"{name:>16s} {device:>6s} {precision:>10s} {(delta != 0).double().mean().item():8.2%} "
                      f"{cos:9.4f} {reward:6.3f} {secs:6.2f}")


if __name__ == "__main__":
    main()
