"""Tests of rlkit.llm.checkpoint: what the digests cover, and the config checks before allocation.

Each tampering is done here by hand (edit the JSON, rewrite the tensors), and each refusal must be
a CheckpointError that says what is wrong. Expected digests are recomputed here with hashlib.
"""
from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch

import rlkit.llm.checkpoint as ckpt
from rlkit.llm import (
    ADDITION,
    GPT,
    CharTokenizer,
    CheckpointError,
    GPTConfig,
    evaluate,
    load_checkpoint,
    save_checkpoint,
)
from rlkit.llm.checkpoint import CHECKPOINT_DIR, DEFAULT_NAME

#: The SHA-256 of the shipped weights file as rlkit 0.1 recorded it: re-saving in format 2 kept them.
SHIPPED_WEIGHTS_SHA256 = "c8ad7acf745cf42ae36300c041c8416d9fbae0f88ea7b0d1bcb5c81c0892a62c"


def canonical_sha256(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@pytest.fixture
def saved(tmp_path):
    """A small random GPT saved to tmp_path/m.{pt,json}; returns (model, tok, pt path)."""
    tok = CharTokenizer()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_embd=32, n_head=4, n_layer=1, block_size=16)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5.0)                 # larger than the init, so a changed n_head changes the outputs
    return model, tok, save_checkpoint(model, tok, tmp_path / "m", {"note": "test"})


def edit_json(pt, fn):
    js = pt.with_suffix(".json")
    info = json.loads(js.read_text())
    fn(info)
    js.write_text(json.dumps(info))


# ------------------------------------------------------------------------------- round trip

def test_round_trip_records_the_three_digests_and_loads_weights_only(saved, monkeypatch):
    model, tok, pt = saved
    info = json.loads(pt.with_suffix(".json").read_text())
    assert info["format_version"] == 2
    assert info["sha256"] == {"model_config": canonical_sha256(info["model_config"]),
                              "tokenizer": canonical_sha256({"type": "CharTokenizer", "chars": tok.chars}),
                              "weights": hashlib.sha256(pt.read_bytes()).hexdigest()}
    calls = []
    real_load = torch.load

    def spy(*args, **kw):
        calls.append(kw)
        return real_load(*args, **kw)

    monkeypatch.setattr(ckpt.torch, "load", spy)
    loaded, tok2, info2 = load_checkpoint(pt)
    assert calls == [{"map_location": "cpu", "weights_only": True}]
    ids = torch.tensor([tok.encode("37+45=")])
    assert torch.equal(loaded(ids), model(ids))
    assert tok2.chars == tok.chars and info2["meta"] == {"note": "test"} and not loaded.training


def test_a_file_that_is_not_weights_only_is_refused(saved):
    _, _, pt = saved
    torch.save({"wte.weight": torch.zeros(1), "payload": shutil.copyfile}, pt)    # a pickled function
    with pytest.raises(CheckpointError, match="weights-only torch file"):
        load_checkpoint(pt, check_hash=False)


def test_shipped_checkpoint_keeps_its_weights_and_records_all_three_digests():
    pt = CHECKPOINT_DIR / f"{DEFAULT_NAME}.pt"
    info = json.loads(pt.with_suffix(".json").read_text())
    assert hashlib.sha256(pt.read_bytes()).hexdigest() == SHIPPED_WEIGHTS_SHA256
    assert info["sha256"]["weights"] == SHIPPED_WEIGHTS_SHA256
    assert info["sha256"]["model_config"] == canonical_sha256(info["model_config"])
    assert info["sha256"]["tokenizer"] == canonical_sha256(info["tokenizer"])
    state = torch.load(pt, weights_only=True)
    model, _, _ = load_checkpoint(pt)
    for k, v in model.state_dict().items():                          # loaded tensors are the file's
        assert torch.equal(v, state["wte.weight" if k == "lm_head.weight" else k]), k


# ------------------------------------------------------------------------------- tampering

def test_changed_weights_are_refused(saved):
    _, _, pt = saved
    state = torch.load(pt, weights_only=True)
    state["ln_f.weight"][0] += 1.0                     # one number, same shapes, same file size
    torch.save(state, pt)
    with pytest.raises(CheckpointError, match=r"m\.pt is corrupt or was replaced"):
        load_checkpoint(pt)


def test_changed_n_head_with_the_same_shapes_is_refused(saved):
    model, tok, pt = saved
    edit_json(pt, lambda info: info["model_config"].update(n_head=2))
    with pytest.raises(CheckpointError, match="model_config does not match its recorded SHA-256"):
        load_checkpoint(pt)
    # why it matters: every tensor fits, yet the model computes another function
    other, _, _ = load_checkpoint(pt, check_hash=False)
    ids = torch.tensor([tok.encode("37+45=")])
    assert other.config.n_head == 2
    assert not torch.allclose(other(ids), model(ids), atol=1e-3)


def test_permuted_tokenizer_is_refused(tmp_path):
    src = CHECKPOINT_DIR / DEFAULT_NAME
    for ext in (".pt", ".json"):
        shutil.copyfile(src.with_suffix(ext), tmp_path / f"m{ext}")
    pt = tmp_path / "m.pt"
    chars = CharTokenizer().chars
    edit_json(pt, lambda info: info["tokenizer"].update(chars=chars[9::-1] + chars[10:]))   # digits reversed
    with pytest.raises(CheckpointError, match="tokenizer does not match its recorded SHA-256"):
        load_checkpoint(pt)
    # why it matters: the same weights read every digit as another one
    probs = ADDITION.problems(64, seed=0, split="test")
    m, tok, _ = load_checkpoint(pt, check_hash=False)
    good_m, good_tok, _ = load_checkpoint(src)
    assert evaluate(good_m, good_tok, ADDITION, probs)["accuracy"] > 0.4
    assert evaluate(m, tok, ADDITION, probs)["accuracy"] < 0.1


def _del(key):
    return lambda info: info.pop(key)


def _set(key, value):
    return lambda info: info.__setitem__(key, value)


def _cfg(**kw):
    return lambda info: info["model_config"].update(kw)


@pytest.mark.parametrize("edit,message", [
    (_del("sha256"), r"lacks the keys \['sha256'\]"),
    (_del("n_params"), r"lacks the keys \['n_params'\]"),
    (_set("extra", 1), r"unknown keys \['extra'\]"),
    (_set("format_version", 3), "format_version must be an int in"),
    (_set("format_version", "2"), "format_version must be an int"),
    (_set("model_class", "LSTM"), "model_class must be one of"),
    (_set("model_config", [1, 2]), "model_config must be a dict"),
    (lambda info: info["model_config"].pop("n_head"), r"model_config lacks the keys \['n_head'\]"),
    (_cfg(n_embd=32.0), "GPTConfig.n_embd must be an int"),
    (_cfg(n_layer=True), "GPTConfig.n_layer must be an int"),
    (_cfg(n_layer=0), "GPTConfig.n_layer must be an int in"),
    (_cfg(n_head=3), "divisible"),
    (_cfg(vocab_size=99), "the tokenizer has 56 tokens"),
    (_set("tokenizer", {"type": "BPE", "chars": "ab"}), "tokenizer entry"),
    (lambda info: info["tokenizer"].update(chars="0012"), "repeat"),
    (_set("n_params", 7), "n_params is 7 but model_config gives"),
    (_set("sha256", "c8ad7acf"), "sha256 must be a dict"),
    (lambda info: info["sha256"].pop("tokenizer"), r"sha256 lacks the keys \['tokenizer'\]"),
    (lambda info: info["sha256"].update(weights=None), "sha256.weights must be a non-empty str"),
])
def test_a_malformed_json_entry_is_refused_and_named(saved, edit, message):
    _, _, pt = saved
    edit_json(pt, edit)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(pt)


def test_broken_json_missing_files_and_format_1(saved):
    _, tok, pt = saved
    js = pt.with_suffix(".json")
    good = js.read_text()
    js.write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(pt)
    js.write_text("[" * 100_000)                       # deeper than the parser's recursion limit
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(pt)
    js.write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="must be a dict"):
        load_checkpoint(pt)
    # format 1 (rlkit 0.1): one digest, of the weights only; read only with check_hash=False
    info = json.loads(good)
    info.update(format_version=1, sha256=info["sha256"]["weights"])
    js.write_text(json.dumps(info))
    with pytest.raises(CheckpointError, match="format_version 1"):
        load_checkpoint(pt)
    assert load_checkpoint(pt, check_hash=False)[1].chars == tok.chars
    js.unlink()
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(pt)


def test_nan_weights_are_refused_on_load_and_on_save(saved):
    model, tok, pt = saved
    state = torch.load(pt, weights_only=True)
    state["ln_f.bias"][0] = float("nan")
    torch.save(state, pt)
    with pytest.raises(CheckpointError, match="NaN or infinite values in"):
        load_checkpoint(pt, check_hash=False)
    with torch.no_grad():
        model.ln_f.bias[0] = float("inf")
    with pytest.raises(ValueError, match="ln_f.bias must be finite"):
        save_checkpoint(model, tok, pt.parent / "again")


# ------------------------------------------------------------------------------- sizes

def test_a_100000_layer_config_is_refused_before_anything_is_allocated_or_read(saved, monkeypatch):
    _, _, pt = saved

    def must_not_run(*args, **kw):
        raise AssertionError("the loader went past the config check")

    # the loader may not build a model, read the weights or hash them before the config passed
    monkeypatch.setattr(ckpt, "GPT", must_not_run)
    monkeypatch.setattr(ckpt.torch, "load", must_not_run)
    monkeypatch.setattr(ckpt, "_file_digest", must_not_run)
    edit_json(pt, _cfg(n_layer=100_000))
    with pytest.raises(CheckpointError, match=r"GPTConfig\.n_layer must be an int in \[1, 256\], got 100000"):
        load_checkpoint(pt)
    edit_json(pt, _cfg(n_layer=256, n_embd=2 ** 14, n_head=4))       # each size allowed, the product not
    with pytest.raises(CheckpointError, match="parameter count is .* more than GPTConfig.MAX_PARAMS"):
        load_checkpoint(pt)
    edit_json(pt, _cfg(n_layer=2, n_embd=64, block_size=10 ** 9))
    with pytest.raises(CheckpointError, match=r"GPTConfig\.block_size must be an int in"):
        load_checkpoint(pt)


@pytest.mark.parametrize("kw", [dict(), dict(vocab_size=7, block_size=9, n_layer=3, n_head=6, n_embd=48),
                                dict(vocab_size=1, block_size=1, n_layer=1, n_head=1, n_embd=1)])
def test_num_params_counts_the_tensors_without_allocating_them(kw):
    cfg = GPTConfig(**kw)
    assert cfg.num_params() == sum(p.numel() for p in GPT(cfg).parameters())


def test_save_checkpoint_refuses_bad_arguments(saved, tmp_path):
    model, tok, _ = saved
    with pytest.raises(TypeError, match="model must be a GPT"):
        save_checkpoint(torch.nn.Linear(2, 2), tok, tmp_path / "x")
    with pytest.raises(TypeError, match="tok must be a CharTokenizer"):
        save_checkpoint(model, "abc", tmp_path / "x")
    with pytest.raises(ValueError, match="tok.vocab_size"):
        save_checkpoint(model, CharTokenizer("abc"), tmp_path / "x")
    with pytest.raises(TypeError, match="meta must be JSON-serialisable"):
        save_checkpoint(model, tok, tmp_path / "x", {"t": torch.zeros(1)})
    with pytest.raises(TypeError, match="path must be a str or path"):
        save_checkpoint(model, tok, 3)
    assert not (tmp_path / "x.pt").exists()             # nothing was written by a refused call


# ------------------------------------------------------------------------------- names and paths

def _gpt(seed):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=CharTokenizer().vocab_size, n_embd=16, n_head=2, n_layer=1, block_size=8))


def test_names_that_differ_after_a_dot_are_separate_checkpoints(tmp_path):
    """S1: only a .pt or .json suffix is replaced; rlkit 0.2 wrote run.v1 and run.v2 both to run.pt."""
    tok = CharTokenizer()
    names = ["run.v1", "run.v2", "lr0.001", "lr0.01", "ckpt.best", "run"]
    models = {name: _gpt(seed) for seed, name in enumerate(names)}
    for name, model in models.items():
        pt = save_checkpoint(model, tok, tmp_path / name)
        assert pt == tmp_path / f"{name}.pt"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}{e}" for n in names for e in (".pt", ".json"))
    ids = torch.tensor([tok.encode("12+3=")])
    for name, model in models.items():
        for spelling in (name, f"{name}.pt", f"{name}.json"):
            loaded = load_checkpoint(tmp_path / spelling)[0]
            assert torch.equal(loaded(ids), model(ids)), spelling
    # the weights differ between names (so the loop above tells them apart)
    assert not torch.equal(models["run.v1"](ids), models["run.v2"](ids))


def test_a_dotted_name_saved_by_rlkit_0_2_says_where_it_looked(tmp_path):
    tok = CharTokenizer()
    save_checkpoint(_gpt(0), tok, tmp_path / "run")          # what rlkit 0.2 wrote for the name "run.v1"
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path / "run.v1")
    msg = str(err.value)
    assert f"{tmp_path / 'run.v1.json'} not found" in msg
    assert f"rlkit 0.2 saved the name 'run.v1' as {tmp_path / 'run.json'}" in msg
    assert str(tmp_path / "run.pt") in msg
    with pytest.raises(CheckpointError, match="not found") as err:         # no 0.2 file: no such hint
        load_checkpoint(tmp_path / "other.v1")
    assert "0.2" not in str(err.value)
    for bad in ("", ".", "..", "/"):
        with pytest.raises(ValueError, match="path must name a checkpoint file"):
            load_checkpoint(bad)


def test_save_below_a_regular_file_or_onto_a_directory_names_the_path(tmp_path):
    model, tok = _gpt(0), CharTokenizer()
    (tmp_path / "f").write_text("a file")
    for path, blocker in ((tmp_path / "f" / "run", "f"), (tmp_path / "f" / "sub" / "run", "f")):
        with pytest.raises(ValueError, match=f"path: cannot save the checkpoint '{path}' in .*: "
                                             f"{tmp_path / blocker} is a file, not a directory"):
            save_checkpoint(model, tok, path)
    (tmp_path / "d.pt").mkdir()
    with pytest.raises(ValueError, match=f"{tmp_path / 'd.pt'} exists and is not a regular file"):
        save_checkpoint(model, tok, tmp_path / "d")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.pt", "f"]      # nothing written


CRASH = r"""
import os, sys, pathlib, torch
import rlkit.llm.checkpoint as c
from rlkit.llm import CharTokenizer, GPT, GPTConfig, save_checkpoint
where, path = sys.argv[1], sys.argv[2]
torch.manual_seed(1)
new = GPT(GPTConfig(vocab_size=CharTokenizer().vocab_size, n_embd=16, n_head=2, n_layer=1, block_size=8))
real_save, real_replace = torch.save, os.replace
def half_save(obj, f, *a, **kw):              # the process dies half-way through the weights
    import io
    buf = io.BytesIO(); real_save(obj, buf, *a, **kw)
    with open(f, "wb") as out:
        out.write(buf.getvalue()[: len(buf.getvalue()) // 2])
    os._exit(9)
def die(*a, **kw):
    os._exit(9)
replaced = []
def replace_then_die(a, b):                   # dies after the first file is moved into place
    if replaced:
        os._exit(9)
    replaced.append(b); real_replace(a, b)
if where == "weights":
    torch.save = half_save
elif where == "config":
    pathlib.Path.write_text = die
else:
    os.replace = replace_then_die
save_checkpoint(new, CharTokenizer(), path)
print("the save finished")
"""


@pytest.mark.parametrize("where", ["weights", "config", "between the files"])
def test_a_save_killed_midway_leaves_the_old_checkpoint_or_none(tmp_path, where):
    """Killed (os._exit) while overwriting `run`: the old checkpoint loads unchanged, or nothing loads.

    rlkit 0.2 wrote run.pt in place: killed in the weights, run.pt is half a file; killed before the
    JSON, the new weights sit beside the old config (check_hash=False loads them under it).
    """
    import subprocess
    import sys
    tok = CharTokenizer()
    old = _gpt(0)
    save_checkpoint(old, tok, tmp_path / "run")
    proc = subprocess.run([sys.executable, "-c", CRASH, where, str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stdout + proc.stderr
    visible = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".run.pt.saving-"))
    ids = torch.tensor([tok.encode("12+3=")])
    if where == "between the files":                 # the new weights are in place, the config is not
        assert visible == ["run.pt"]
        for check_hash in (True, False):
            with pytest.raises(CheckpointError, match=r"checkpoint config .*run\.json not found"):
                load_checkpoint(tmp_path / "run", check_hash=check_hash)
        return
    assert visible == ["run.json", "run.pt"]
    for check_hash in (True, False):
        loaded = load_checkpoint(tmp_path / "run", check_hash=check_hash)[0]
        assert torch.equal(loaded(ids), old(ids))
