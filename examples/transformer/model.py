"""The transformer example's job: a BERT-mini masked-language model from Hugging Face
`transformers`, built from a configuration (no weights downloaded), on token ids of a local
text file (make_text.py). Characters are the tokens: no tokenizer to fetch.

Each window's masked positions are drawn from the window's own index, so a sample is the
same whichever worker's slice holds it, and the loss is a mean over samples of each
sample's mean over its masked tokens: slices add up exactly (`reduction = "mean"`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForMaskedLM

import hetbench

CORPUS = Path(__file__).resolve().parent / "data" / "corpus.txt"
WINDOW = 64
MASKED = 0.15
IGNORE = -100  # a target that does not count (transformers' convention)
# 0 padding (unused), 1 [MASK], 2 unknown, then printable ASCII and newline
VOCAB = ["<pad>", "<mask>", "<unk>", "\n"] + [chr(c) for c in range(32, 127)]
MASK = 1


class MaskedWindows(Dataset):
    """Windows of WINDOW characters; 15% of each masked, drawn from (seed, window)."""

    def __init__(self, ids: np.ndarray, seed: int) -> None:
        self.windows = ids[: len(ids) // WINDOW * WINDOW].reshape(-1, WINDOW)
        self.seed = seed

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = torch.from_numpy(self.windows[index].astype(np.int64))
        rng = np.random.default_rng([self.seed, index])
        chosen = torch.from_numpy(rng.random(WINDOW) < MASKED)
        chosen[rng.integers(WINDOW)] = True  # at least one per window
        return {"input_ids": torch.where(chosen, MASK, tokens),
                "labels": torch.where(chosen, tokens, IGNORE)}


def encode(text: str) -> np.ndarray:
    lookup = {ch: i for i, ch in enumerate(VOCAB)}
    return np.fromiter((lookup.get(ch, 2) for ch in text), dtype=np.int32, count=len(text))


def masked_loss(outputs, labels: torch.Tensor) -> torch.Tensor:
    """Each window's mean cross-entropy over its masked characters, averaged over windows."""
    per_token = torch.nn.functional.cross_entropy(
        outputs.logits.transpose(1, 2), labels, ignore_index=IGNORE, reduction="none")
    counted = (labels != IGNORE).sum(1).clamp(min=1)
    return (per_token.sum(1) / counted).mean()


def masked_accuracy(outputs, labels: torch.Tensor) -> tuple[float, float]:
    counted = labels != IGNORE
    hits = (outputs.logits.argmax(-1) == labels) & counted
    return float(hits.sum()), float(counted.sum())


def split(batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    return {"input_ids": batch["input_ids"]}, batch["labels"]


def make() -> hetbench.Job:
    ids = encode(CORPUS.read_text(encoding="utf-8"))
    cut = len(ids) * 9 // 10  # the last tenth held out
    config = BertConfig(vocab_size=len(VOCAB), hidden_size=128, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=256,
                        max_position_embeddings=WINDOW, type_vocab_size=1)
    return hetbench.Job(model=BertForMaskedLM(config), loss=masked_loss, reduction="mean",
                        train=MaskedWindows(ids[:cut], seed=0),
                        heldout=MaskedWindows(ids[cut:], seed=1), metric=masked_accuracy,
                        split=split)
