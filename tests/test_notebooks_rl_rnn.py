"""Notebooks 01 (RL with RRef) and 02 (distributed RNN), executed headless in quick mode.

Each runs in a real kernel through nbclient with ``NBDIST_QUICK=1``; a failing assertion cell
fails the test with the cell's traceback. The executed copies are kept in tests/artifacts/.
"""

from __future__ import annotations

import re

import pytest
from conftest import assert_no_errors, run_quick


@pytest.mark.timeout(600)
def test_rl_rref_notebook_quick():
    nb, text, seconds = run_quick("01_rl_rref.ipynb")
    assert_no_errors(nb)
    # observers were built on the workers, and their prints came back prefixed
    for name in ("obs1", "obs2"):
        assert f"[{name}] {name}: CartPole-v1 ready in process" in text, text
        assert len(re.findall(rf"^\[{name}\] {name}: episode \d+ reward \d+", text, re.M)) == 4
    # the agent printed every episode, with both observers' rewards
    episodes = re.findall(r"^Episode +(\d+) +rewards +(\d+) +(\d+) +last +(\d+)", text, re.M)
    assert [int(e[0]) for e in episodes] == [1, 2, 3, 4], text
    for _, r1, r2, last in episodes:
        assert int(last) == min(int(r1), int(r2))
    assert "all checks passed" in text
    assert "nbdist: stopped" in text
    assert "Traceback" not in text
    print(f"01_rl_rref quick: {seconds:.1f}s")


@pytest.mark.timeout(600)
def test_distributed_rnn_notebook_quick():
    nb, text, seconds = run_quick("02_distributed_rnn.ipynb")
    assert_no_errors(nb)
    # the remote parts were built on the parameter server, which printed from there
    assert re.search(r"^\[ps\] EmbeddingTable \d+ x \d+ built on ps", text, re.M), text
    assert "ps: 3 parameter tensors" in text
    assert "trainer: 8 parameter tensors" in text
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss (\d+\.\d+)", text, re.M)]
    assert len(losses) >= 6, text
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses
    assert "all checks passed" in text
    assert "nbdist: stopped" in text
    assert "Traceback" not in text
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


@pytest.mark.parametrize("prefix", ["01", "02"])
def test_tutorial_dashboards_left_a_picture(prefix):
    """Runs after the notebook tests above: each notebook's live dashboard saved a PNG."""
    from conftest import NOTEBOOKS

    png = NOTEBOOKS / "_out" / f"{prefix}_dashboard.png"
    assert png.exists() and png.stat().st_size > 10_000, png
