"""The tests against an installed FlashKDA ask first which inverse recipe it computes
(kda_aot.tools.bench.flashkda_has_stable_inverse): a build from before FlashKDA's stable inverse computes
other bits by design, and those tests then skip, saying so."""

import functools

import pytest


@functools.lru_cache(maxsize=None)
def _stable(fwd) -> bool:
    from kda_aot.tools.bench import flashkda_has_stable_inverse

    return flashkda_has_stable_inverse(fwd)


def require_stable_inverse(fwd) -> None:
    """Skips the calling test when FlashKDA's `fwd` computes the earlier (fp16 Neumann) recipe."""
    from kda_aot.tools.bench import FLASHKDA_EARLIER_RECIPE

    if not _stable(fwd):
        pytest.skip(FLASHKDA_EARLIER_RECIPE + "; tests/gpu/test_flashkda_torch_ref.py checks the current recipe "
                    "against FlashKDA's own torch reference")
