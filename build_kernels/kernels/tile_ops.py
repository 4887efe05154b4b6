"""Constants and tile helpers shared by every kernel (spec notation: C = CHUNK, K = V = D)."""

import cutlass.cute as cute

CHUNK = 16  # tokens per tile (spec 2.3); the 16x16 inverse and the gate range argument rely on it
D = 128  # head dimension, K = V = 128


def raw_tile_layout():
    """(16, 128) -> element offset of the raw 4 KiB tile image (docs/kernel_abi.md, spec 4.8).

    8x8 core matrices of 128 bytes; core matrix (mi, ki) starts at element 64*(mi + 2*ki), rows of
    8 elements inside it. Call inside a @cute.jit / @cute.kernel context.
    """
    return cute.make_layout(((8, 2), (8, D // 8)), stride=((8, 64), (1, 128)))
