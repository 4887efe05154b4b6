"""Constants and tile helpers shared by every kernel (spec notation: C = CHUNK, K = V = D)."""

CHUNK = 16  # tokens per tile (spec 2.3); the 16x16 inverse and the gate range argument rely on it
D = 128  # head dimension, K = V = 128
