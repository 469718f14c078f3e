"""Writes the classifier example's data: JPEG images in class subfolders, as a photo data
set is laid out (data/train/<class>/<n>.jpg, data/heldout/...). The scenes are rendered by
hetbench's scene grammar (32x32, ten classes by their main object), so nothing is
downloaded; the JPEG encoding makes the DataLoader decode each image as it would a photo's.

    python make_images.py [--train 4000] [--heldout 500]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from hetbench.workloads.scenes import render_scenes

HERE = Path(__file__).resolve().parent


def write(folder: Path, count: int, seed: int) -> None:
    scenes = render_scenes(count, seed=seed)
    pixels = (scenes.images.transpose(0, 2, 3, 1) * 255).round().astype(np.uint8)
    for i, (image, label) in enumerate(zip(pixels, scenes.labels, strict=True)):
        target = folder / f"class{int(label):02d}"
        target.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(target / f"{i:05d}.jpg", quality=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=4000)
    parser.add_argument("--heldout", type=int, default=500)
    parser.add_argument("--out", type=Path, default=HERE / "data")
    args = parser.parse_args()
    write(args.out / "train", args.train, seed=0)
    write(args.out / "heldout", args.heldout, seed=1)
    print(f"wrote {args.train} + {args.heldout} JPEG images under {args.out}")


if __name__ == "__main__":
    main()
