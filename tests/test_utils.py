"""rlkit.utils, rlkit.show and rlkit.plots."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

import rlkit
from rlkit import plots, utils


def test_device_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.delenv("RLKIT_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert utils.device().type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(utils, "_mps_available", lambda: True)
    assert utils.device().type == "mps"
    monkeypatch.setattr(utils, "_mps_available", lambda: False)
    assert utils.device().type == "cpu"


def test_device_override_and_errors(monkeypatch):
    monkeypatch.setenv("RLKIT_DEVICE", "cpu")
    assert utils.device().type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="cuda"):
        utils.device("cuda")
    with pytest.raises(ValueError, match="prefer"):
        utils.device("tpu")


def test_seed_everything_reproduces_numbers():
    def draw():
        utils.seed_everything(123)
        return torch.randn(5), np.random.rand(3), __import__("random").random()

    a, b = draw(), draw()
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
    g = utils.seed_everything(7)
    assert torch.get_num_threads() == 1
    assert torch.equal(torch.rand(3, generator=g), torch.rand(3, generator=torch.Generator().manual_seed(7)))


def test_seed_everything_validates():
    with pytest.raises(TypeError, match="seed"):
        utils.seed_everything(1.5)
    with pytest.raises(ValueError, match="threads"):
        utils.seed_everything(0, threads=0)


def test_masked_mean_matches_a_hand_computation():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 1, 0], [0, 0, 1]])
    assert utils.masked_mean(x, m).item() == pytest.approx((1 + 2 + 6) / 3)
    per_row = utils.masked_mean(x, m, dim=-1)
    assert torch.allclose(per_row, torch.tensor([1.5, 6.0]))
    assert utils.masked_mean(x, torch.zeros_like(m)).item() == 0.0  # no NaN from an empty mask
    assert utils.masked_mean(x).item() == pytest.approx(3.5)


def test_masked_mean_refuses_broadcasting_and_bad_types():
    x = torch.ones(2, 3)
    with pytest.raises(ValueError, match="mask"):
        utils.masked_mean(x, torch.ones(3))
    with pytest.raises(TypeError, match="x"):
        utils.masked_mean(torch.ones(3, dtype=torch.long), torch.ones(3))
    with pytest.raises(TypeError, match="mask"):
        utils.masked_mean(x, [[1, 1, 1], [1, 1, 1]])


def test_full_scale_switch(monkeypatch):
    monkeypatch.delenv("RLKIT_SCALE", raising=False)
    assert utils.full_scale() is False
    monkeypatch.setenv("RLKIT_SCALE", "full")
    assert utils.full_scale() is True
    monkeypatch.setenv("RLKIT_SCALE", "huge")
    with pytest.raises(ValueError, match="RLKIT_SCALE"):
        utils.full_scale()


def _example(a, b=2):
    """Docstring to strip."""
    return a + b


def test_show_prints_source(capsys):
    rlkit.show(_example)
    out = capsys.readouterr().out
    assert "def _example" in out and "Docstring" in out
    rlkit.show(_example, docstring=False)
    out = capsys.readouterr().out
    assert "return a + b" in out and "Docstring" not in out
    with pytest.raises(TypeError, match="obj"):
        rlkit.show(42)


def test_mean_band_and_smooth():
    import matplotlib.pyplot as plt

    plots.use_book_style()
    fig, ax = plt.subplots()
    ys = np.array([[0.0, 1.0, 2.0], [2.0, 3.0, 4.0]])
    line = plots.mean_band(ax, [0, 1, 2], ys, label="m")
    assert np.allclose(line.get_ydata(), [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="ys"):
        plots.mean_band(ax, [0, 1, 2], ys[0])
    with pytest.raises(ValueError, match="x"):
        plots.mean_band(ax, [0, 1], ys)
    plt.close(fig)
    assert np.allclose(plots.smooth([1, 3, 5, 7], window=2), [1, 2, 4, 6])
