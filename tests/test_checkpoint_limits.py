"""What load_checkpoint may allocate: nothing large before the file is known to match its config.

R1 (review 2.4/3): a JSON edited to a large config beside the shipped 432 KB ``.pt`` made rlkit 0.2
build the large model (994 MB peak for n_embd=2048, n_layer=4) before comparing shapes.
R2: a 1.4 MiB DEFLATE-compressed ``.pt`` with a 1 GiB pad tensor was expanded (1.25 GB peak) before
its keys were checked. Each probe runs in a fresh Python process that measures its own peak RSS
around the one call (``/proc/self/clear_refs`` resets the peak) under an address-space limit of
1.5 GB beyond what it had, so a loader that allocates anyway fails quickly instead of swapping.
Also here: the smaller findings on unusual tensors and the dtypes that stay accepted or refused.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch

from rlkit.llm import GPT, CheckpointError, GPTConfig, load_checkpoint, load_pretrained
from rlkit.llm.checkpoint import CHECKPOINT_DIR, DEFAULT_NAME

SHIPPED = CHECKPOINT_DIR / DEFAULT_NAME
MB = 2 ** 20

PROBE = r"""
import json, resource, sys, time
from rlkit.llm import load_checkpoint, load_pretrained
load_pretrained()                                    # imports and lazy initialisation happen here

def status(key):                                     # bytes, from /proc/self/status
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

soft, hard = resource.getrlimit(resource.RLIMIT_AS)
limit = status("VmSize") + int(1.5 * 2 ** 30)
resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
for path, check_hash in json.loads(sys.argv[1]):
    with open("/proc/self/clear_refs", "w") as f:    # resets VmHWM (the peak RSS) to the current RSS
        f.write("5")
    before = status("VmRSS")
    t = time.perf_counter()
    try:
        load_checkpoint(path, check_hash=check_hash)
        out = {"error": None, "message": ""}
    except BaseException as err:
        out = {"error": type(err).__name__, "message": str(err)}
    out.update(seconds=time.perf_counter() - t, growth=status("VmHWM") - before)
    print(json.dumps(out), flush=True)
"""


def probe(*cases):
    """Load each ``(path, check_hash)`` in one fresh process; per case: error type, message, seconds, peak growth."""
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps([[str(p), h] for p, h in cases])],
                          capture_output=True, text=True, timeout=240)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == len(cases), proc.stdout + proc.stderr
    return lines


def canonical_sha256(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def copy_shipped(dst):
    for ext in (".pt", ".json"):
        shutil.copyfile(SHIPPED.with_suffix(ext), dst.with_suffix(ext))
    return dst


def rewrite_json(js, **cfg):
    """Edit model_config and make the JSON self-consistent again (n_params, the digests), as the review did."""
    info = json.loads(js.read_text())
    info["model_config"].update(cfg)
    info["n_params"] = GPTConfig(**info["model_config"]).num_params()
    info["sha256"]["model_config"] = canonical_sha256(info["model_config"])
    info["sha256"]["weights"] = hashlib.sha256(js.with_suffix(".pt").read_bytes()).hexdigest()
    js.write_text(json.dumps(info))


@pytest.fixture(scope="module")
def probe_available():
    try:
        open("/proc/self/clear_refs", "w").close()
    except OSError:
        pytest.skip("needs Linux's /proc/self/clear_refs to measure peak memory")


# ------------------------------------------------------------------------------- R1

def test_a_large_config_beside_a_small_pt_is_refused_without_building_it(tmp_path, probe_available):
    """R1: (n_embd, n_layer) = (2048, 4): 201 M parameters, 0.8 GB; (4096, 4): 0.8 G, 3.2 GB; (4096, 2): 0.4 G,
    where every name of the shipped file is expected, only the shapes differ."""
    cases, why = [], []
    for n_embd, n_layer in ((2048, 4), (4096, 4), (4096, 2)):
        js = copy_shipped(tmp_path / f"embd{n_embd}_layer{n_layer}").with_suffix(".json")
        rewrite_json(js, n_embd=n_embd, n_layer=n_layer)
        assert GPTConfig(**json.loads(js.read_text())["model_config"]).num_params() > 2e8
        cases += [(js, True), (js, False)]       # digests recomputed, and not checked at all
        why += 2 * ["missing tensors ['blocks.2." if n_layer == 4
                    else f"wte.weight: file (56, 64) vs config (56, {n_embd})"]
    for (js, check_hash), expected, out in zip(cases, why, probe(*cases)):
        assert out["growth"] < 100 * MB, (js.name, check_hash, out["growth"] / MB)
        assert out["seconds"] < 1.0, (js.name, check_hash, out["seconds"])
        assert out["error"] == "CheckpointError", out
        assert out["message"].startswith(f"{js.with_suffix('.pt')} does not match model_config"), out["message"]
        assert expected in out["message"]


# ------------------------------------------------------------------------------- R2

#: The pad tensor: 2**26 float32 zeros, 256 MiB once expanded (the review used 2**28, 1 GiB). The fixed
#: loader refuses from the zip's directory alone (a DEFLATE record; a declared size over the budget),
#: never reading the record, so the size does not matter to it; 256 MiB is 2.5 times the 100 MB bound,
#: so a loader that expands the record fails the test, while the fixture builds in about a second.
PAD = 2 ** 26


@pytest.fixture(scope="module")
def deflated(tmp_path_factory):
    """The shipped tensors + ``pad``, rewritten with ZIP_DEFLATED (0.63 MiB), digests recomputed."""
    d = tmp_path_factory.mktemp("deflated")
    state = torch.load(SHIPPED.with_suffix(".pt"), weights_only=True)
    state["pad"] = torch.empty(PAD)                    # never written to: no memory is touched here
    raw = d / "raw.pt"
    torch.save(state, raw)
    dst = copy_shipped(d / "ck")
    with zipfile.ZipFile(raw) as src, zipfile.ZipFile(dst.with_suffix(".pt"), "w", zipfile.ZIP_DEFLATED,
                                                      compresslevel=9) as out:
        for info in src.infolist():
            with src.open(info) as r, out.open(info.filename, "w", force_zip64=True) as w:
                if info.file_size == 4 * PAD:            # the pad's record: zeros, whatever torch.empty held
                    for _ in range(info.file_size // MB):
                        w.write(bytes(MB))
                else:
                    shutil.copyfileobj(r, w)
    raw.unlink()
    rewrite_json(dst.with_suffix(".json"))
    return dst.with_suffix(".pt")


def test_a_deflated_pt_is_refused_before_it_is_expanded(deflated, tmp_path, probe_available):
    """R2, and the shipped weights merely recompressed (no pad): refused as compressed, unread."""
    assert deflated.stat().st_size < 2 * MB
    with zipfile.ZipFile(deflated) as zf:
        assert max(m.file_size for m in zf.infolist()) == 4 * PAD
    small = copy_shipped(tmp_path / "small").with_suffix(".pt")
    with zipfile.ZipFile(SHIPPED.with_suffix(".pt")) as src, zipfile.ZipFile(small, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            out.writestr(info.filename, src.read(info))
    rewrite_json(small.with_suffix(".json"))
    cases = [(deflated, True), (deflated, False), (small, True)]
    for (pt, check_hash), out in zip(cases, probe(*cases)):
        assert out["growth"] < 100 * MB, (pt.name, check_hash, out["growth"] / MB)
        assert out["seconds"] < 1.0, (pt.name, check_hash, out["seconds"])
        assert out["error"] == "CheckpointError", out
        assert out["message"].startswith(f"{pt} has compressed records ['"), out["message"]
        assert "it was not read" in out["message"]


def test_stored_records_larger_than_the_config_needs_are_refused_unread(tmp_path, monkeypatch):
    """An uncompressed .pt with an extra 2**20-float tensor (4 MiB, the budget is 0.9 MiB): refused by size."""
    pt = copy_shipped(tmp_path / "big").with_suffix(".pt")
    state = torch.load(pt, weights_only=True)
    state["pad"] = torch.zeros(2 ** 20)
    torch.save(state, pt)
    rewrite_json(pt.with_suffix(".json"))

    def must_not_run(*args, **kw):
        raise AssertionError("torch.load was called")

    monkeypatch.setattr(torch, "load", must_not_run)
    budget = 8 * GPTConfig().num_params() + 2 ** 16 + 2 ** 10 * 28      # 28 stored tensors (lm_head is tied)
    with pytest.raises(CheckpointError, match=rf"big\.pt has \d+ bytes; it was not read\. The 28 tensors of the "
                                              rf"model_config need at most {budget} bytes"):
        load_checkpoint(pt)


# ------------------------------------------------------------------------------- tensors

def resave(pt, **tensors):
    state = torch.load(pt, weights_only=True)
    state.update(tensors)
    torch.save(state, pt)


@pytest.mark.parametrize("kind", ["sparse", "meta"])
def test_a_sparse_or_meta_tensor_is_a_checkpoint_error_naming_it(tmp_path, kind):
    pt = copy_shipped(tmp_path / "odd").with_suffix(".pt")
    bias = torch.load(pt, weights_only=True)["ln_f.bias"]
    resave(pt, **{"ln_f.bias": bias.to_sparse() if kind == "sparse" else torch.empty(64, device="meta")})
    with pytest.raises(CheckpointError, match=rf"{pt} holds tensors that are not dense tensors with data: "
                                              rf"\['ln_f\.bias \(torch\.(sparse_coo, on cpu|strided, on meta)\)'\]"):
        load_checkpoint(pt, check_hash=False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.bfloat16])
def test_other_float_dtypes_are_accepted_and_cast(tmp_path, dtype):
    pt = copy_shipped(tmp_path / "cast").with_suffix(".pt")
    state = torch.load(pt, weights_only=True)
    torch.save({k: v.to(dtype) for k, v in state.items()}, pt)
    model = load_checkpoint(pt, check_hash=False)[0]
    for k, v in model.state_dict().items():
        expected = state["wte.weight" if k == "lm_head.weight" else k].to(dtype).float()   # rounded, then cast
        assert v.dtype == torch.float32 and torch.equal(v, expected), k


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64, torch.complex128])
def test_non_float_dtypes_are_refused(tmp_path, dtype):
    pt = copy_shipped(tmp_path / "ints").with_suffix(".pt")
    resave(pt, **{"ln_f.weight": torch.ones(64, dtype=dtype)})
    with pytest.raises(CheckpointError, match=r"holds non-float, NaN or infinite values in \['ln_f\.weight'\]"):
        load_checkpoint(pt, check_hash=False)


# ------------------------------------------------------------------------------- the shape table

@pytest.mark.parametrize("kw", [dict(), dict(vocab_size=7, block_size=9, n_layer=3, n_head=6, n_embd=48),
                                dict(vocab_size=1, block_size=1, n_layer=1, n_head=1, n_embd=1)])
def test_the_shapes_checked_are_those_of_a_real_model(kw):
    """load_checkpoint computes the shapes without a model; they must be GPT(cfg)'s, in its order."""
    cfg = GPTConfig(**kw)
    real = {k: v.shape for k, v in GPT(cfg).state_dict().items() if k != "lm_head.weight"}
    assert list(cfg.state_shapes().items()) == list(real.items())
    assert sum(s.numel() for s in cfg.state_shapes().values()) == cfg.num_params() == GPT(cfg).num_params()


def test_the_shipped_checkpoint_is_well_inside_the_record_budget():
    with zipfile.ZipFile(SHIPPED.with_suffix(".pt")) as zf:
        members = zf.infolist()
    assert all(m.compress_type == zipfile.ZIP_STORED for m in members)
    assert sum(m.file_size for m in members) < 0.6 * (8 * GPTConfig().num_params())
    model, tok = load_pretrained()
    assert model.num_params() == GPTConfig().num_params()
