"""Notebooks 01 (RL with RRef) and 02 (distributed RNN), executed headless in quick mode.

Each runs in a real kernel through nbclient with ``NBDIST_QUICK=1``; a failing assertion cell
fails the test with the cell's traceback. The executed copies are kept in tests/artifacts/.
Each runs in a fresh temporary folder, where it must write its dashboard picture
(_out/0N_dashboard.png): a file left by an earlier run cannot satisfy the check.
"""

from __future__ import annotations

import re

import pytest
from conftest import run_checked


def _assert_picture(png) -> None:
    """The notebook's live dashboard saved a real picture, in this run's own folder."""
    assert png.is_file(), f"{png} was not written by this run"
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, (png, len(data))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rl_rref_notebook_quick(tmp_path):
    nb, text, seconds = run_checked("01_rl_rref.ipynb", cwd=tmp_path)
    # observers were built on the workers, and their prints came back prefixed
    for name in ("obs1", "obs2"):
        assert f"[{name}] {name}: CartPole-v1 ready in process" in text, text
        assert len(re.findall(rf"^\[{name}\] {name}: episode \d+ reward \d+", text, re.M)) == 4
    # the agent printed every episode, with both observers' rewards
    episodes = re.findall(r"^Episode +(\d+) +rewards +(\d+) +(\d+) +last +(\d+)", text, re.M)
    assert [int(e[0]) for e in episodes] == [1, 2, 3, 4], text
    for _, r1, r2, last in episodes:
        assert int(last) == min(int(r1), int(r2))
    _assert_picture(tmp_path / "_out" / "01_dashboard.png")
    print(f"01_rl_rref quick: {seconds:.1f}s")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_distributed_rnn_notebook_quick(tmp_path):
    nb, text, seconds = run_checked("02_distributed_rnn.ipynb", cwd=tmp_path)
    # the remote parts were built on the parameter server, which printed from there
    assert re.search(r"^\[ps\] EmbeddingTable \d+ x \d+ built on ps", text, re.M), text
    assert "ps: 3 parameter tensors" in text
    assert "trainer: 8 parameter tensors" in text
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss (\d+\.\d+)", text, re.M)]
    assert len(losses) >= 6, text
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses
    _assert_picture(tmp_path / "_out" / "02_dashboard.png")
    print(f"02_distributed_rnn quick: {seconds:.1f}s")


def test_shipped_corpus_and_batches():
    """The corpus notebook 02 trains on ships with the package and splits as documented."""
    import torch

    from nbdist.tutorials import text

    assert text.CORPUS.is_file()
    assert (text.CORPUS.parent / "README.md").is_file()  # provenance and license
    raw = text.load_text()
    assert 20_000 < len(raw) < 40_000 and raw.isascii()
    assert raw.startswith("The Zen of Python, by Tim Peters")
    corpus = text.load_corpus()
    vocab = corpus.vocab
    assert vocab.itos[0] == text.UNK and len(vocab) == 501
    assert text.EOS in vocab.stoi and "the" in vocab.stoi
    assert len(corpus.train) > 5_000 and len(corpus.valid) > 400
    assert 0 < (corpus.train == 0).float().mean() < 0.15  # <unk> is seen in training
    assert vocab.decode(vocab.encode(["the", "zebra-ish"])) == ["the", text.UNK]

    data = text.batchify(torch.arange(103), 4)
    assert data.shape == (25, 4) and data[:, 1].tolist() == list(range(25, 50))
    x, y = text.get_batch(data, 20, 10)
    assert x.shape == (4, 4) and torch.equal(y, data[21:25])
    with pytest.raises(ValueError):
        text.batchify(torch.arange(3), 4)
