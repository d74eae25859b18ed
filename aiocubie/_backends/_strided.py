"""The geometry of a strided copy: two views of one shape as rows, slices and their pitches.

A chunk of an array whose run axis is not the first is not one block of memory on the host,
and a trimmed chunk buffer is not one on the device; the copy engines still move it in one
2-D or 3-D copy: ``depth`` slices of ``height`` rows of ``width`` contiguous bytes, rows
``pitch`` bytes apart and slices ``slice`` bytes apart on each side. This module finds that
geometry from shapes and strides, and nothing else: it touches no memory and calls no device.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

__all__ = ["Geometry", "geometry", "refusal"]


@attrs.frozen
class Geometry:
    """How to copy two equal-shaped views: ``depth`` x ``height`` rows of ``width`` bytes.

    Attributes
    ----------
    width : int
        Contiguous bytes per row, on both sides.
    height, depth : int
        Rows per slice, and slices (1 each for a copy of one block).
    src_pitch, dst_pitch : int
        Bytes from one row to the next on each side (``>= width``).
    src_slice, dst_slice : int
        Bytes from one slice to the next on each side.
    """

    width: int
    height: int = 1
    depth: int = 1
    src_pitch: int = 0
    dst_pitch: int = 0
    src_slice: int = 0
    dst_slice: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes copied."""
        return self.width * self.height * self.depth

    def extent(self, side: str) -> int:
        """Bytes from the first byte of ``side`` (``"src"`` or ``"dst"``) to one past its last."""
        pitch, slice_ = (self.src_pitch, self.src_slice) if side == "src" else (self.dst_pitch, self.dst_slice)
        return (self.depth - 1) * slice_ + (self.height - 1) * pitch + self.width

    def is_3d(self, side: str) -> bool:
        """Whether ``side``'s slices are whole multiples of its pitch, each holding its ``height``
        rows (what a 3-D copy needs; otherwise it is ``depth`` 2-D copies)."""
        pitch, slice_ = (self.src_pitch, self.src_slice) if side == "src" else (self.dst_pitch, self.dst_slice)
        return self.depth == 1 or (slice_ % pitch == 0 and slice_ // pitch >= self.height)


def geometry(
    shape: Sequence[int], itemsize: int, src_strides: Sequence[int], dst_strides: Sequence[int]
) -> Geometry | None:
    """The geometry of a copy between two views of ``shape`` with these byte strides, or None.

    An empty view is a copy of no bytes, whatever its strides. Axes of extent 1 are dropped;
    neighbouring axes that are one block on both sides merge. None when what is left is not at
    most two levels of rows of contiguous elements with positive strides that do not overlap
    within a side (a view reversed, broadcast, or with its last axis strided on one side but
    not the other, or more than three levels): copy such views through a contiguous array.

    Examples
    --------
    >>> geometry((4, 3), 4, (40, 4), (12, 4))   # 3 of 10 columns into a (4, 3) buffer
    Geometry(width=12, height=4, depth=1, src_pitch=40, dst_pitch=12, src_slice=0, dst_slice=0)
    """
    if 0 in shape:  # nothing to copy, whatever the strides (numpy calls any empty view contiguous)
        return Geometry(0)
    width = itemsize
    levels: list[tuple[int, int, int]] = []  # (count, src stride, dst stride), innermost first
    for count, src, dst in reversed(list(zip(shape, src_strides, dst_strides))):
        if count == 1:
            continue
        if src <= 0 or dst <= 0:
            return None
        if not levels and src == dst == width:
            width *= count
        elif levels and src == levels[-1][0] * levels[-1][1] and dst == levels[-1][0] * levels[-1][2]:
            inner = levels[-1]
            levels[-1] = (inner[0] * count, inner[1], inner[2])
        else:
            levels.append((count, src, dst))
    if len(levels) > 2:
        return None
    if not levels:
        return Geometry(width)
    height, src_pitch, dst_pitch = levels[0]
    if src_pitch < width or dst_pitch < width:  # rows overlapping within a side
        return None
    if len(levels) == 1:
        return Geometry(width, height, 1, src_pitch, dst_pitch)
    depth, src_slice, dst_slice = levels[1]
    for pitch, slice_ in ((src_pitch, src_slice), (dst_pitch, dst_slice)):
        # slices one after another, or (a transposed view) side by side within each row pitch,
        # each slice's row clear of the next one's
        after = slice_ >= (height - 1) * pitch + width
        beside = slice_ >= width and pitch >= (depth - 1) * slice_ + width
        if not (after or beside):
            return None  # elements of one side may overlap
    return Geometry(width, height, depth, src_pitch, dst_pitch, src_slice, dst_slice)


def refusal(shape: Sequence[int]) -> str:
    """Why views of ``shape`` that :func:`geometry` refused cannot be copied: a BackendError's message."""
    return (
        f"cannot copy these {tuple(shape)} views in one 2-D or 3-D copy: each side must be rows of "
        "contiguous elements with positive strides (not reversed, broadcast or overlapping), in at most "
        "three levels; copy through np.ascontiguousarray"
    )
