"""How long a warm-up would have to be before a truncated state is provably negligible, per input class.

    python ci/truncation_certificate.py [--T 16384] [--H 16] [--eps 1e-3]

A method that splits a sequence into pieces, each started from a zero state after W warm-up tokens,
is exact only when the true entry state's influence has died out. Each delta-rule step is a
contraction followed by a decay, so that influence is bounded by the product over the W tokens of
the largest per-channel decay, C(W) = prod_t max_c alpha_t[c] (the certificate a device could
compute from the actual decays). This script computes C on the benchmark's input classes
(kda_aot/references/input_classes.py) and reports the warm-up W at which C(W) <= eps, over all heads and
start positions: the answer to whether such a certificate holds on model-like gates. No GPU.
"""

from __future__ import annotations

import argparse

import numpy as np

from kda_aot.references import input_classes as ic


def certificate_lengths(logd: np.ndarray, eps: float, horizon: int) -> np.ndarray:
    """logd [T, H, D] natural log-decays. For every head and start position t0 (every 64th token of
    the first T - horizon), the fewest tokens W with sum_{t0 <= t < t0 + W} max_c logd[t, h, c] <=
    log(eps), or horizon + 1 where it takes more than `horizon` tokens."""
    T = logd.shape[0]
    worst = logd.max(axis=2)  # [T, H]: the slowest channel of each token, what the bound must take
    csum = np.concatenate([np.zeros((1, worst.shape[1])), np.cumsum(worst, axis=0)])
    out = []
    for t0 in range(0, T - horizon, 64):
        reached = csum[t0 + 1:t0 + horizon + 1] <= csum[t0] + np.log(eps)  # [horizon, H]
        out.append(np.where(reached.any(axis=0), reached.argmax(axis=0) + 1, horizon + 1))
    return np.stack(out)  # [starts, H]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python ci/truncation_certificate.py", description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=16384)
    parser.add_argument("--H", type=int, default=16)
    parser.add_argument("--eps", type=float, default=1e-3)
    args = parser.parse_args(argv)
    horizon = args.T // 2
    print(f"warm-up W after which prod_t max_c alpha_t <= {args.eps:g}; T={args.T}, H={args.H}, starts every 64 "
          f"tokens, W looked for up to {horizon} tokens")
    print("| class | gate | median W | 90th percentile W | W <= 256 | W <= 1024 | W <= " + f"{horizon} |")
    print("|---|---|---|---|---|---|---|")
    for cls, gate in (("random", "safe"), ("model", "safe"), ("model", "softplus"), ("long", "safe")):
        x = ic.make_class_inputs(cls, 1, args.T, args.H, gate=gate, seed=0)
        logd = ic.log_decay(x["g"][0].astype(np.float64), x["A_log"], x["dt_bias"], x.get("lower_bound"))
        w = certificate_lengths(logd, args.eps, horizon)
        med, p90 = (f"{v:.0f}" if v <= horizon else f"> {horizon}" for v in np.percentile(w, [50, 90]))
        shares = [f"{100 * (w <= n).mean():.0f}%" for n in (256, 1024, horizon)]
        print(f"| {cls} | {gate} | {med} | {p90} | " + " | ".join(shares) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
