"""numbers: a parallel corpus for translation, English number words -> French number words,
written by the num2words package (installed with hetbench; nothing downloaded) and shipped as
it wrote them (numbers.npz: writing them takes ~3 s).

A real translation task in miniature: the languages order and group differently ("ninety-
nine" -> "quatre-vingt-dix-neuf", "one thousand, two hundred and one" -> "mille deux cent
un"), agree ("deux cents" but "deux cent un"), and drop or add words ("and", "et"). Numbers
below one million, their digit count uniform from 1 to 6 and then uniform among numbers of
that many digits, so short and long sentences are equally common. 10,000 distinct training
pairs (seed 0) and 1,000 held-out pairs, none of them a training number.

Tokens are words, with hyphens as tokens of their own and commas dropped. Vocabularies are
fixed lists (every word num2words writes below one million, checked when the corpus is made).
Sample encoding (see workloads/transformer): source padded to SOURCE_LEN, then the decoder
input (BOS, target) padded to TARGET_LEN; targets are the target words then EOS, IGNORE
where padded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetbench.workloads.models import IGNORE

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<eos>")
SOURCE_WORDS = (
    "-", "and", "eight", "eighteen", "eighty", "eleven", "fifteen", "fifty", "five", "forty",
    "four", "fourteen", "hundred", "nine", "nineteen", "ninety", "one", "seven", "seventeen",
    "seventy", "six", "sixteen", "sixty", "ten", "thirteen", "thirty", "thousand", "three",
    "twelve", "twenty", "two", "zero")
TARGET_WORDS = (
    "-", "cent", "cents", "cinq", "cinquante", "deux", "dix", "douze", "et", "huit", "mille",
    "neuf", "onze", "quarante", "quatorze", "quatre", "quinze", "seize", "sept", "six",
    "soixante", "treize", "trente", "trois", "un", "vingt", "vingts", "zéro")
SOURCE_VOCAB = SPECIALS + SOURCE_WORDS
TARGET_VOCAB = SPECIALS + TARGET_WORDS
SOURCE_LEN = 14  # the longest English number below a million has 13 tokens
TARGET_LEN = 20  # the longest French one has 19, plus EOS
TRAIN_PAIRS = 10_000
HELDOUT_PAIRS = 1_000
MAX_DIGITS = 6
SHIPPED = Path(__file__).with_name("numbers.npz")  # both splits, as ship() writes them


@dataclass(frozen=True)
class Corpus:
    numbers: np.ndarray  # int64 (N,)
    inputs: np.ndarray  # int64 (N, SOURCE_LEN + TARGET_LEN): source, then BOS + target
    targets: np.ndarray  # int64 (N, TARGET_LEN): target + EOS, IGNORE where padded


def words(number: int, lang: str) -> list[str]:
    from num2words import num2words

    return re.sub("-", " - ", num2words(number, lang=lang).replace(",", "")).split()


def draw_numbers(count: int, seed: int, exclude: set[int] | None = None) -> np.ndarray:
    """`count` distinct numbers: digit count uniform in 1..MAX_DIGITS, then uniform."""
    rng = np.random.default_rng([seed, 0x4E05])
    exclude = exclude or set()
    chosen: dict[int, None] = {}
    while len(chosen) < count:
        digits = rng.integers(1, MAX_DIGITS + 1, size=count)
        low = np.where(digits == 1, 0, 10 ** (digits - 1))
        for n in rng.integers(low, 10 ** digits):
            if int(n) not in exclude:
                chosen.setdefault(int(n))
                if len(chosen) == count:
                    break
    return np.fromiter(chosen, dtype=np.int64, count=count)


def encode(numbers: np.ndarray) -> Corpus:
    source_ids = {w: i for i, w in enumerate(SOURCE_VOCAB)}
    target_ids = {w: i for i, w in enumerate(TARGET_VOCAB)}
    n = len(numbers)
    inputs = np.full((n, SOURCE_LEN + TARGET_LEN), PAD, dtype=np.int64)
    targets = np.full((n, TARGET_LEN), IGNORE, dtype=np.int64)
    for row, number in enumerate(numbers.tolist()):
        src = [source_ids[w] for w in words(number, "en")]
        tgt = [target_ids[w] for w in words(number, "fr")] + [EOS]
        if len(src) > SOURCE_LEN or len(tgt) > TARGET_LEN:
            raise ValueError(f"{number}: {len(src)} source or {len(tgt)} target tokens")
        inputs[row, : len(src)] = src
        inputs[row, SOURCE_LEN] = BOS
        inputs[row, SOURCE_LEN + 1: SOURCE_LEN + len(tgt)] = tgt[:-1]
        targets[row, : len(tgt)] = tgt
    return Corpus(numbers, inputs, targets)


def corpus(split: str) -> Corpus:
    """The training or held-out pairs, as shipped beside this module (SHIPPED): num2words
    takes ~3 s for the 11,000 pairs, at every worker's start. Made by `generate` where the
    file is missing."""
    if not SHIPPED.is_file():
        return generate(split)
    with np.load(SHIPPED) as saved:
        return Corpus(*(saved[f"{split}_{part}"].astype(np.int64)
                        for part in ("numbers", "inputs", "targets")))


def generate(split: str) -> Corpus:
    """The training or held-out pairs, written by num2words (fixed: seed 0 draws both)."""
    train = draw_numbers(TRAIN_PAIRS, 0)
    if split == "train":
        return encode(train)
    return encode(draw_numbers(HELDOUT_PAIRS, 1, exclude=set(train.tolist())))


def ship(path: Path = SHIPPED) -> None:
    """Write both splits as `generate` makes them (token ids fit a byte) to `path`; run
    `python -m hetbench.workloads.numbers` after a change to the corpus or to num2words
    (tests/test_data.py compares the file with `generate`)."""
    arrays: dict[str, np.ndarray] = {}
    for split in ("train", "heldout"):
        pairs = generate(split)
        arrays |= {f"{split}_numbers": pairs.numbers.astype(np.int32),
                   f"{split}_inputs": pairs.inputs.astype(np.uint8),
                   f"{split}_targets": pairs.targets.astype(np.int8)}
    np.savez_compressed(path, **arrays)


def decode(ids: np.ndarray, vocab: tuple[str, ...]) -> str:
    """Words up to the first EOS or PAD, hyphens re-attached."""
    out = []
    for i in ids.tolist():
        if i in (PAD, EOS) or i == IGNORE:
            break
        if i != BOS:
            out.append(vocab[i])
    return " ".join(out).replace(" - ", "-")


if __name__ == "__main__":
    ship()
    print(f"wrote {SHIPPED}")
