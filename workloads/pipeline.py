"""What a real input pipeline does to an image batch, framework-free: decode stored PNGs and
augment (pad-and-crop, horizontal flip, the CIFAR recipe of He et al. 2016).

Augmentation is random but fixed by (seed, step, the sample's place in the global batch):
the draws are made for the whole global batch and each worker takes its slice's rows, so a
partition never changes what a sample looks like (DESIGN.md principle 4).
"""

from __future__ import annotations

import io

import numpy as np

PAD = 4  # pixels of zero padding before the random crop


def encode_png(images: np.ndarray) -> list[bytes]:
    """float images (N, C, H, W) in [0, 1] -> one PNG per image (8-bit, as stored data sets)."""
    from PIL import Image

    pixels = np.clip(np.rint(images * 255.0), 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)
    blobs = []
    for image in pixels:
        buffer = io.BytesIO()
        Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(
            buffer, format="PNG", compress_level=1)
        blobs.append(buffer.getvalue())
    return blobs


def decode_png(blobs: list[bytes], channels: int) -> np.ndarray:
    """PNGs -> float32 (N, C, H, W) in [0, 1]."""
    from PIL import Image

    mode = "L" if channels == 1 else "RGB"
    images = np.stack([np.asarray(Image.open(io.BytesIO(b)).convert(mode)) for b in blobs])
    if images.ndim == 3:
        images = images[..., None]
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32) / 255.0


def augment(images: np.ndarray, seed: int, step: int, lo: int, total: int) -> np.ndarray:
    """Rows lo.. of a global batch of `total`: each image zero-padded by PAD, cropped back at
    a random offset and flipped left-right with probability 1/2."""
    rng = np.random.default_rng([seed, step, 0xA46])
    offsets = rng.integers(0, 2 * PAD + 1, size=(total, 2))[lo: lo + len(images)]
    flips = (rng.random(total) < 0.5)[lo: lo + len(images)]
    n, c, h, w = images.shape
    padded = np.zeros((n, c, h + 2 * PAD, w + 2 * PAD), dtype=images.dtype)
    padded[:, :, PAD: PAD + h, PAD: PAD + w] = images
    out = np.empty_like(images)
    for i, ((dy, dx), flip) in enumerate(zip(offsets, flips, strict=True)):
        crop = padded[i, :, dy: dy + h, dx: dx + w]
        out[i] = crop[:, :, ::-1] if flip else crop
    return out
