"""Saving and loading the tiny LLM: a plain state dict of tensors plus a JSON file beside it.

Chapter: 07_tiny_llm. ``NAME.pt`` holds only tensors, so it loads with
``torch.load(..., weights_only=True)`` (no code runs while loading). ``NAME.json`` holds the model
configuration, the tokenizer's characters, the corpus and training settings that reproduce the
weights (``python -m rlkit.llm.pretrain``), and the SHA-256 of the ``.pt`` file. Loading checks
all of it and says what is wrong with a mismatched or corrupt pair.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from .model import GPT, GPTConfig
from .tokenizer import CharTokenizer

__all__ = ["CHECKPOINT_DIR", "DEFAULT_NAME", "CheckpointError", "save_checkpoint", "load_checkpoint",
           "load_pretrained"]

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"
DEFAULT_NAME = "tiny_gpt"
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not match its configuration."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _paths(path) -> tuple[Path, Path]:
    p = Path(path)
    if p.suffix in (".pt", ".json"):
        p = p.with_suffix("")
    return p.with_suffix(".pt"), p.with_suffix(".json")


def save_checkpoint(model: GPT, tok: CharTokenizer, path, meta: dict | None = None) -> Path:
    """Write ``path.pt`` (state dict) and ``path.json`` (config, tokenizer, ``meta``, hash)."""
    if not isinstance(model, GPT):
        raise TypeError(f"save_checkpoint: model must be a GPT, got {type(model).__name__}")
    if not isinstance(tok, CharTokenizer):
        raise TypeError(f"save_checkpoint: tok must be a CharTokenizer, got {type(tok).__name__}")
    pt, js = _paths(path)
    pt.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}                       # tied to wte.weight: stored once
    torch.save(state, pt)
    info = {"format_version": FORMAT_VERSION, "model_class": "GPT", "model_config": model.config.to_dict(),
            "tokenizer": tok.to_dict(), "n_params": model.num_params(), "sha256": _sha256(pt),
            "meta": meta or {}}
    js.write_text(json.dumps(info, indent=1) + "\n")
    return pt


def load_checkpoint(path, device=None, check_hash: bool = True):
    """Load ``path.pt`` + ``path.json``; return ``(model, tokenizer, info)``, model in eval mode.

    Raises :class:`CheckpointError` (a ``ValueError``) naming the file and the problem: a file is
    missing, the JSON is malformed or incomplete, the weights' hash differs from the recorded
    one (the file was changed or damaged), the file is not a weights-only torch file, or the
    tensors do not match the configuration (missing or unexpected names, wrong shapes, NaN).
    """
    pt, js = _paths(path)
    hint = "regenerate it with `python -m rlkit.llm.pretrain`"
    if not js.is_file():
        raise CheckpointError(f"checkpoint config {js} not found ({hint})")
    if not pt.is_file():
        raise CheckpointError(f"checkpoint weights {pt} not found ({hint})")
    try:
        info = json.loads(js.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{js} is not valid JSON ({err}); {hint}") from None
    if not isinstance(info, dict):
        raise CheckpointError(f"{js} must hold a JSON object, got {type(info).__name__}")
    missing = [k for k in ("format_version", "model_config", "tokenizer", "sha256") if k not in info]
    if missing:
        raise CheckpointError(f"{js} lacks the keys {missing}")
    if info["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{js} has format_version {info['format_version']}, this rlkit reads {FORMAT_VERSION}")
    try:
        cfg = GPTConfig(**info["model_config"])
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{js}: bad model_config {info['model_config']}: {err}") from None
    try:
        tok = CharTokenizer.from_dict(info["tokenizer"])
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{js}: bad tokenizer entry: {err}") from None
    if tok.vocab_size != cfg.vocab_size:
        raise CheckpointError(f"{js}: the tokenizer has {tok.vocab_size} tokens but model_config.vocab_size "
                              f"is {cfg.vocab_size}")
    if check_hash:
        digest = _sha256(pt)
        if digest != info["sha256"]:
            raise CheckpointError(f"{pt} is corrupt or was replaced: its SHA-256 is {digest[:12]}..., "
                                  f"{js.name} records {str(info['sha256'])[:12]}... ({hint}, or pass "
                                  "check_hash=False to load it anyway)")
    try:
        state = torch.load(pt, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for damaged files
        raise CheckpointError(f"{pt} could not be read as a weights-only torch file: "
                              f"{type(err).__name__}: {str(err)[:200]}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{pt} must hold a dict of tensors (a state dict)")
    model = GPT(cfg)
    expected = {k: v.shape for k, v in model.state_dict().items() if k != "lm_head.weight"}
    lacking = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if lacking or extra:
        raise CheckpointError(f"{pt} does not match model_config {info['model_config']}: "
                              f"missing tensors {lacking[:5]}, unexpected tensors {extra[:5]}")
    wrong = [f"{k}: file {tuple(state[k].shape)} vs config {tuple(s)}" for k, s in expected.items()
             if state[k].shape != s]
    if wrong:
        raise CheckpointError(f"{pt} does not match model_config {info['model_config']}: " + "; ".join(wrong[:4]))
    bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(f"{pt} holds NaN or infinite values in {bad[:5]}")
    model.load_state_dict(state, strict=False)               # lm_head.weight is tied to wte.weight
    model.eval()
    if device is not None:
        model.to(device)
    return model, tok, info


def load_pretrained(device=None):
    """The shipped tiny GPT and its tokenizer: ``model, tok = load_pretrained()``."""
    model, tok, _ = load_checkpoint(CHECKPOINT_DIR / f"{DEFAULT_NAME}.pt", device=device)
    return model, tok
