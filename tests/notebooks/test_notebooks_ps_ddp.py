"""Notebooks 05 (parameter server over RPC) and 06 (DDP from a notebook), and their data helper.

The notebooks run headless in a real kernel through nbclient with ``NBDIST_QUICK=1``; a failing
assertion cell fails the test with the cell's traceback, and the tests read the printed results
back. The executed copies are kept in tests/artifacts/. The committed notebooks must carry no
outputs and follow the tutorial rules (parameters cell first, no script files, ``%dist_stop``).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from conftest import assert_follows_rules, run_checked

from nbdist.tutorials import digits

PS_NOTEBOOK = "05_parameter_server.ipynb"
DDP_NOTEBOOK = "06_ddp_notebook.ipynb"






# ---------------------------------------------------------------------- the committed files
@pytest.mark.parametrize("name", [PS_NOTEBOOK, DDP_NOTEBOOK])
def test_notebook_is_clean_and_follows_the_rules(name):
    assert_follows_rules(name, forbidden=(".cuda()", "torchvision"))


# ---------------------------------------------------------------------- the data helper
def test_digits_arrays_match_scikit_learn():
    from sklearn.datasets import load_digits

    pixels, labels = digits.load_digits_arrays()
    ref = load_digits()
    assert np.array_equal(pixels, ref.data) and np.array_equal(labels, ref.target)
    assert labels.dtype == np.int64 and pixels.shape == (1797, 64)


def test_digits_split_is_reproducible_normalized_and_disjoint():
    a = digits.load_digits_split(seed=3)
    b = digits.load_digits_split(seed=3)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert a.x_train.shape[1:] == (1, 8, 8) and a.x_train.dtype == torch.float32
    assert len(a.y_train) + len(a.y_test) == 1797 and len(a.y_test) == 359
    assert abs(a.x_train.mean().item()) < 1e-4 and abs(a.x_train.std().item() - 1) < 1e-4
    flat = digits.load_digits_split(seed=3, flat=True, normalize=False)
    assert flat.x_train.shape[1:] == (64,) and 0 <= flat.x_train.min() <= flat.x_train.max() <= 1
    assert not torch.equal(digits.load_digits_split(seed=4).y_train, a.y_train)
    parts = [digits.shard(a.x_train, a.y_train, i, 3) for i in range(3)]
    assert sum(len(y) for _, y in parts) == len(a.y_train)
    assert torch.equal(parts[1][0], a.x_train[1::3]) and torch.equal(parts[2][1], a.y_train[2::3])
    assert torch.equal(torch.cat([y for _, y in parts]).sort().values, a.y_train.sort().values)
    with pytest.raises(ValueError):
        digits.shard(a.x_train, a.y_train, 3, 3)
    with pytest.raises(ValueError):
        digits.load_digits_split(test_fraction=1.0)


def test_digits_accuracy_counts_correct_labels_and_keeps_the_mode():
    x = torch.eye(4)
    y = torch.tensor([0, 1, 2, 0])
    model = torch.nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(4))
    model.train()
    assert digits.accuracy(model, x, y, batch_size=3) == 0.75
    assert model.training


# ---------------------------------------------------------------------- the notebooks
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_parameter_server_notebook_quick(tmp_path):
    nb, text, seconds = run_checked(PS_NOTEBOOK, cwd=tmp_path)
    # both trainers ran on the workers, and the gradients of a step were found on the server
    for r in (1, 2):
        assert re.search(rf"\[trainer{r}\] first step: the server holds 8 gradients", text)
        assert re.search(rf"\[trainer{r}\] epoch 2/2: mean loss \d+\.\d+ over 719 images", text)
        assert re.search(rf"trainer{r} \(pid \d+\): 46 steps on 719 images", text), text
    assert re.search(r"served (\d+) forward passes", text)[1] == "92"
    m = re.search(r"test accuracy: (\d\.\d+) on 359 held-out digits "
                  r"\(through trainer1: (\d\.\d+); chance: 0\.100\)", text)
    assert m, text
    assert float(m[1]) == float(m[2]) > 0.3
    print(f"05_parameter_server quick: {seconds:.1f}s, test accuracy {m[1]}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ddp_notebook_quick(tmp_path):
    nb, text, seconds = run_checked(DDP_NOTEBOOK, cwd=tmp_path)
    # Rank 0's lines have no prefix. No line anchors: a worker's line can land in the middle
    # of one of rank 0's (the core's output router does not wait for rank 0's newline).
    prefix = {0: r"(?<!\] )", 1: r"\[worker1\] ", 2: r"\[worker2\] "}
    for r, lead in prefix.items():
        # every rank joined the process group and got the notebook's parameters
        assert re.search(rf"{lead}rank {r} of 3: pid \d+, backend gloo, EPOCHS=2", text), text
        # the all-reduce worked by hand gave the sum on every rank
        assert re.search(rf"{lead}rank {r}: contributed [^\n]*, all_reduce gave \[6\.0, 5\.0\]",
                         text), text
        dev = r"(?:cpu|cuda:\d+)"
        assert re.search(rf"{lead}rank {r}: net1 on {dev}, net2 on {dev}, output on {dev}", text)
    # DDP made the gradients equal although each rank's own gradient differed
    norms = dict(re.findall(r"rank (\d): own gradient norm \d\.\d+, DDP gradient norm (\d\.\d+)",
                            text))
    assert len(norms) == 3 and len(set(norms.values())) == 1, norms
    assert "weights before DDP: 3 different; after wrapping: 1; DDP gradients identical on all " \
           "ranks: True" in text
    assert "before loading: 3 different weight sets; after loading: 1; after one more step: 1" \
        in text
    # training: identical parameters on every rank, so identical accuracies
    prints = dict(re.findall(r"rank (\d): parameter fingerprint ([0-9a-f]{16})", text))
    assert sorted(prints) == ["0", "1", "2"] and len(set(prints.values())) == 1, prints
    assert "parameters identical on all 3 ranks: True" in text
    accs = dict(re.findall(r"rank (\d): test accuracy (\d\.\d+) on 359 held-out digits", text))
    assert len(accs) == 3 and len(set(accs.values())) == 1, accs
    assert float(accs["0"]) > 0.3
    assert re.search(r"epoch 2/2: mean loss \d+\.\d+ over 1440 images, 480 on each rank", text)
    assert re.search(r"test accuracy \d\.\d+; all checks passed", text)
    print(f"06_ddp_notebook quick: {seconds:.1f}s, test accuracy {accs['0']}")
