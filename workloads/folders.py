"""A user's local data as a map-style torch Dataset, without code: a suite may name a folder
or file of data instead of a Dataset class (a workload named by import path).

`open_data` decides by what the path is: a folder of images in class subfolders (as
torchvision's ImageFolder), a folder holding inputs.npy + targets.npy (memory-mapped), a .npz
file, a .parquet or .csv table, or a folder a Hugging Face `datasets` Dataset was saved to
(`save_to_disk`; needs the optional `datasets` package). Nothing is ever fetched from the
network, and anything else is refused in one line that names the path and what is allowed.

Torch is imported at the top: this module is only ever imported by code that has loaded the
framework already. Pillow, pandas and datasets load inside the functions that need them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
ALLOWED = ("a folder of images in class subfolders, inputs.npy + targets.npy, .npz, .parquet, "
           ".csv, a datasets save_to_disk folder")
NPZ_LAYOUTS = (("inputs", "targets"), ("x", "y"))
# Files written by datasets' Dataset.save_to_disk (dataset_dict.json: a DatasetDict's).
HF_MARKERS = ("dataset_info.json", "state.json")
FINGERPRINT_CHUNK = 64 * 1024  # bytes hashed from each end of every file


def refuse(path: Path | str, problem: str) -> ValueError:
    """One line naming the path, the problem and what is allowed."""
    return ValueError(f"{path}: {problem} (allowed: {ALLOWED})")


class FolderData(Dataset[Any]):
    """A map-style data set read from local files. `kind` says which reader ("images",
    "arrays", "table", "hf-datasets"); `num_classes` is the number of class folders, or
    max + 1 of non-negative integer targets, else None; `fingerprint()` names the data's
    content so that a copy elsewhere is recognised as the same data."""

    def __init__(self, source: Path, kind: str, num_classes: int | None,
                 files: Sequence[Path], root: Path, tags: Sequence[str] = ()) -> None:
        self.source = str(source)
        self.kind = kind
        self.num_classes = num_classes
        self._files = list(files)  # what the fingerprint reads, named relative to root
        self._root = root
        self._tags = list(tags)  # what else decides the samples (a table's target column)

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError

    def fingerprint(self) -> str:
        """16 hex digits of sha256 over the kind, the number of samples and, per file, its
        relative path, size and first and last 64 KiB: cheap for large files, and blind to
        where the data lies and to mtimes, so a copy fingerprints the same."""
        digest = hashlib.sha256()

        def field(data: bytes) -> None:  # length-prefixed: no two layouts hash alike
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)

        field(self.kind.encode())
        field(str(len(self)).encode())
        for tag in self._tags:
            field(tag.encode())
        for file in self._files:
            size = file.stat().st_size
            field(file.relative_to(self._root).as_posix().encode())
            field(str(size).encode())
            with file.open("rb") as stream:
                if size <= 2 * FINGERPRINT_CHUNK:
                    field(stream.read())
                else:
                    field(stream.read(FINGERPRINT_CHUNK))
                    stream.seek(size - FINGERPRINT_CHUNK)
                    field(stream.read(FINGERPRINT_CHUNK))
        return digest.hexdigest()[:16]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(kind={self.kind!r}, source={self.source!r}, "
                f"samples={len(self)}, num_classes={self.num_classes})")


def open_data(path: str | Path, *, target: str | None = None) -> FolderData:
    """The data at `path` as a Dataset, its reader chosen by what the path is. `target` names
    a table's target column (required for tables) or a datasets folder's label column."""
    given = Path(path).expanduser()
    if not given.exists():
        raise refuse(given, "no such file or folder")
    source = given.resolve()
    if source.is_dir():
        names = {p.name for p in source.iterdir()}
        if names & {*HF_MARKERS, "dataset_dict.json"}:
            return _open_hf(given, source, target)
        if names & {"inputs.npy", "targets.npy"}:
            _no_target(given, target, "arrays")
            return _open_npy(given, source)
        _no_target(given, target, "image folders")
        return _open_images(given, source)
    suffix = source.suffix.lower()
    if suffix == ".npz":
        _no_target(given, target, "arrays")
        return _open_npz(given, source)
    if suffix == ".npy":
        raise refuse(given, "a .npy file holds inputs only: give a folder with inputs.npy and "
                            "targets.npy, or a .npz with both")
    if suffix in (".parquet", ".csv"):
        return _open_table(given, source, target)
    raise refuse(given, "not a data folder or file hetbench reads")


def _no_target(given: Path, target: str | None, kind: str) -> None:
    """A target column means nothing to images or arrays: refused, not silently ignored."""
    if target is not None:
        raise refuse(given, f"target={target!r} names a column, and {kind} have none "
                            "(the target applies to tables and datasets folders)")


def _class_count(targets: np.ndarray) -> int | None:
    """max + 1 of non-negative integer targets; None for other targets."""
    if targets.dtype.kind not in "iu" or targets.size == 0 or targets.min() < 0:
        return None
    return int(targets.max()) + 1


# --- images ------------------------------------------------------------------------------


class ImageFolderData(FolderData):
    """Images in class subfolders, each decoded by Pillow when read: (float32 C,H,W in
    [0, 1], int64 label). Sizes may differ; nothing is resized."""

    def __init__(self, source: Path, samples: list[tuple[Path, int]], classes: list[str]) -> None:
        super().__init__(source, "images", len(classes), [p for p, _ in samples], source)
        self.classes = classes
        self._samples = samples

    def __len__(self) -> int:
        return len(self._samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        file, label = self._samples[index]
        try:
            with Image.open(file) as image:
                pixels = np.array(image.convert("RGB"))
        except OSError as err:  # PIL.UnidentifiedImageError among them
            raise ValueError(f"{file}: not an image Pillow decodes ({err})") from err
        chw = np.ascontiguousarray(pixels.transpose(2, 0, 1), dtype=np.float32) / 255.0
        return torch.from_numpy(chw), torch.tensor(label, dtype=torch.int64)


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(
        ".")


def _open_images(given: Path, source: Path) -> FolderData:
    entries = sorted(p for p in source.iterdir() if not p.name.startswith("."))
    if not entries:
        raise refuse(given, "empty folder: no class subfolders of images")
    loose = [p.name for p in entries if _is_image(p)]
    if loose:  # refused rather than dropped: they would silently be left out of the data
        raise refuse(given, f"images outside class subfolders ({', '.join(loose[:3])}"
                            f"{', ...' if len(loose) > 3 else ''}): put each in <class>/")
    classes = [p.name for p in entries if p.is_dir()]
    if not classes:
        raise refuse(given, "not a data folder or file hetbench reads")
    samples: list[tuple[Path, int]] = []
    for label, name in enumerate(classes):
        # Nested folders count as their class's, as in torchvision's ImageFolder.
        files = sorted(p for p in (source / name).rglob("*") if _is_image(p))
        if not files:
            raise refuse(given / name, f"class folder {name!r} holds no images "
                                       f"({', '.join(IMAGE_SUFFIXES)})")
        samples.extend((file, label) for file in files)
    return ImageFolderData(source, samples, classes)


# --- arrays ------------------------------------------------------------------------------


class ArrayData(FolderData):
    """Inputs and targets as numpy arrays, sample i = (inputs[i], targets[i]) as tensors of
    their stored dtypes. From a folder they are memory-mapped, and mapped again in each
    process a DataLoader pickles the data set to (pickling a memmap would copy it whole)."""

    def __init__(self, source: Path, files: list[Path], root: Path,
                 arrays: tuple[np.ndarray, np.ndarray], mapped: bool) -> None:
        super().__init__(source, "arrays", _class_count(np.asarray(arrays[1])), files, root)
        self._arrays: tuple[np.ndarray, np.ndarray] | None = arrays
        self._mapped = mapped
        self._length = len(arrays[0])

    def _loaded(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            inputs, targets = self._files
            self._arrays = (np.load(inputs, mmap_mode="r"), np.load(targets, mmap_mode="r"))
        return self._arrays

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self._mapped:
            state["_arrays"] = None
        return state

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self._loaded()
        return torch.from_numpy(np.array(inputs[index])), torch.tensor(targets[index])


def _check_arrays(given: Path, inputs: np.ndarray, targets: np.ndarray) -> None:
    for name, array in (("inputs", inputs), ("targets", targets)):
        if array.ndim == 0:
            raise refuse(given, f"{name} is a scalar: it needs a first axis of samples")
        if array.dtype.hasobject:
            raise refuse(given, f"{name} holds Python objects: store numbers")
    if len(inputs) != len(targets):
        raise refuse(given, f"inputs hold {len(inputs)} samples and targets {len(targets)}: "
                            "they must be as many")
    if len(inputs) == 0:
        raise refuse(given, "inputs and targets hold no samples")


def _load_npy(given: Path, file: Path) -> np.ndarray:
    try:
        return np.load(file, mmap_mode="r")
    except ValueError as err:  # object arrays: mmap and allow_pickle=False refuse them
        raise refuse(given, f"{file.name} is not a plain numeric array ({err})") from err


def _open_npy(given: Path, source: Path) -> FolderData:
    files = [source / "inputs.npy", source / "targets.npy"]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise refuse(given, f"{' and '.join(missing)} missing beside the other")
    inputs, targets = (_load_npy(given, f) for f in files)
    _check_arrays(given, inputs, targets)
    return ArrayData(source, files, source, (inputs, targets), mapped=True)


def _open_npz(given: Path, source: Path) -> FolderData:
    # numpy cannot memory-map an array inside a zip: a .npz is read into memory whole.
    try:
        with np.load(source, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError) as err:  # not a zip, or an object array inside
        raise refuse(given, f"not a .npz of numeric arrays numpy reads ({err})") from err
    keys = sorted(arrays)
    layout = next((pair for pair in NPZ_LAYOUTS if sorted(pair) == keys), None)
    if layout is None:
        raise refuse(given, f"a .npz must hold exactly two arrays, inputs and targets (or x "
                            f"and y); found {', '.join(keys) or 'none'}")
    inputs, targets = (arrays[key] for key in layout)
    _check_arrays(given, inputs, targets)
    return ArrayData(source, [source], source.parent, (inputs, targets), mapped=False)


# --- tables ------------------------------------------------------------------------------


class TableData(FolderData):
    """Rows of a table: (float32 feature vector, target): int64 for an integer or boolean
    target column, float32 for a float one. Read into memory whole."""

    def __init__(self, source: Path, target: str, features: np.ndarray,
                 targets: np.ndarray) -> None:
        super().__init__(source, "table", _class_count(targets), [source], source.parent,
                         tags=[target])
        self.target = target
        self._features = torch.from_numpy(features)
        self._targets = torch.from_numpy(targets)

    def __len__(self) -> int:
        return len(self._features)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._features[index], self._targets[index]


def _open_table(given: Path, source: Path, target: str | None) -> FolderData:
    import pandas as pd
    from pandas.api import types

    try:
        if source.suffix.lower() == ".parquet":
            frame = pd.read_parquet(source, engine="pyarrow")
        else:
            frame = pd.read_csv(source)
    except Exception as err:  # pyarrow's and pandas' parse errors share no base class
        raise refuse(given, f"not a table pandas reads ({type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else ''})") from err
    columns = [str(c) for c in frame.columns]
    frame.columns = columns
    if target is None:
        raise refuse(given, f"a table needs target= naming its target column; columns: "
                            f"{', '.join(columns)}")
    if target not in columns:
        raise refuse(given, f"no target column {target!r}; columns: {', '.join(columns)}")
    features = [c for c in columns if c != target]
    if not features:
        raise refuse(given, f"no feature columns besides the target {target!r}")
    column = frame[target]
    if types.is_bool_dtype(column) or types.is_integer_dtype(column):
        dtype: type[np.generic] = np.int64
    elif types.is_float_dtype(column):
        dtype = np.float32
    else:
        raise refuse(given, f"target column {target!r} is {column.dtype}, not numbers: encode "
                            "its classes as integers")
    text = [c for c in features if not types.is_numeric_dtype(frame[c])]
    if text:
        raise refuse(given, f"non-numeric feature columns: {', '.join(text)} (features must be "
                            "numbers)")
    gaps = [c for c in columns if frame[c].isna().any()]
    if gaps:
        raise refuse(given, f"missing values in columns: {', '.join(gaps)}")
    if len(frame) == 0:
        raise refuse(given, "the table has no rows")
    # Copies: pyarrow-backed columns give read-only arrays, which torch will not wrap.
    inputs = np.array(frame[features].to_numpy(dtype=np.float32), order="C")
    targets = np.array(column.to_numpy(dtype=dtype), order="C")
    return TableData(source, target, inputs, targets)


# --- Hugging Face datasets -----------------------------------------------------------------


class HFData(FolderData):
    """A datasets Dataset saved with save_to_disk: its rows as dicts of tensors
    (with_format("torch")), memory-mapped by datasets' Arrow files."""

    def __init__(self, source: Path, dataset: Any, num_classes: int | None,
                 files: list[Path]) -> None:
        super().__init__(source, "hf-datasets", num_classes, files, source)
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row: dict[str, Any] = self.dataset[index]
        return row


def _open_hf(given: Path, source: Path, target: str | None) -> FolderData:
    if (source / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in source.iterdir() if p.is_dir())
        raise refuse(given, f"a datasets DatasetDict: name one split's folder "
                            f"({', '.join(splits)})")
    try:
        import datasets
    except ImportError as err:
        raise ValueError(f"{given}: a Hugging Face datasets folder needs the optional datasets "
                         "package: pip install datasets") from err
    try:
        dataset = datasets.load_from_disk(str(source))
    except Exception as err:  # datasets raises several kinds for a damaged folder
        raise refuse(given, f"not a folder datasets.load_from_disk reads ({type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else ''})") from err
    if not isinstance(dataset, datasets.Dataset):
        raise refuse(given, f"a datasets {type(dataset).__name__}, not one Dataset")
    features = dataset.features
    if target is not None and target not in features:
        raise refuse(given, f"no column {target!r}; columns: {', '.join(features)}")
    # The label column's class count: the target's, or that of the one ClassLabel column.
    labels = [name for name, f in features.items() if isinstance(f, datasets.ClassLabel)]
    label = target if target is not None else (labels[0] if len(labels) == 1 else "")
    num_classes = int(features[label].num_classes) if label in labels else None
    files = sorted(p for p in source.rglob("*") if p.is_file())
    return HFData(source, dataset.with_format("torch"), num_classes, files)
