"""Notebook 10 (a world that heals and grows, issue 18) runs headless in quick mode: learners
keep their state through keep-restarts, a grow and a shrink, and a heal; its checks cell
asserts the step counts each learner reached."""

from __future__ import annotations

import pytest
from conftest import assert_follows_rules, run_checked

NAME = "10_elastic.ipynb"


def test_notebook_10_follows_the_rules():
    assert_follows_rules(NAME, forbidden=("torchrun",))


@pytest.mark.timeout(300)
def test_notebook_10_elastic_quick(tmp_path):
    nb, text, seconds = run_checked(NAME, cwd=tmp_path)
    assert "kept state: 1, 3; fresh: 2 (killed by SIGKILL" in text, text[-3000:]
    assert "fresh: 4 (new), 5 (new)" in text and "stopped: 4, 5" in text, text[-3000:]
    assert "nbdist: healed in" in text and "learner3 replaced" in text, text[-3000:]
    assert "as expected: " in text and "WorkerDiedError" not in text.split("as expected")[0]
