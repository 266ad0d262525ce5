"""The image probe: PNGs the soak draws itself, asked their colour and shape.

The seeds validated the heretic model's vision fix with a shapes/colours probe (7/7): a tower
that was skip-loaded answered every image with ``!!!!`` while text stayed perfect. Each image is
one solid shape on a plain white background, drawn with Pillow (no file to ship, no network),
sent as an ``image_url`` data URL; the answer must name the colour and the shape. Garbage, a
wrong colour or shape, or a refused image fails, naming the image.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageDraw

from fleetctl.soak.capabilities.exchange import Exchange
from fleetctl.soak.checks.judge import garbage, snippet
from fleetctl.soak.verdict import Measurement, Outcome

#: The drawings' side in pixels: small (a few hundred image tokens), big enough for any encoder.
SIZE = 224

#: Colour name -> RGB: far apart, so that no encoder's colour jitter makes one another.
COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 160, 60),
           "yellow": (240, 210, 20)}

#: Shape name -> words an answer may use for it.
SHAPES = {"circle": ("circle", "round", "disc", "disk"), "square": ("square",),
          "triangle": ("triangle", "triangular")}

PROMPT = ("What colour is the shape in this image, and what shape is it? Answer with the colour "
          "and the shape only, for example: purple star.")

#: Tokens an answer may take (two words, said briefly).
MAX_TOKENS = 24


@dataclass(frozen=True)
class Drawing:
    """One image of the probe: its colour and its shape."""

    colour: str
    shape: str

    @property
    def label(self) -> str:
        """``red circle``."""
        return f"{self.colour} {self.shape}"


#: The probe's images: every shape once, each in another colour.
DRAWINGS = (Drawing("red", "circle"), Drawing("blue", "square"), Drawing("green", "triangle"))


def png(d: Drawing) -> bytes:
    """``d`` drawn as a PNG: the shape filled, centred, on white."""
    img = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    m, far = SIZE // 5, SIZE - SIZE // 5
    fill = COLOURS[d.colour]
    if d.shape == "circle":
        draw.ellipse((m, m, far, far), fill=fill)
    elif d.shape == "square":
        draw.rectangle((m, m, far, far), fill=fill)
    else:
        draw.polygon(((SIZE // 2, m), (far, far), (m, far)), fill=fill)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def data_url(d: Drawing) -> str:
    """``d`` as an ``image_url`` data URL (``data:image/png;base64,...``)."""
    return "data:image/png;base64," + base64.b64encode(png(d)).decode()


def body(model: str, d: Drawing) -> dict[str, Any]:
    """The chat completion asking about ``d`` (greedy, thinking off: the answer in content)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": PROMPT},
            {"type": "image_url", "image_url": {"url": data_url(d)}},
        ]}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def describe(d: Drawing) -> str:
    """The prompt as a failure shows it (the image described, never inlined)."""
    return f"[PNG {SIZE}x{SIZE}: a {d.label} on white] {PROMPT}"


def judge(exchanges: Sequence[Exchange]) -> list[Measurement]:
    """One measurement per image: its colour and shape named, nothing else wrong."""
    return [_one(x) for x in exchanges]


def _one(x: Exchange) -> Measurement:
    colour, shape = x.expected.split(" ", 1)
    r = x.reply
    where = f"images: the {x.label} image ({x.prompt!r})"
    if not r.ok:
        return Measurement(x.label, Outcome.FAIL,
                           f"{where}: expected {x.expected!r}, got no answer: {r.error}",
                           r.error[:120], x.expected)
    text = (r.content or "").strip()
    low = text.lower()
    if why := garbage(text):
        return Measurement(x.label, Outcome.FAIL,
                           f"{where}: expected {x.expected!r}, got garbage ({why}): "
                           f"{snippet(text)} (the vision tower may not be loaded)",
                           snippet(text), x.expected)
    named_colour = colour in low
    named_shape = any(w in low for w in SHAPES[shape])
    others = [c for c in COLOURS if c != colour and c in low]
    if named_colour and named_shape and not others:
        return Measurement(x.label, Outcome.PASS, f"images: {x.label}: {snippet(text)}",
                           snippet(text), x.expected)
    return Measurement(x.label, Outcome.FAIL,
                       f"{where}: expected {x.expected!r}, got {snippet(text)}",
                       snippet(text), x.expected)
