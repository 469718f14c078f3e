"""hetbench.workloads.folders: a user's local data read as a Dataset without code. Every
sample is checked against what the test itself wrote (or Pillow's own decode of it), and
every refusal is one line naming the path and the problem."""

from __future__ import annotations

import pickle
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from hetbench.workloads.folders import FolderData, open_data

# --- helpers -------------------------------------------------------------------------------


def refused(path: Path | str, *words: str, target: str | None = None) -> str:
    """open_data's one-line refusal of `path`, checked to name the path and `words`."""
    with pytest.raises(ValueError) as caught:
        open_data(path, target=target)
    message = str(caught.value)
    assert "\n" not in message, message
    assert str(path) in message, message
    for word in words:
        assert word in message, (word, message)
    return message


def pixels(seed: int, size: tuple[int, int] = (6, 5)) -> np.ndarray:
    """An H, W, 3 uint8 image: width 6, height 5 unless told."""
    width, height = size
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def image_folder(root: Path) -> dict[str, np.ndarray]:
    """Classes 'cat' (two PNGs, one JPEG) and 'ant' (one PNG, one nested JPEG): the written
    pixels of each PNG, by path relative to root."""
    written = {}
    for relative, seed in (("cat/b.png", 1), ("cat/a.png", 2), ("ant/z.png", 3)):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        written[relative] = pixels(seed)
        Image.fromarray(written[relative]).save(root / relative)
    (root / "ant" / "deeper").mkdir()
    Image.fromarray(pixels(4)).save(root / "ant" / "deeper" / "y.JPG", format="JPEG")
    Image.fromarray(pixels(5)).save(root / "cat" / "c.jpeg", quality=90)
    (root / "cat" / "notes.txt").write_text("not an image: left out")
    return written


def assert_fingerprint_follows_content(original: Path, change: Callable[[Path], None],
                                       target: str | None = None) -> None:
    """The same data copied elsewhere fingerprints the same; one sample changed does not."""
    fingerprint = open_data(original, target=target).fingerprint()
    assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
    copy = original.parent / f"copy-of-{original.name}" / original.name
    copy.parent.mkdir()
    if original.is_dir():
        shutil.copytree(original, copy)
    else:
        shutil.copy(original, copy)
    assert open_data(copy, target=target).fingerprint() == fingerprint
    change(copy)
    assert open_data(copy, target=target).fingerprint() != fingerprint


# --- images --------------------------------------------------------------------------------


def test_image_folder_reads_classes_sorted_and_samples_by_path(tmp_path: Path) -> None:
    root = tmp_path / "images"
    written = image_folder(root)
    data = open_data(root)
    assert isinstance(data, FolderData) and isinstance(data, torch.utils.data.Dataset)
    assert data.kind == "images" and data.source == str(root.resolve())
    assert len(data) == 5 and data.num_classes == 2  # ant 0, cat 1; notes.txt left out
    order = ["ant/deeper/y.JPG", "ant/z.png", "cat/a.png", "cat/b.png", "cat/c.jpeg"]
    labels = [0, 0, 1, 1, 1]
    for index, (relative, label) in enumerate(zip(order, labels, strict=True)):
        image, target = data[index]
        assert image.dtype == torch.float32 and image.shape == (3, 5, 6)
        assert target.dtype == torch.int64 and target.shape == () and int(target) == label
        if relative in written:  # PNG: lossless, the written bytes exactly
            expected = written[relative].transpose(2, 0, 1) / 255.0
        else:  # JPEG: Pillow's own decode of the same file is the reference
            with Image.open(root / relative) as reference:
                expected = np.asarray(reference.convert("RGB")).transpose(2, 0, 1) / 255.0
        np.testing.assert_allclose(image.numpy(), expected, atol=1e-6)
        assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0


def test_images_of_other_sizes_and_modes_are_read_as_they_are(tmp_path: Path) -> None:
    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    Image.fromarray(pixels(1, (7, 3))).save(root / "a" / "wide.png")
    Image.fromarray(pixels(2)[..., 0]).save(root / "a" / "grey.bmp")  # mode L -> RGB
    data = open_data(root)
    grey, wide = data[0][0], data[1][0]
    assert wide.shape == (3, 3, 7)  # no resizing
    assert grey.shape == (3, 5, 6)
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])
    np.testing.assert_allclose(grey[0].numpy(), pixels(2)[..., 0] / 255.0, atol=1e-6)


def test_a_data_loader_collates_equal_sized_images_into_a_batch(tmp_path: Path) -> None:
    root = tmp_path / "images"
    image_folder(root)
    Image.fromarray(pixels(6)).save(root / "ant" / "w.png")
    data = open_data(root)
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=0)
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 5, 6) and images.dtype == torch.float32
    assert labels.tolist() == [0, 0, 0, 1]
    assert sum(len(batch[0]) for batch in loader) == 6


def test_image_fingerprint_follows_content_not_place(tmp_path: Path) -> None:
    root = tmp_path / "images"
    image_folder(root)

    def change_one_pixel(copy: Path) -> None:
        changed = pixels(2)
        changed[0, 0, 0] ^= 1
        Image.fromarray(changed).save(copy / "cat" / "a.png")

    assert_fingerprint_follows_content(root, change_one_pixel)


def test_an_image_that_pillow_cannot_decode_is_named_when_read(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "broken.png").write_bytes(b"not a png")
    data = open_data(tmp_path)
    with pytest.raises(ValueError, match="broken.png: not an image Pillow decodes"):
        data[0]


# --- arrays --------------------------------------------------------------------------------


def test_a_folder_of_inputs_and_targets_npy_is_memory_mapped(tmp_path: Path) -> None:
    inputs = np.arange(5 * 2 * 3, dtype=np.uint8).reshape(5, 2, 3)
    targets = np.array([3, 0, 1, 1, 2], dtype=np.int64)
    np.save(tmp_path / "inputs.npy", inputs)
    np.save(tmp_path / "targets.npy", targets)
    data = open_data(tmp_path)
    assert data.kind == "arrays" and len(data) == 5 and data.num_classes == 4
    for index in range(5):
        x, y = data[index]
        assert x.dtype == torch.uint8 and torch.equal(x, torch.from_numpy(inputs[index]))
        assert y.dtype == torch.int64 and y.shape == () and int(y) == targets[index]
    x[0, 0] = 99  # a sample is a copy, never a view of the mapped file
    assert int(data[4][0][0, 0]) == inputs[4, 0, 0]
    # pickled (a DataLoader worker's copy) it maps the files again, and reads the same
    again = pickle.loads(pickle.dumps(data))
    assert torch.equal(again[2][0], data[2][0]) and again.fingerprint() == data.fingerprint()


def test_npz_with_inputs_targets_or_x_y(tmp_path: Path) -> None:
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    y = np.array([0.5, 1.5, -2.0, 3.25])  # float64 targets: no classes
    np.savez(tmp_path / "xy.npz", x=x, y=y)
    np.savez_compressed(tmp_path / "named.npz", inputs=x, targets=np.array([1, 0, 1, 1]))
    data = open_data(tmp_path / "xy.npz")
    assert data.kind == "arrays" and len(data) == 4 and data.num_classes is None
    sample, target = data[2]
    assert sample.dtype == torch.float32 and torch.equal(sample, torch.from_numpy(x[2]))
    assert target.dtype == torch.float64 and float(target) == -2.0
    named = open_data(tmp_path / "named.npz")
    assert named.num_classes == 2 and int(named[0][1]) == 1 and named[0][1].dtype == torch.int64


def test_array_fingerprints_follow_content_not_place(tmp_path: Path) -> None:
    folder = tmp_path / "arrays"
    folder.mkdir()
    np.save(folder / "inputs.npy", np.zeros((3, 2), np.float32))
    np.save(folder / "targets.npy", np.arange(3))

    def change_one_input(copy: Path) -> None:
        inputs = np.load(copy / "inputs.npy")
        inputs[1, 1] = 1.0
        np.save(copy / "inputs.npy", inputs)

    assert_fingerprint_follows_content(folder, change_one_input)
    np.savez(tmp_path / "data.npz", x=np.zeros((3, 2)), y=np.arange(3))
    assert_fingerprint_follows_content(
        tmp_path / "data.npz", lambda copy: np.savez(copy, x=np.zeros((3, 2)), y=[0, 1, 1]))


# --- tables --------------------------------------------------------------------------------


def table() -> pd.DataFrame:
    return pd.DataFrame({"a": [1.5, 2.0, -1.0], "label": [2, 0, 1], "b": [3, 4, 5],
                         "score": [0.25, 0.5, 0.75]})


@pytest.mark.parametrize("suffix", ["parquet", "csv"])
def test_a_table_reads_numeric_features_and_the_named_target(tmp_path: Path,
                                                             suffix: str) -> None:
    path = tmp_path / f"table.{suffix}"
    if suffix == "parquet":
        table().to_parquet(path, engine="pyarrow")
    else:
        table().to_csv(path, index=False)
    data = open_data(path, target="label")
    assert data.kind == "table" and len(data) == 3 and data.num_classes == 3
    features, target = data[1]
    assert features.dtype == torch.float32 and features.tolist() == [2.0, 4.0, 0.5]
    assert target.dtype == torch.int64 and target.shape == () and int(target) == 0
    regression = open_data(path, target="score")
    assert regression.num_classes is None
    features, target = regression[2]
    assert features.tolist() == [-1.0, 1.0, 5.0]
    assert target.dtype == torch.float32 and float(target) == 0.75
    # the target column is part of what the data is
    assert regression.fingerprint() != data.fingerprint()


@pytest.mark.parametrize("suffix", ["parquet", "csv"])
def test_table_fingerprint_follows_content_not_place(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"table.{suffix}"
    write = {"parquet": lambda frame, p: frame.to_parquet(p),
             "csv": lambda frame, p: frame.to_csv(p, index=False)}[suffix]
    write(table(), path)
    changed = table()
    changed.loc[1, "a"] = 2.5
    assert_fingerprint_follows_content(path, lambda copy: write(changed, copy), target="label")


# --- Hugging Face datasets -------------------------------------------------------------------


def test_a_datasets_folder_reads_its_rows_as_tensors(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"x": datasets.Sequence(datasets.Value("float32")),
                                  "label": datasets.ClassLabel(names=["a", "b", "c"])})
    rows = {"x": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.5]], "label": [2, 0, 1]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(tmp_path / "saved")
    data = open_data(tmp_path / "saved")
    assert data.kind == "hf-datasets" and len(data) == 3 and data.num_classes == 3
    row = data[2]
    assert row["x"].tolist() == [5.0, 6.5] and int(row["label"]) == 1
    assert isinstance(row["label"], torch.Tensor)
    assert open_data(tmp_path / "saved", target="label").num_classes == 3
    refused(tmp_path / "saved", "no column 'y'", "columns: x, label", target="y")

    def change_one_row(copy: Path) -> None:
        changed = {"x": [[1.0, 2.0], [3.0, 4.5], [5.0, 6.5]], "label": [2, 0, 1]}
        shutil.rmtree(copy)
        datasets.Dataset.from_dict(changed, features=features).save_to_disk(copy)

    assert_fingerprint_follows_content(tmp_path / "saved", change_one_row)
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows),
                                   "test": datasets.Dataset.from_dict(rows)})
    splits.save_to_disk(tmp_path / "splits")
    refused(tmp_path / "splits", "DatasetDict", "test, train")


def test_a_datasets_folder_without_datasets_says_how_to_install_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "state.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    refused(tmp_path, "needs the optional datasets package", "pip install datasets")


# --- refusals ------------------------------------------------------------------------------


def test_what_is_not_data_is_refused_naming_the_path_and_what_is_allowed(
        tmp_path: Path) -> None:
    allowed = "allowed: a folder of images in class subfolders, inputs.npy + targets.npy"
    refused(tmp_path / "nowhere", "no such file or folder", allowed)
    (tmp_path / "foo.txt").write_text("hello")
    refused(tmp_path / "foo.txt", "not a data folder or file hetbench reads", allowed)
    np.save(tmp_path / "alone.npy", np.zeros(3))
    refused(tmp_path / "alone.npy", "inputs only", "inputs.npy and targets.npy")
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", "empty folder")
    (tmp_path / "loose" / "a").mkdir(parents=True)
    for name in ("a/x.png", "y.png"):
        Image.fromarray(pixels(0)).save(tmp_path / "loose" / name)
    refused(tmp_path / "loose", "images outside class subfolders (y.png)")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "readme.md").write_text("no data")
    refused(tmp_path / "files", "not a data folder or file hetbench reads")


def test_a_class_folder_without_images_is_refused(tmp_path: Path) -> None:
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
    Image.fromarray(pixels(0)).save(tmp_path / "cat" / "a.png")
    (tmp_path / "dog" / "a.txt").write_text("no image")
    refused(tmp_path, "class folder 'dog' holds no images", str(tmp_path / "dog"))


def test_arrays_that_do_not_pair_are_refused(tmp_path: Path) -> None:
    one = tmp_path / "one"
    one.mkdir()
    np.save(one / "inputs.npy", np.zeros((3, 2)))
    refused(one, "targets.npy missing")
    np.save(one / "targets.npy", np.zeros(4))
    refused(one, "inputs hold 3 samples and targets 4")
    objects = tmp_path / "objects"
    objects.mkdir()
    np.save(objects / "inputs.npy", np.array([{"a": 1}, None], dtype=object))
    np.save(objects / "targets.npy", np.zeros(2))
    refused(objects, "inputs.npy is not a plain numeric array")
    np.savez(tmp_path / "keys.npz", data=np.zeros(3), labels=np.zeros(3))
    refused(tmp_path / "keys.npz", "inputs and targets (or x and y)", "found data, labels")
    np.savez(tmp_path / "three.npz", x=np.zeros(3), y=np.zeros(3), z=np.zeros(3))
    refused(tmp_path / "three.npz", "found x, y, z")
    np.savez(tmp_path / "short.npz", x=np.zeros(3), y=np.zeros(2))
    refused(tmp_path / "short.npz", "inputs hold 3 samples and targets 2")
    (tmp_path / "fake.npz").write_bytes(b"not a zip")
    refused(tmp_path / "fake.npz", "not a .npz")
    refused(tmp_path / "one", "target='y' names a column", target="y")


def test_tables_without_a_usable_target_or_features_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    table().to_parquet(path)
    refused(path, "needs target=", "columns: a, label, b, score")
    refused(path, "no target column 'kind'", "columns: a, label, b, score", target="kind")
    words = table().assign(colour=["red", "green", "blue"], note=["x", "y", "z"])
    words.to_csv(tmp_path / "words.csv", index=False)
    refused(tmp_path / "words.csv", "non-numeric feature columns: colour, note", target="label")
    refused(tmp_path / "words.csv", "target column 'colour' is", "encode its classes",
            target="colour")
    table()[["label"]].to_csv(tmp_path / "only.csv", index=False)
    refused(tmp_path / "only.csv", "no feature columns besides the target", target="label")
    gaps = table().astype({"a": "float64"})
    gaps.loc[0, "a"] = np.nan
    gaps.to_parquet(tmp_path / "gaps.parquet")
    refused(tmp_path / "gaps.parquet", "missing values in columns: a", target="label")
    table().iloc[:0].to_parquet(tmp_path / "none.parquet")
    refused(tmp_path / "none.parquet", "no rows", target="label")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    refused(tmp_path / "bad.parquet", "not a table pandas reads", target="label")


def test_a_target_for_images_is_refused_not_ignored(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    Image.fromarray(pixels(0)).save(tmp_path / "a" / "x.png")
    refused(tmp_path, "target='label' names a column", target="label")
