"""Mixed precision in the Hugging Face bridge (rlkit.llm.hf): bf16 compute must not cost the update.

The issue: with the weights themselves in bfloat16, one GRPO step at the learning rate advised for full
fine-tuning (1e-6) changed 0.8% of a real model's weights, against 98.6% in float32: Adam's first step
moves a weight by about the learning rate, and a bf16 weight w only changes by more than about
|w|/256. ``HFCausalLM(precision="bf16-mixed")`` (what ``"auto"`` picks on a CUDA GPU) keeps float32
weights and runs the forward pass under bf16 autocast.

Independent check: one step of rlkit's own GRPO trainer from the same initial weights, seed and batch
in three settings. bf16-mixed must change as many weights as float32, in the same direction (cosine of
the two updates); pure bf16 weights must lose most of the update, which shows that the test can fail.
Runs on the CPU (bf16 autocast on the CPU) and, when there is one, on a CUDA GPU.
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"           # no hub access, ever
os.environ["TRANSFORMERS_OFFLINE"] = "1"
if os.environ.get("CI"):
    import transformers  # noqa: F401  (CI installs the hf extra: a missing transformers is a failure there)
else:
    pytest.importorskip("transformers", reason='rlkit.llm.hf needs transformers: pip install -e ".[hf]"')

from rlkit.llm import ADDITION, CharTokenizer, RLConfig, Task, encode_prompts, sample, train  # noqa: E402
from rlkit.llm.hf import PRECISIONS, HFCausalLM  # noqa: E402

TOK = CharTokenizer()
# a random model never answers an addition right; this reward varies within groups (as in test_llm_hf.py)
ODD = Task("odd-length", ADDITION._generate, lambda response, problem: float(len(response) % 2),
           max_new_tokens=5)
ONE_STEP = RLConfig(algo="grpo", steps=1, prompts_per_step=4, group_size=4, minibatches=1, lr=1e-6,
                    eval_every=1, eval_problems=1, seed=0)


def tiny_gpt2(seed=0):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=TOK.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                     bos_token_id=TOK.eos_id, eos_token_id=TOK.eos_id, pad_token_id=TOK.pad_id)
    return GPT2LMHeadModel(cfg).eval()


def cpu_bf16_autocast() -> bool:
    return torch.amp.is_autocast_available("cpu")


DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not cpu_bf16_autocast(),
                                                 reason="this torch has no bf16 autocast on the CPU")),
    pytest.param("cuda", marks=pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()),
                                                  reason="needs a CUDA GPU with bfloat16")),
]


def one_step_update(precision: str, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The change of every weight (float32, flattened) after one GRPO update at lr 1e-6, and the weights' dtype."""
    lm = HFCausalLM(tiny_gpt2().to(device), precision=precision)
    before = [p.detach().float().clone() for p in lm.parameters()]
    dtype = next(lm.parameters()).dtype
    res = train(lm, TOK, ODD, ONE_STEP)
    assert len(res.history["loss"]) == 1
    assert 0 < res.history["reward"][0] < 1          # the groups' rewards vary: there is a gradient
    return torch.cat([(p.detach().float() - b).flatten() for b, p in zip(before, lm.parameters())]).cpu(), dtype


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_mixed_trains_at_lr_1e6_like_float32_and_pure_bf16_does_not(device):
    fp32, fp32_dtype = one_step_update("fp32", device)
    mixed, mixed_dtype = one_step_update("bf16-mixed", device)
    pure, pure_dtype = one_step_update("bf16", device)
    assert (fp32_dtype, mixed_dtype, pure_dtype) == (torch.float32, torch.float32, torch.bfloat16)
    frac = {k: (d != 0).double().mean().item() for k, d in (("fp32", fp32), ("mixed", mixed), ("bf16", pure))}
    cos = {k: torch.nn.functional.cosine_similarity(d.double(), fp32.double(), dim=0).item()
           for k, d in (("mixed", mixed), ("bf16", pure))}
    # measured on the CPU: fp32 97.5%, bf16-mixed 97.5% (cosine 0.997), pure bf16 5.1% (cosine 0.21)
    assert frac["fp32"] > 0.9, frac
    assert frac["mixed"] > 0.5 and abs(frac["mixed"] - frac["fp32"]) < 0.03, frac
    assert cos["mixed"] > 0.95, cos
    assert frac["bf16"] < 0.2 and frac["bf16"] < frac["fp32"] / 4, frac      # the update rounds away
    assert cos["bf16"] < 0.5, cos


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_mixed_keeps_float32_weights_and_returns_float32_outputs(device):
    lm = HFCausalLM(tiny_gpt2().to(device), precision="bf16-mixed")
    ref = HFCausalLM(tiny_gpt2().to(device), precision="fp32")
    assert lm.precision == "bf16-mixed" and lm.autocast
    assert all(p.dtype == torch.float32 for p in lm.parameters())
    ids = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]], device=device)
    logits, hidden = lm(ids, return_hidden=True)
    assert logits.dtype == torch.float32 and hidden.dtype == torch.float32
    gap = (logits - ref(ids)).abs().max().item()
    assert 0 < gap < 0.1, gap                         # computed in bf16 (not equal), yet close to float32
    ids, mask = encode_prompts(ADDITION.problems(3, seed=1, split="test"), TOK, device=device)
    ro = sample(lm, ids, mask, max_new_tokens=4, eos_id=TOK.eos_id, pad_id=TOK.pad_id,
                generator=torch.Generator().manual_seed(0))
    assert ro.logprobs.dtype == torch.float32 and ro.model_logprobs.dtype == torch.float32


def test_auto_is_fp32_on_the_cpu_and_unchanged():
    lm = HFCausalLM(tiny_gpt2())
    assert lm.precision == "fp32" and not lm.autocast
    assert all(p.dtype == torch.float32 for p in lm.parameters())
    old = HFCausalLM(tiny_gpt2(), dtype="auto")                  # the older spelling
    assert old.precision == "fp32" and not old.autocast
    ids = torch.tensor([[3, 4, 5, 6]])
    assert torch.equal(lm(ids), old(ids))
    raw = tiny_gpt2()
    with torch.no_grad():
        direct = raw(input_ids=ids, position_ids=torch.arange(4)[None]).logits
    assert torch.equal(lm(ids), direct)                        # no autocast, no cast: float32 throughout


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()),
                    reason="needs a CUDA GPU with bfloat16")
def test_auto_is_bf16_mixed_on_a_cuda_gpu():
    lm = HFCausalLM(tiny_gpt2().to("cuda"))
    assert lm.precision == "bf16-mixed" and lm.autocast
    assert all(p.dtype == torch.float32 for p in lm.parameters())


def test_the_older_dtype_argument_still_means_what_it_did():
    bf = HFCausalLM(tiny_gpt2(), dtype=torch.bfloat16)
    assert bf.precision == "bf16" and not bf.autocast and next(bf.parameters()).dtype == torch.bfloat16
    kept = HFCausalLM(tiny_gpt2().to(torch.float64), dtype=None)        # None: leave the model as it is
    assert kept.precision is None and not kept.autocast and next(kept.parameters()).dtype == torch.float64
    assert HFCausalLM(tiny_gpt2(), dtype=torch.float32).precision == "fp32"


def test_precision_is_validated():
    assert list(PRECISIONS) == ["auto", "fp32", "bf16-mixed", "bf16"]
    for bad in ("fp16", "bf16_mixed", "", None, torch.bfloat16):
        with pytest.raises(ValueError, match="precision must be one of"):
            HFCausalLM(tiny_gpt2(), precision=bad)
    with pytest.raises(ValueError, match="precision or dtype, not both"):
        HFCausalLM(tiny_gpt2(), precision="bf16", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="dtype"):
        HFCausalLM(tiny_gpt2(), dtype="float16")


def test_a_callers_autocast_is_left_alone_when_the_adapter_does_not_use_its_own():
    kept = HFCausalLM(tiny_gpt2(), dtype=None)
    ids = torch.tensor([[3, 4, 5, 6]])
    plain = kept(ids)
    if not cpu_bf16_autocast():
        pytest.skip("this torch has no bf16 autocast on the CPU")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = kept(ids)
    assert under.dtype == torch.float32 and not torch.equal(under, plain)
