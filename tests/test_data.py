from __future__ import annotations

import numpy as np
import pytest

from hetbench.workloads.data import (
    TEXT_VOCAB,
    BatchOrder,
    encode_text,
    load_dataset,
    sample_count,
    text_corpus,
)


def test_batch_order_depends_only_on_dataset_seed_and_batch() -> None:
    a, b = BatchOrder(1797, 128, 5), BatchOrder(1797, 128, 5)
    steps = [0, 1, 13, 14, 40, 2]  # crosses epochs (13 full batches per epoch) and goes back
    for s in steps:
        assert np.array_equal(a.indices(s), b.indices(s))
    epoch = np.concatenate([a.indices(s) for s in range(13)])
    assert len(set(epoch.tolist())) == 13 * 128  # no sample twice within an epoch
    assert not np.array_equal(a.indices(0), a.indices(13))  # a new permutation each epoch
    assert not np.array_equal(a.indices(0), BatchOrder(1797, 128, 6).indices(0))


def test_digits_are_the_real_scikit_learn_images() -> None:
    data = load_dataset("digits", "mlp", 0)
    assert data.inputs.shape == (1500, 1, 8, 8) and data.inputs.dtype == np.float32
    assert 0.0 <= data.inputs.min() and data.inputs.max() <= 1.0
    assert set(np.unique(data.targets)) == set(range(10))
    heldout = load_dataset("digits", "mlp", 0, "heldout")
    assert heldout.split == "heldout" and len(heldout) == 297
    assert set(np.unique(heldout.targets)) == set(range(10))
    # together they are scikit-learn's 1797 images, none of them in both splits
    from sklearn.datasets import load_digits

    every = {row.tobytes() for row in (load_digits().data / 16.0).astype(np.float32)}
    train_rows = {row.tobytes() for row in data.inputs.reshape(len(data), -1)}
    heldout_rows = {row.tobytes() for row in heldout.inputs.reshape(len(heldout), -1)}
    assert train_rows | heldout_rows == every
    assert len(train_rows & heldout_rows) <= 5  # scikit-learn's digits hold a few duplicates


def test_the_shipped_number_pairs_are_what_num2words_writes() -> None:
    """workloads/numbers.npz (read at every worker's start) holds the pairs num2words
    writes now, and reads back as the same int64 arrays; a few decoded against num2words
    itself."""
    from num2words import num2words

    from hetbench.workloads import numbers

    assert numbers.SHIPPED.is_file()
    for split in ("train", "heldout"):
        shipped, made = numbers.corpus(split), numbers.generate(split)
        for field in ("numbers", "inputs", "targets"):
            got, want = getattr(shipped, field), getattr(made, field)
            assert got.dtype == want.dtype == np.int64 and np.array_equal(got, want), field
        for row in (0, 1, len(made.numbers) - 1):
            number = int(shipped.numbers[row])
            english = shipped.inputs[row, : numbers.SOURCE_LEN]
            french = shipped.targets[row]
            assert numbers.decode(english, numbers.SOURCE_VOCAB) == num2words(
                number, lang="en").replace(",", "")
            assert numbers.decode(french, numbers.TARGET_VOCAB) == num2words(number, lang="fr")


@pytest.mark.parametrize(("name", "workload"), [("digits", "cnn"), ("text", "lstm"),
                                                ("synthetic", "resnet"), ("scenes", "vgg")])
def test_heldout_split_is_fixed_and_apart_from_training(name: str, workload: str) -> None:
    train = load_dataset(name, workload, 0)
    heldout = load_dataset(name, workload, 0, "heldout")
    assert len(heldout) > 0 and heldout.sample_shape == train.sample_shape
    assert heldout.fingerprint != train.fingerprint
    if name != "synthetic":  # fixed by the data set, not by the run's seed
        assert load_dataset(name, workload, 9, "heldout").fingerprint == heldout.fingerprint
    with pytest.raises(ValueError, match="unknown split"):
        load_dataset(name, workload, 0, "test")


def test_text_is_standard_library_source() -> None:
    data = load_dataset("text", "lstm", 0)
    assert data.inputs.shape[1] == 64 and data.num_classes == len(TEXT_VOCAB)
    decoded = "".join(TEXT_VOCAB[i] for i in data.inputs[0])
    text = "".join(TEXT_VOCAB[i] for i in data.inputs[:200].ravel())
    assert "def " in text and "argparse" in text
    # Targets are the inputs shifted by one character.
    assert np.array_equal(data.inputs[0, 1:], data.targets[0, :-1]), decoded
    # the held-out tenth is the corpus' end: it continues where training stops
    heldout = load_dataset("text", "lstm", 0, "heldout")
    assert abs(len(heldout) - (len(data) + len(heldout)) * 0.1) <= 1
    ids = encode_text(text_corpus()[0])
    start = len(data) * (data.inputs.shape[1] + 1)  # windows of 65 characters, back to back
    assert np.array_equal(heldout.inputs[0], ids[start: start + data.inputs.shape[1]])


def test_synthetic_is_generated_from_the_seed() -> None:
    a, b = load_dataset("synthetic", "cnn", 1), load_dataset("synthetic", "cnn", 1)
    assert a.fingerprint == b.fingerprint and a.inputs.shape[1:] == (1, 28, 28)
    assert load_dataset("synthetic", "resnet", 1).inputs.shape[1:] == (3, 32, 32)
    assert load_dataset("synthetic", "cnn", 2).fingerprint != a.fingerprint
    tokens = load_dataset("synthetic", "lstm", 1)
    assert tokens.is_tokens and tokens.inputs.shape[1] == 64


@pytest.mark.parametrize(("name", "workload"), [("digits", "cnn"), ("text", "lstm"),
                                                ("synthetic", "mlp"), ("synthetic", "lstm"),
                                                ("scenes", "resnet")])
def test_sample_count_is_the_size_of_the_loaded_data_set(name: str, workload: str) -> None:
    assert sample_count(name, workload) == len(load_dataset(name, workload, 0).inputs)
