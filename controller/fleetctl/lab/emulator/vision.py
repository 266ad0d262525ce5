"""What the emulated vision tower sees in an image: the colour and shape of one drawn figure.

The emulator is standard library only (it runs in an image with nothing but ``python3``), so the
PNG of an ``image_url`` data URL is read here with ``zlib``: 8-bit RGB or RGBA, not interlaced,
all five row filters (what Pillow and most encoders write for a plain drawing). The figure is the
pixels that are not near-white: its mean colour names the colour, the share of its bounding box
it fills names the shape (a square fills all, a circle pi/4, a triangle half).
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib

#: Named colours the tower knows (RGB).
COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 160, 60),
           "yellow": (240, 210, 20), "black": (0, 0, 0), "purple": (128, 0, 128)}

_PNG = b"\x89PNG\r\n\x1a\n"
#: The most pixels read of one image (a 4096x4096 picture; larger is not looked at).
MAX_PIXELS = 1 << 24


class ImageError(ValueError):
    """The image could not be read (vLLM answers such a request 400)."""


def look(url: str) -> str:
    """What the tower sees in a data URL's PNG: ``a red circle``."""
    _width, _height, rows = _decode(_png_bytes(url))
    xs: list[int] = []
    ys: list[int] = []
    total = [0, 0, 0]
    for y, row in enumerate(rows):
        for x, (r, g, b) in enumerate(row):
            if min(r, g, b) < 200:
                xs.append(x)
                ys.append(y)
                total[0] += r
                total[1] += g
                total[2] += b
    if not xs:
        return "a blank white image"
    n = len(xs)
    mean = tuple(t / n for t in total)
    colour = min(COLOURS, key=lambda c: sum((a - b) ** 2 for a, b in zip(COLOURS[c], mean,
                                                                          strict=True)))
    box = (max(xs) - min(xs) + 1) * (max(ys) - min(ys) + 1)
    fill = n / box
    shape = "square" if fill > 0.93 else "circle" if fill > 0.65 else "triangle"
    return f"a {colour} {shape}"


def _png_bytes(url: str) -> bytes:
    head, sep, data = url.partition(",")
    if not sep or not head.startswith("data:image/png") or ";base64" not in head:
        raise ImageError("only data:image/png;base64 URLs are read by the emulator")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the image's base64 does not decode") from None


def _decode(raw: bytes) -> tuple[int, int, list[list[tuple[int, int, int]]]]:
    """(width, height, rows of RGB pixels) of an 8-bit RGB/RGBA PNG."""
    if not raw.startswith(_PNG):
        raise ImageError("not a PNG")
    pos, idat, header = 8, bytearray(), b""
    while pos + 8 <= len(raw):
        length, kind = struct.unpack(">I4s", raw[pos:pos + 8])
        chunk = raw[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        elif kind == b"IEND":
            break
    if len(header) != 13:
        raise ImageError("the PNG has no IHDR")
    width, height, depth, colour_type, _c, _f, interlace = struct.unpack(">IIBBBBB", header)
    if depth != 8 or colour_type not in (2, 6) or interlace or width * height > MAX_PIXELS:
        raise ImageError("only 8-bit RGB/RGBA PNGs, not interlaced, are read by the emulator")
    bpp = 3 if colour_type == 2 else 4
    stride = width * bpp
    data = zlib.decompress(bytes(idat))
    rows: list[list[tuple[int, int, int]]] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        line = bytearray(data[start + 1:start + 1 + stride])
        _unfilter(data[start], line, prev, bpp)
        rows.append([(line[i], line[i + 1], line[i + 2]) for i in range(0, stride, bpp)])
        prev = line
    return width, height, rows


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> None:
    """Undo one row's PNG filter in place (None, Sub, Up, Average, Paeth)."""
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if kind == 1:
            line[i] = (line[i] + a) & 0xFF
        elif kind == 2:
            line[i] = (line[i] + b) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (a + b) // 2) & 0xFF
        elif kind == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
            line[i] = (line[i] + pred) & 0xFF
