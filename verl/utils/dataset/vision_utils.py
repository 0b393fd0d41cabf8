"""Turn the image / video values stored in RL parquet rows into what HF processors accept (PIL images).

Rows written by upstream tools store images as ``{"bytes": ..., "path": ...}`` dicts (HF ``datasets`` Image
feature); paths and PIL images are accepted too. A video is a list of frames in any of those forms (no video
decoding library is required).
"""

from __future__ import annotations

import io
import os
from typing import Any


def process_image(image: Any):
    """A PIL RGB image from a PIL image, encoded bytes, a ``{"bytes"|"path"|"image"}`` dict or a file path."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, dict):
        if image.get("bytes"):
            return process_image(image["bytes"])
        source = image.get("image") or image.get("path")
        if source is None:
            raise ValueError(f"image dict has neither 'bytes' nor 'path': keys {sorted(image)}")
        return process_image(source)
    if isinstance(image, (bytes, bytearray)):
        return Image.open(io.BytesIO(image)).convert("RGB")
    if isinstance(image, str):
        path = image[len("file://") :] if image.startswith("file://") else image
        if not os.path.isfile(os.path.expanduser(path)):
            raise FileNotFoundError(f"image file {path!r} does not exist")
        return Image.open(os.path.expanduser(path)).convert("RGB")
    raise TypeError(f"unsupported image value of type {type(image).__name__}")


def process_video(video: Any) -> list:
    """A list of PIL RGB frames from a list of frames (each as accepted by :func:`process_image`)."""
    if isinstance(video, dict) and "frames" in video:
        video = video["frames"]
    if not isinstance(video, (list, tuple)) or not video:
        raise TypeError(
            "videos must be stored as a non-empty list of frames (images); decoding video files is not supported, "
            f"got {type(video).__name__}"
        )
    return [process_image(frame) for frame in video]
