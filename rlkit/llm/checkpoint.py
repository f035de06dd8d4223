r"""Saving and loading the tiny LLM: a plain state dict of tensors plus a JSON file beside it.

Chapter: 07_tiny_llm. ``NAME.pt`` holds only tensors and is read with
``torch.load(..., weights_only=True)``, so no code runs while loading. ``NAME.json`` holds the
model configuration, the tokenizer's characters, the corpus and training settings that reproduce
the weights (``python -m rlkit.llm.pretrain``), and the SHA-256 digests of the three things that
decide what a loaded model computes:

* ``sha256.model_config``: the configuration. An ``n_head`` of 2 instead of 4 leaves every
  tensor's shape unchanged, but the same weights then compute another function.
* ``sha256.tokenizer``: the tokenizer. Permuting its characters maps each id to another
  character, and the model then answers in the wrong symbols.
* ``sha256.weights``: the bytes of ``NAME.pt``.

:func:`~rlkit.llm.load_checkpoint` checks, in this order, and raises :class:`CheckpointError` naming the file
and what is wrong:

1. both files exist, and the JSON is an object with the expected entries;
2. ``model_config`` is a valid :class:`~rlkit.llm.model.GPTConfig` (types, ranges, and the caps
   on each size and on the parameter count) matching the tokenizer and ``n_params``. Nothing has
   been allocated yet, so a config asking for 100,000 layers is refused at once;
3. the three digests;
4. the ``.pt`` file, before torch reads it: an uncompressed zip archive (as ``torch.save`` writes)
   whose records total at most what the configuration's tensors need at 8 bytes per number, plus
   a small allowance for the records that describe them (a compressed record would be expanded
   before its size is known). The shapes are computed from the configuration's sizes, without
   building a model;
5. the state dict it holds: dense CPU tensors with exactly the configuration's names and shapes,
   floating point (float16 and float64 are cast to float32) and finite. Only then is the model
   built and the weights copied in.

So a JSON that asks for a large model beside a small ``.pt``, or a small ``.pt`` that expands to a
large one, is refused without allocating the large size.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import fields
from pathlib import Path

import torch

from .. import _validate as V
from .model import GPT, GPTConfig
from .tokenizer import CharTokenizer

__all__ = ["CHECKPOINT_DIR", "DEFAULT_NAME", "CheckpointError", "save_checkpoint", "load_checkpoint",
           "load_pretrained"]

#: Where the shipped checkpoints live (inside the package).
CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"
#: The name of the shipped tiny GPT checkpoint (``tiny_gpt.json`` and its weights).
DEFAULT_NAME = "tiny_gpt"
#: 2: the digests cover the configuration, the tokenizer and the weights (1, rlkit 0.1: the weights only).
FORMAT_VERSION = 2
MAX_JSON_BYTES = 2 ** 24
#: Bytes of zip records a ``.pt`` may hold beyond 8 per number of its tensors (``data.pkl``, version
#: records): this much, plus :data:`RECORD_ALLOWANCE_PER_TENSOR` per tensor. The shipped file uses
#: 2,395 bytes for its 28 tensors.
RECORD_ALLOWANCE = 2 ** 16
RECORD_ALLOWANCE_PER_TENSOR = 2 ** 10
_HINT = "regenerate it with `python -m rlkit.llm.pretrain`"
_KEYS = ("format_version", "model_class", "model_config", "tokenizer", "n_params", "sha256")
_DIGESTS = ("model_config", "tokenizer", "weights")


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not match its configuration."""


def _json_digest(obj) -> str:
    """SHA-256 of a JSON value in canonical form (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _paths(path) -> tuple[Path, Path]:
    """``NAME.pt`` and ``NAME.json``: a ``.pt`` or ``.json`` suffix is stripped, any other name is kept whole.

    ``run.v1`` and ``run.v2`` are two checkpoints (``run.v1.pt``, ``run.v2.pt``), as are ``lr0.001``
    and ``lr0.01``; ``run``, ``run.pt`` and ``run.json`` all name ``run.pt`` + ``run.json``.
    """
    p = Path(V.instance_of(path, "path", (str, os.PathLike), "str or path"))
    if p.name in ("", ".", ".."):
        raise ValueError(f"path must name a checkpoint file (NAME, NAME.pt or NAME.json), got {str(path)!r}")
    if p.suffix in (".pt", ".json"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".pt"), p.with_name(p.name + ".json")


def _not_found(what: str, file: Path, path) -> CheckpointError:
    """The error for a missing file; it names the file looked for, and where rlkit 0.2 put a dotted name."""
    msg = f"checkpoint {what} {file} not found ({_HINT})"
    p = Path(path)
    if p.suffix not in ("", ".pt", ".json"):                    # rlkit 0.2 replaced the last suffix
        old = p.with_suffix(file.suffix)
        if old.exists():
            msg += (f". rlkit 0.2 saved the name {p.name!r} as {old} (where every name that differs from it "
                    f"only after its last dot was saved too); if that file is this checkpoint, load "
                    f"{p.with_suffix('.pt')} or rename the two files")
    return CheckpointError(msg)


def save_checkpoint(model: GPT, tok: CharTokenizer, path, meta: dict | None = None) -> Path:
    """Write ``NAME.pt`` (the state dict) and ``NAME.json`` (config, tokenizer, ``meta``, digests).

    Args:
        model: a :class:`~rlkit.llm.model.GPT` with finite weights.
        tok: its :class:`~rlkit.llm.tokenizer.CharTokenizer` (the same ``vocab_size``).
        path: where to write: ``NAME`` or ``NAME.pt`` (or ``NAME.json``) writes ``NAME.pt`` and
            ``NAME.json``. Only a ``.pt`` or ``.json`` suffix is replaced: ``run.v1`` writes
            ``run.v1.pt`` and ``run.v1.json`` (rlkit 0.2 wrote ``run.pt``, the file ``run.v2`` wrote too).
        meta: a JSON-serialisable dict stored as is (how the weights were made), or None.

    Returns:
        the path of the ``.pt`` file. Chapter: 07_tiny_llm.

    Raises:
        ValueError: ``path`` lies below a regular file, or ``NAME.pt`` / ``NAME.json`` is a directory.

    The save is atomic for each file: both are written to a hidden temporary folder beside them
    (``.NAME.pt.saving-*``, with the name cut to 64 characters; removed afterwards) and moved into
    place with ``os.replace``, the old ``NAME.json`` being removed first. A save interrupted at
    any point therefore leaves either the previous checkpoint intact, or a checkpoint whose config
    is missing (refused as not found), never a half-written file or new weights beside the old
    config; a crash may leave the hidden folder behind.
    """
    V.instance_of(model, "model", GPT)
    V.instance_of(tok, "tok", CharTokenizer)
    V.choice(tok.vocab_size, "tok.vocab_size", [model.config.vocab_size])
    meta = {} if meta is None else V.instance_of(meta, "meta", dict)
    try:
        json.dumps(meta)
    except (TypeError, ValueError) as err:
        raise TypeError(f"meta must be JSON-serialisable: {err}") from None
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}                       # tied to wte.weight: stored once
    for k, v in state.items():
        V.tensor_in(v, f"the model's {k}")
    pt, js = _paths(path)
    _writable_dir(pt.parent, path)
    for f in (pt, js):
        if f.exists() and not f.is_file():
            raise ValueError(f"path: cannot save the checkpoint {str(path)!r}: {f} exists and is not a regular file")
    cfg, tk = model.config.to_dict(), tok.to_dict()
    tmp = Path(tempfile.mkdtemp(prefix=f".{pt.name[:64]}.saving-", dir=pt.parent))
    try:
        torch.save(state, tmp / pt.name)                       # the same archive name as a direct save
        info = {"format_version": FORMAT_VERSION, "model_class": "GPT", "model_config": cfg, "tokenizer": tk,
                "n_params": model.num_params(),
                "sha256": {"model_config": _json_digest(cfg), "tokenizer": _json_digest(tk),
                           "weights": _file_digest(tmp / pt.name)},
                "meta": meta}
        (tmp / js.name).write_text(json.dumps(info, indent=1) + "\n")
        for f in (pt, js):
            _fsync(tmp / f.name)
        js.unlink(missing_ok=True)          # until the new config is in place the checkpoint is "not found"
        os.replace(tmp / pt.name, pt)
        os.replace(tmp / js.name, js)
        _fsync(pt.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return pt


def _writable_dir(parent: Path, path) -> None:
    """Create ``parent`` (and its parents); a regular file in the way is the caller's ``path``'s fault."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((d for d in (parent, *parent.parents) if d.exists() and not d.is_dir()), parent)
        raise ValueError(f"path: cannot save the checkpoint {str(path)!r} in {parent}: {blocker} is a file, "
                         "not a directory") from None


def _fsync(path: Path) -> None:
    """Flush a file (or a directory's entries) to the disk, so that a power cut cannot reorder the writes."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:                     # a directory cannot be opened on some systems
        return
    try:
        os.fsync(fd)
    except OSError:                     # some file systems cannot sync a directory
        pass
    finally:
        os.close(fd)


def _entry(js: Path, what: str, check, *args):
    """Run a validator on an entry of the JSON; its TypeError/ValueError becomes a CheckpointError."""
    try:
        return check(*args)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{js}: bad {what}: {err}") from None


def _read_json(js: Path, check_hash: bool) -> tuple[dict, GPTConfig, CharTokenizer]:
    """Steps 1 and 2: the JSON's entries, the config and the tokenizer. Allocates no tensor."""
    if js.stat().st_size > MAX_JSON_BYTES:
        raise CheckpointError(f"{js} is larger than {MAX_JSON_BYTES} bytes; it is not a checkpoint config")
    try:
        info = json.loads(js.read_text())
    except (ValueError, RecursionError) as err:                 # JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(f"{js} is not valid JSON ({str(err)[:200]}); {_HINT}") from None
    _entry(js, "JSON", V.dict_keys, info, js.name, _KEYS, ("meta",))
    version = _entry(js, "format_version", V.int_in, info["format_version"], "format_version",
                     1, FORMAT_VERSION)
    if version == 1 and check_hash:
        raise CheckpointError(
            f"{js} has format_version 1 (rlkit 0.1), whose hash covers the weights only. Load it once "
            f"with load_checkpoint(path, check_hash=False) and re-save it with save_checkpoint, or {_HINT}")
    _entry(js, "model_class", V.choice, info["model_class"], "model_class", ["GPT"])
    names = [f.name for f in fields(GPTConfig)]
    mc = _entry(js, "model_config", V.dict_keys, info["model_config"], "model_config", names)
    cfg = _entry(js, "model_config", lambda: GPTConfig(**mc))
    tok = _entry(js, "tokenizer entry", CharTokenizer.from_dict, info["tokenizer"])
    if tok.vocab_size != cfg.vocab_size:
        raise CheckpointError(f"{js}: the tokenizer has {tok.vocab_size} tokens but model_config.vocab_size "
                              f"is {cfg.vocab_size}")
    n = _entry(js, "n_params", V.int_in, info["n_params"], "n_params")
    if n != cfg.num_params():
        raise CheckpointError(f"{js}: n_params is {n} but model_config gives {cfg.num_params()} parameters")
    if version >= 2:
        digests = _entry(js, "sha256", V.dict_keys, info["sha256"], "sha256", _DIGESTS)
        for k in _DIGESTS:
            _entry(js, "sha256", V.nonempty_str, digests[k], f"sha256.{k}")
    return info, cfg, tok


def _check_digests(pt: Path, js: Path, info: dict) -> None:
    """Step 3: the configuration, the tokenizer and the weights are the ones saved together."""
    rec = info["sha256"]
    why = {"model_config": "the configuration was changed since the weights were saved (the same tensors "
                           "under another configuration compute another function)",
           "tokenizer": "the tokenizer was changed since the model was trained (other characters, or the "
                        "same ones in another order, map token ids to the wrong symbols)"}
    for k, value in (("model_config", info["model_config"]), ("tokenizer", info["tokenizer"])):
        digest = _json_digest(value)
        if digest != rec[k]:
            raise CheckpointError(f"{js}: {k} does not match its recorded SHA-256 ({digest[:12]}... vs "
                                  f"{rec[k][:12]}...): {why[k]}. Restore it, or {_HINT}")
    digest = _file_digest(pt)
    if digest != rec["weights"]:
        raise CheckpointError(f"{pt} is corrupt or was replaced: its SHA-256 is {digest[:12]}..., "
                              f"{js.name} records {rec['weights'][:12]}... ({_HINT}, or pass "
                              "check_hash=False to load it anyway)")


def _record_budget(expected: dict[str, torch.Size]) -> int:
    """The most bytes of zip records a ``.pt`` holding ``expected`` may have: 8 per number plus the metadata."""
    numbers = sum(s.numel() for s in expected.values())
    return 8 * numbers + RECORD_ALLOWANCE + RECORD_ALLOWANCE_PER_TENSOR * len(expected)


def _check_archive(pt: Path, expected: dict[str, torch.Size]) -> None:
    """Step 4: before torch reads it, the ``.pt`` is an uncompressed zip no larger than the config needs."""
    budget = _record_budget(expected)
    unread = f"it was not read. The {len(expected)} tensors of the model_config need at most {budget} bytes"
    if pt.stat().st_size > budget:
        raise CheckpointError(f"{pt} has {pt.stat().st_size} bytes; {unread} (8 per number, and the records "
                              "that describe them)")
    try:
        with zipfile.ZipFile(pt) as zf:
            members = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise CheckpointError(f"{pt} could not be read as a weights-only torch file: it is not a complete zip "
                              f"archive, the format torch.save writes ({type(err).__name__}: {str(err)[:200]})"
                              ) from None
    packed = [m.filename for m in members if m.compress_type != zipfile.ZIP_STORED]
    if packed:
        raise CheckpointError(f"{pt} has compressed records {packed[:3]}: torch.save stores them uncompressed, and "
                              f"a compressed record would be expanded before its size is known; {unread}. "
                              "Re-save the state dict with torch.save or save_checkpoint")
    sizes = {m.filename: max(m.file_size, m.compress_size) for m in members}
    total = sum(sizes.values())
    if total > budget:
        big = max(sizes, key=sizes.get)
        raise CheckpointError(f"{pt} declares {total} bytes of records (the largest, {big}, {sizes[big]} bytes); "
                              f"{unread}")


def _check_tensors(pt: Path, info: dict, state, expected: dict[str, torch.Size]) -> None:
    """Step 5: dense CPU float tensors with the config's names and shapes, all finite."""
    if (not isinstance(state, dict) or not all(isinstance(k, str) for k in state)
            or not all(isinstance(v, torch.Tensor) for v in state.values())):
        raise CheckpointError(f"{pt} must hold a dict of tensors keyed by name (a state dict)")
    odd = [f"{k} ({v.layout}, on {v.device.type})" for k, v in state.items()
           if v.layout != torch.strided or v.device.type != "cpu"]
    if odd:
        raise CheckpointError(f"{pt} holds tensors that are not dense tensors with data: {odd[:5]}; a checkpoint "
                              "holds torch.strided tensors that load onto the CPU")
    lacking = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if lacking or extra:
        raise CheckpointError(f"{pt} does not match model_config {info['model_config']}: "
                              f"missing tensors {lacking[:5]}, unexpected tensors {extra[:5]}")
    wrong = [f"{k}: file {tuple(state[k].shape)} vs config {tuple(s)}" for k, s in expected.items()
             if state[k].shape != s]
    if wrong:
        raise CheckpointError(f"{pt} does not match model_config {info['model_config']}: " + "; ".join(wrong[:4]))
    bad = [k for k, v in state.items() if not v.is_floating_point() or not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(f"{pt} holds non-float, NaN or infinite values in {bad[:5]}")


def _read_weights(pt: Path, info: dict, cfg: GPTConfig) -> GPT:
    """Steps 4 and 5: a weights-only state dict matching ``cfg``, loaded into a GPT built only once it matched."""
    expected = cfg.state_shapes()
    _check_archive(pt, expected)
    try:
        state = torch.load(pt, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for damaged or unsafe files
        raise CheckpointError(f"{pt} could not be read as a weights-only torch file: "
                              f"{type(err).__name__}: {str(err)[:200]}") from None
    _check_tensors(pt, info, state, expected)
    model = GPT(cfg)
    model.load_state_dict(state, strict=False)               # lm_head.weight is tied to wte.weight
    return model


def load_checkpoint(path, device=None, check_hash: bool = True):
    """Load ``path.pt`` + ``path.json``; return ``(model, tokenizer, info)``, the model in eval mode.

    Args:
        path: the checkpoint, ``NAME``, ``NAME.pt`` or ``NAME.json`` (as for :func:`save_checkpoint`).
        device: where to put the model (default: the CPU).
        check_hash: compare the digests of the configuration, the tokenizer and the weights with
            the recorded ones (step 3 of the module docstring). ``False`` also reads format 1.
            Steps 4 and 5 (the file's records, names, shapes, dtypes) are checked either way.

    Returns:
        ``(GPT, CharTokenizer, info)`` where ``info`` is the parsed JSON.

    Raises:
        CheckpointError: (a ``ValueError``) naming the file and the problem.
    """
    pt, js = _paths(path)
    V.instance_of(check_hash, "check_hash", bool)
    if not js.is_file():
        raise _not_found("config", js, path)
    if not pt.is_file():
        raise _not_found("weights", pt, path)
    info, cfg, tok = _read_json(js, check_hash)
    if check_hash:
        _check_digests(pt, js, info)
    model = _read_weights(pt, info, cfg).eval()
    if device is not None:
        model.to(device)
    return model, tok, info


def load_pretrained(device=None):
    """The shipped tiny GPT and its tokenizer: ``model, tok = load_pretrained()``."""
    model, tok, _ = load_checkpoint(CHECKPOINT_DIR / f"{DEFAULT_NAME}.pt", device=device)
    return model, tok
