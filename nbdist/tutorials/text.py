"""The small English corpus shipped with nbdist, as tensors for a word language model.

``notebooks/02_distributed_rnn.ipynb`` uses it. The text is real prose from the Python
standard library's own docstrings (see ``nbdist/data/README.md`` for how it was gathered and
its license), so nothing is downloaded.

Tokens are lower-cased words, numbers and punctuation marks; every paragraph ends with
``<eos>``. Words outside the ``max_words`` most frequent become ``<unk>``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = ["CORPUS", "Corpus", "Vocab", "batchify", "get_batch", "load_corpus", "load_text",
           "paragraphs", "tokenize"]

CORPUS = Path(__file__).resolve().parent.parent / "data" / "stdlib_prose.txt"
EOS, UNK = "<eos>", "<unk>"
_TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)?|\d+|[.,;:!?()\-\"*/]")


def load_text(path: str | Path = CORPUS) -> str:
    """The raw text of the shipped corpus (or of ``path``)."""
    return Path(path).read_text(encoding="utf-8")


def paragraphs(text: str) -> list[list[str]]:
    """Each paragraph's tokens: lower-cased words, numbers and punctuation, then ``<eos>``."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        words = _TOKEN.findall(para.lower())
        if words:
            out.append(words + [EOS])
    return out


def tokenize(text: str) -> list[str]:
    """All tokens of ``text`` in order, ``<eos>`` after each paragraph."""
    return [t for para in paragraphs(text) for t in para]


@dataclass
class Vocab:
    """Token <-> id; id 0 is ``<unk>``."""

    itos: list[str]
    stoi: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    @classmethod
    def build(cls, tokens: list[str], max_words: int | None = None) -> Vocab:
        counts = Counter(t for t in tokens if t != UNK)
        common = [t for t, _ in counts.most_common(max_words)]
        return cls([UNK] + common)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: list[str]) -> torch.Tensor:
        return torch.tensor([self.stoi.get(t, 0) for t in tokens], dtype=torch.long)

    def decode(self, ids: torch.Tensor | list[int]) -> list[str]:
        return [self.itos[int(i)] for i in ids]


@dataclass
class Corpus:
    """The corpus split into a training and a validation stream of token ids."""

    vocab: Vocab
    train: torch.Tensor
    valid: torch.Tensor

    def __repr__(self) -> str:
        return (f"Corpus({len(self.vocab)} token types, {len(self.train)} training tokens, "
                f"{len(self.valid)} validation tokens)")


def load_corpus(max_words: int | None = 500, valid_every: int = 10,
                path: str | Path = CORPUS) -> Corpus:
    """Tokenize the corpus; every ``valid_every``-th paragraph is held out for validation.

    Holding out paragraphs spread over the whole text (rather than its last part, which comes
    from one module's docstrings) keeps validation text like the training text. The vocabulary
    is built from the training part only, as a real split would; with the default
    ``max_words`` the words seen about once in training become ``<unk>``, so the model also
    learns to predict ``<unk>``.
    """
    paras = paragraphs(load_text(path))
    train = [t for i, p in enumerate(paras) if (i + 1) % valid_every for t in p]
    valid = [t for i, p in enumerate(paras) if not (i + 1) % valid_every for t in p]
    vocab = Vocab.build(train, max_words)
    return Corpus(vocab, vocab.encode(train), vocab.encode(valid))


def batchify(ids: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Cut a stream of ids into ``batch_size`` columns: shape (length, batch_size).

    Each column is a contiguous slice of the text, as in PyTorch's word language model
    example; leftover tokens at the end are dropped.
    """
    n = ids.numel() // batch_size
    if n < 2:
        raise ValueError(f"{ids.numel()} tokens are too few for batch size {batch_size}")
    return ids[: n * batch_size].view(batch_size, n).t().contiguous()


def get_batch(source: torch.Tensor, i: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``i .. i+bptt`` of ``source`` as input, shifted by one token as the target."""
    n = min(bptt, len(source) - 1 - i)
    return source[i:i + n], source[i + 1:i + 1 + n]
