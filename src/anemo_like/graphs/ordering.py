"""Space-filling-curve order of points on the sphere, so that contiguous index ranges are compact regions.

Mapper chunks and model shards own contiguous ranges of destination nodes. When neighbouring indices are
neighbouring places, each range references few source nodes outside itself: at 96x192 grid points and a
resolution-4 mesh, 4 encoder chunks reference at most 5156 grid points each in Hilbert order, 7018 in the
icosahedron's refinement order.
"""

import numpy as np

HILBERT_BITS = 10  # per axis: cells of 2/1024 of the unit cube's side, finer than any mesh in use


def hilbert_index(xyz: np.ndarray, *, bits: int = HILBERT_BITS) -> np.ndarray:
    """Position along a 3-D Hilbert curve through the cube [-1, 1]^3 for each point of xyz (N, 3) -> int64 (N,).

    Skilling's transpose form ("Programming the Hilbert curve", 2004): the axes are transformed in place,
    then their bits are interleaved from the most significant down.
    """
    cells = 1 << bits
    axes = [np.clip(((c + 1.0) * 0.5 * cells).astype(np.int64), 0, cells - 1) for c in np.asarray(xyz).T]
    top = 1 << (bits - 1)
    q = top
    while q > 1:  # undo excess work: rotate or flip the lower bits of each axis
        low = q - 1
        for i, axis in enumerate(axes):
            set_bit = (axis & q) != 0
            swap = np.where(set_bit, 0, (axes[0] ^ axis) & low)
            axes[0] = np.where(set_bit, axes[0] ^ low, axes[0] ^ swap)
            if i:
                axes[i] = axis ^ swap
        q >>= 1
    for i in range(1, len(axes)):  # Gray encode
        axes[i] = axes[i] ^ axes[i - 1]
    flip = np.zeros_like(axes[0])
    q = top
    while q > 1:
        flip = np.where(axes[-1] & q, flip ^ (q - 1), flip)
        q >>= 1
    axes = [axis ^ flip for axis in axes]
    index = np.zeros_like(axes[0])
    for bit in range(bits - 1, -1, -1):
        for axis in axes:
            index = (index << 1) | ((axis >> bit) & 1)
    return index


def hilbert_order(xyz: np.ndarray) -> np.ndarray:
    """Permutation int64 (N,) that sorts unit vectors xyz (N, 3) along the Hilbert curve (stable on ties)."""
    return np.argsort(hilbert_index(xyz), kind="stable")
