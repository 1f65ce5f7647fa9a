"""Transcribe the DualPipe README figure (deepseek-ai/DualPipe ``images/dualpipe.png``,
"Example DualPipe scheduling for 8 PP ranks and 20 micro-batches in two directions") cell by
cell from its pixels, so the tick test does not rest on reading the picture by eye.

Each row of the figure is a device; each cell is one time unit. A cell's colour gives the
pass (orange forward, green backward, blue backward for weights, white idle) and a printed
digit marks the forward direction (the figure omits the reverse direction's batch IDs). Thick
black borders separate passes; a whole backward (two green cells) and an overlapped F&B pair
(one orange and two green cells) sit inside one border with thin grey lines between cells.

Output, one line per device: groups of cells within one black border, separated by spaces;
a cell is ``F``/``B``/``W`` (upper case: forward direction, labelled; lower case: reverse
direction, unlabelled) or ``.`` idle. Usage::

    python tests/data/dualpipe/transcribe_figure.py /path/to/DualPipe/images/dualpipe.png

Needs Pillow; not part of dessim and not run by the tests.
"""

from __future__ import annotations

import sys

from PIL import Image

# geometry of the 3548x590 figure: grid lines measured on its pixels
ROW_LINES = [19.5, 74.5, 130.5, 186.5, 242.5, 298.5, 354.5, 409.5, 465.5]
X0, X1, CELLS = 174.7, 3525.5, 66


def kind(rgb: tuple[int, int, int]) -> str:
    r, g, b = rgb
    if r > 220 and g > 220 and b > 220:
        return "."
    if r > 200 and 140 < g < 200 and b < 100:
        return "F"
    if g > 180 and r < 170 and b < 120:
        return "B"
    if b > 200 and r < 150:
        return "W"
    raise ValueError(f"unknown colour {rgb}")


def transcribe(path: str) -> list[str]:
    im = Image.open(path).convert("RGB")
    pitch = (X1 - X0) / CELLS
    rows = []
    for top, bottom in zip(ROW_LINES, ROW_LINES[1:]):
        y_fill = int(top + 8)                    # above the digits
        cells = []
        for c in range(CELLS):
            left, right = X0 + c * pitch, X0 + (c + 1) * pitch
            k = kind(im.getpixel((int((left + right) / 2), y_fill)))
            cells.append(k)
        # a digit: dark pixels in the middle band of a run of same-kind cells inside a border
        borders = [False] * (CELLS + 1)
        for c in range(CELLS + 1):
            x = X0 + c * pitch
            dark = [sum(im.getpixel((int(x) + dx, y_fill))) for dx in (-2, -1, 0, 1, 2)]
            borders[c] = c in (0, CELLS) or min(dark) < 120
        groups, start = [], 0
        for c in range(1, CELLS + 1):
            if borders[c]:
                groups.append(list(range(start, c)))
                start = c
        line = []
        for group in groups:
            text = ""
            run = [group[0]]
            for c in group[1:] + [None]:
                if c is not None and cells[c] == cells[run[0]]:
                    run.append(c)
                    continue
                k = cells[run[0]]
                if k != ".":
                    x_lo = int(X0 + run[0] * pitch + 6)
                    x_hi = int(X0 + (run[-1] + 1) * pitch - 6)
                    labelled = any(sum(im.getpixel((x, y))) < 200
                                   for x in range(x_lo, x_hi)
                                   for y in range(int(top + 18), int(bottom - 14)))
                    k = k if labelled else k.lower()
                text += k * len(run)
                run = [c] if c is not None else []
            line.append(text)
        rows.append(" ".join(line))
    return rows


if __name__ == "__main__":
    for d, row in enumerate(transcribe(sys.argv[1])):
        print(f"figure {d}: {row}")
