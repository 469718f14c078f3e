"""Data sources. Nothing is downloaded: digits ships inside scikit-learn, the text corpus is
source code of Python's own standard library, scenes are rendered from a scene grammar
(workloads/scenes.py), number translations are written by num2words (workloads/numbers.py),
synthetic data is generated from the seed.

Every data set has two splits: "train", which the steps draw from, and "heldout", which the
evaluation every `eval_every` steps measures (never trained on). The split is fixed by the
data set, not by the run's seed, so runs of different seeds meet the same held-out samples.

The samples of step s depend only on (dataset, seed, global batch): each epoch is a seeded
permutation, cut into full global batches in order. A partition only decides which worker
takes which contiguous slice of that batch, so it never changes what the model sees.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hetbench.workloads import DATASETS, get_workload
from hetbench.workloads.captioning import encode
from hetbench.workloads.numbers import TARGET_VOCAB, TRAIN_PAIRS, corpus
from hetbench.workloads.scenes import CAPTION_VOCAB, NUM_CLASSES, render_scenes

TEXT_SEQ_LEN = 64
# Fixed vocabulary: 0 unknown, 1 newline, 2.. printable ASCII. Independent of the corpus so
# every framework and every Python version agree on the model's shapes.
TEXT_VOCAB = ["\ufffd", "\n"] + [chr(c) for c in range(32, 127)]
TEXT_SOURCES = ("argparse.py", "difflib.py", "textwrap.py", "string.py", "fractions.py", "csv.py")
TEXT_MAX_CHARS = 300_000
SYNTHETIC_SAMPLES = 4096
SYNTHETIC_HELDOUT = 512
DIGITS_SAMPLES = 1797  # scikit-learn's digits: fixed since the data set was published
DIGITS_HELDOUT = 297  # a fixed random 297 of them; the other 1500 train
HELDOUT_FRACTION = 0.1  # text: the last tenth of the corpus' windows
SCENES_TRAIN = 10_000
SCENES_HELDOUT = 1_000
SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class Dataset:
    """In-memory samples: inputs (float32 images N,C,H,W or int64 tokens N,L), int64 targets."""

    name: str
    inputs: np.ndarray
    targets: np.ndarray
    num_classes: int
    source: str
    fingerprint: str = field(default="")
    split: str = "train"

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.inputs.shape[1:])

    @property
    def is_tokens(self) -> bool:
        return self.inputs.dtype == np.int64

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Samples [lo, hi): what the held-out evaluation reads (harness/training)."""
        return self.inputs[lo:hi], self.targets[lo:hi]


class BatchOrder:
    """Global batch indices for each step: a seeded permutation per epoch, cut in order."""

    def __init__(self, num_samples: int, global_batch: int, seed: int) -> None:
        if global_batch > num_samples:
            raise ValueError(f"global batch {global_batch} exceeds the {num_samples} samples")
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.seed = seed
        self.steps_per_epoch = num_samples // global_batch
        self._epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def indices(self, step: int) -> np.ndarray:
        epoch, offset = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm = rng.permutation(self.num_samples)
            self._epoch = epoch
        start = offset * self.global_batch
        return self._perm[start : start + self.global_batch]


def _fingerprint(*arrays: np.ndarray) -> str:
    digest = hashlib.sha256()
    for a in arrays:
        digest.update(np.ascontiguousarray(a).data)  # the bytes, not a copy of them
    return digest.hexdigest()[:16]


def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """The pixels (1797, 64) and labels of the file behind sklearn.datasets.load_digits,
    read as it reads them. Found without importing scikit-learn: importing
    sklearn.datasets takes ~2.4 s of every worker's start on two cores."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("the digits dataset needs scikit-learn installed")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    table = np.loadtxt(path, delimiter=",")
    return table[:, :-1], table[:, -1].astype(int)


def load_digits(workload: str, seed: int, split: str = "train") -> Dataset:
    """The 1797 8x8 handwritten digits that scikit-learn ships, scaled to [0, 1]; a fixed
    random 297 are held out."""
    pixels, labels = _sklearn_digits()
    order = np.random.default_rng(0xD161).permutation(DIGITS_SAMPLES)
    keep = order[DIGITS_HELDOUT:] if split == "train" else order[:DIGITS_HELDOUT]
    keep.sort()
    inputs = (pixels[keep].reshape(-1, 1, 8, 8) / 16.0).astype(np.float32)
    targets = labels[keep].astype(np.int64)
    return Dataset("digits", inputs, targets, 10, "sklearn.datasets.load_digits",
                   _fingerprint(inputs, targets), split)


def text_corpus() -> tuple[str, str]:
    """Source code of a few standard-library modules: real text that ships with Python."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = [(stdlib / name).read_text(encoding="utf-8") for name in TEXT_SOURCES]
    corpus = "".join(parts)[:TEXT_MAX_CHARS]
    return corpus, f"python{sysconfig.get_python_version()} stdlib: {', '.join(TEXT_SOURCES)}"


def encode_text(text: str) -> np.ndarray:
    lookup = {ch: i for i, ch in enumerate(TEXT_VOCAB)}
    return np.fromiter((lookup.get(ch, 0) for ch in text), dtype=np.int64, count=len(text))


def load_text(workload: str, seed: int, split: str = "train") -> Dataset:
    """Character language model samples: windows of TEXT_SEQ_LEN+1 chars, next-char targets;
    the last tenth of the windows (contiguous text, so no window overlaps a trained one)
    is held out."""
    corpus, source = text_corpus()
    ids = encode_text(corpus)
    window = TEXT_SEQ_LEN + 1
    n = len(ids) // window
    cut = n - int(n * HELDOUT_FRACTION)
    windows = ids[: n * window].reshape(n, window)
    windows = windows[:cut] if split == "train" else windows[cut:]
    inputs = np.ascontiguousarray(windows[:, :-1])
    targets = np.ascontiguousarray(windows[:, 1:])
    return Dataset("text", inputs, targets, len(TEXT_VOCAB), source, _fingerprint(inputs),
                   split)


def load_synthetic(workload: str, seed: int, split: str = "train") -> Dataset:
    """Generated samples shaped for the workload: images, or random tokens. Random labels:
    for timing, not learning (held-out accuracy stays at chance)."""

    count = SYNTHETIC_SAMPLES if split == "train" else SYNTHETIC_HELDOUT
    rng = np.random.default_rng([seed, 0x5EED, SPLITS.index(split)])
    if get_workload(workload).loss == "tokens":
        vocab = len(TEXT_VOCAB)
        tokens = rng.integers(0, vocab, size=(count, TEXT_SEQ_LEN + 1))
        inputs, targets = tokens[:, :-1].copy(), tokens[:, 1:].copy()
        return Dataset("synthetic", inputs, targets, vocab, "generated tokens",
                       _fingerprint(inputs, targets), split)
    shape = get_workload(workload).synthetic_shape
    images = rng.standard_normal((count, *shape), dtype=np.float32)
    labels = rng.integers(0, 10, size=count).astype(np.int64)
    return Dataset("synthetic", images, labels, 10, "generated images",
                   _fingerprint(images, labels), split)


def load_scenes(workload: str, seed: int, split: str = "train") -> Dataset:
    """32x32 colour images rendered from the scene grammar, labelled by their main object,
    or (captioning) image and caption. Fixed data (render seeds 0 and 1), like a published
    data set."""

    count = SCENES_TRAIN if split == "train" else SCENES_HELDOUT
    scenes = render_scenes(count, seed=SPLITS.index(split))
    source = "hetbench.workloads.scenes (rendered scene grammar)"
    if workload == "captioning":

        inputs, targets = encode(scenes.images, scenes.captions)
        return Dataset("scenes", inputs, targets, len(CAPTION_VOCAB), source,
                       _fingerprint(inputs, targets), split)
    return Dataset("scenes", scenes.images, scenes.labels, NUM_CLASSES, source,
                   _fingerprint(scenes.images, scenes.labels), split)


def load_numbers(workload: str, seed: int, split: str = "train") -> Dataset:
    """English -> French number words (workloads/numbers.py), fixed pairs."""

    pairs = corpus(split)
    return Dataset("numbers", pairs.inputs, pairs.targets, len(TARGET_VOCAB),
                   "num2words English -> French", _fingerprint(pairs.inputs, pairs.targets),
                   split)


def sample_count(name: str, workload: str) -> int:
    """How many samples load_dataset(name, workload, ...) holds, without building them: the
    suite check needs it to reject a global batch larger than the data set."""
    if name == "digits":
        return DIGITS_SAMPLES - DIGITS_HELDOUT
    if name == "text":
        n = len(text_corpus()[0]) // (TEXT_SEQ_LEN + 1)
        return n - int(n * HELDOUT_FRACTION)
    if name == "scenes":
        return SCENES_TRAIN
    if name == "numbers":

        return TRAIN_PAIRS
    return SYNTHETIC_SAMPLES


def load_dataset(name: str, workload: str, seed: int, split: str = "train") -> Dataset:

    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (allowed: {', '.join(SPLITS)})")
    module_name, attr = DATASETS[name].split(":")
    loader = getattr(importlib.import_module(module_name), attr)
    return loader(workload, seed, split)  # type: ignore[no-any-return]
