"""Rendered frames as PNG data URLs, for environments made with ``render_mode="rgb_array"``.

A frame travels in the observation's ``frame`` field, so any client (and the
``/web`` page, which shows it as an image) gets it with the step it belongs
to. PNG is written with the standard library only (``zlib``), no imaging
package: an RGB frame is a few lines of filtering and one deflate.

>>> import numpy as np
>>> url = png_data_url(np.zeros((2, 3, 3), dtype=np.uint8))
>>> url.startswith("data:image/png;base64,iVBORw0KGgo")
True
"""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

import numpy as np

__all__ = ["png_data_url"]

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_data_url(frame: Any) -> str:
    """An ``H x W x 3`` (RGB) or ``H x W x 4`` (RGBA) uint8 array as a PNG data URL.

    Raises:
        ValueError: The array is not an image of that shape.
    """
    pixels = np.ascontiguousarray(frame, dtype=np.uint8)
    if pixels.ndim != 3 or pixels.shape[2] not in (3, 4):
        raise ValueError(f"a frame is H x W x 3 or 4 (RGB/RGBA), got shape {pixels.shape}")
    height, width, channels = pixels.shape
    # Filter type 0 (none) before every row, then one deflate of the whole image.
    rows = np.concatenate([np.zeros((height, 1), dtype=np.uint8), pixels.reshape(height, -1)], 1)
    color_type = 2 if channels == 3 else 6
    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    data = (
        _SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
        + _chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _chunk(kind: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(kind + body) & 0xFFFFFFFF
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)
