"""Structural checks shared by the picture tests: the PNG's size, nothing drawn outside
the canvas, the one image of a figure, and the bound on every picture's size."""

from __future__ import annotations

import struct
from pathlib import Path

from relax_straggler.common.slowdown_image import DPI, MAX_FIGURE_IN

MAX_PX = (MAX_FIGURE_IN[0] * DPI, MAX_FIGURE_IN[1] * DPI)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels of the PNG at `path`, from its header."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def assert_nothing_clipped(fig) -> None:
    """Every artist of `fig` (titles, labels, colour bar) lies inside its canvas."""
    fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches, every artist's full extent
    width, height = fig.get_size_inches()
    assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width + 1e-6 and box.y1 <= height + 1e-6, (box, width, height)


def image_of(fig):
    """The one image drawn on the figure's first axes."""
    (image,) = fig.axes[0].images
    return image
