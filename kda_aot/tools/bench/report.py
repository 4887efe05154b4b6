"""The benchmark's record of a run: its metadata, the JSON that docs/ regenerates its figures from
(ci/bench_tables.py), the PNG, and the table's cells.
"""

from __future__ import annotations

import json
from typing import Optional

from .runners import FLASHKDA_EARLIER_RECIPE, flashkda_stable


# FlashKDA on the same kind of H200 (FlashKDA's published times, docs/benchmarks.md), for the table's last column.
FLASHKDA_MS = {(64, "8192"): 1.214, (64, "uneven6"): 0.991, (64, "8x1024"): 0.790,
               (96, "8192"): 1.417, (96, "uneven6"): 1.367, (96, "8x1024"): 1.173,
               (4, "8192"): 0.816, (4, "8192+2048"): 0.821, (4, "16384"): 1.603,
               (8, "8192"): 0.846, (8, "8192+2048"): 0.856, (8, "16384"): 1.628,
               (32, "16x4096"): 3.013, (64, "32768"): 4.743}


def run_meta(args, bw) -> dict:
    """What the JSON says about the run: machine, date, versions, the peers present and why not."""
    import datetime
    import importlib.metadata as md

    import torch

    import kda_aot

    def version(dist):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    peers = {name: version(dist) for name, dist in (("FLA", "fla-core"), ("flashinfer", "flashinfer-python"),
                                                     ("cudnn-frontend", "nvidia-cudnn-frontend"))}
    notes = []
    try:
        import flash_kda  # noqa: F401
        peers["FlashKDA"] = version("flash_kda") or "present"
        if not flashkda_stable():
            peers["FlashKDA"] += " (earlier recipe: fp16 Neumann inverse)"
            notes.append(FLASHKDA_EARLIER_RECIPE + "; its times still compare")
    except Exception:
        peers["FlashKDA"] = None
    if peers["FlashKDA"] is None:
        notes.append("FlashKDA is not importable: its this-run column is empty (the published times are shown)")
    if peers["FLA"] is None or args.no_fla:
        notes.append("FLA is not importable or was skipped: its column is empty")
    if args.no_cudnn:
        notes.append("cuDNN's engine was skipped (--no-cudnn)")
    elif peers["flashinfer"] is None or peers["cudnn-frontend"] is None:
        notes.append("flashinfer-python or nvidia-cudnn-frontend is not installed: the cuDNN columns are empty")
    return {"format": 2, "machine": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
            "kda_aot": kda_aot.__version__, "torch": torch.__version__, "copy_bandwidth_TBps": bw / 1e12,
            "iters": args.iters, "warmup": args.warmup, "suite": args.suite, "peers": peers, "notes": notes}


def write_json(header, rows, path: str, meta: Optional[dict] = None) -> None:
    """The run as one object: `meta` (run_meta's keys) and "rows", one object per row keyed by
    the table's column names (None where a peer is absent); ci/bench_tables.py renders it."""
    with open(path, "w") as f:
        json.dump(dict(meta or {}, rows=[dict(zip(header, row)) for row in rows]), f, indent=1)


def write_png(header, rows, path: str) -> str:
    """A bar chart per shape of every column that holds times in ms (kda-aot's modes and the peers
    present); returns the line to print. matplotlib is optional: without it, say so."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"--png: matplotlib is not installed, no chart written to {path}"
    columns = [i for i, name in enumerate(header) if " ms" in name and name != "floor ms"
               and any(isinstance(row[i], float) for row in rows)]
    extra = [i for i, name in enumerate(header) if name in ("gates", "gate")]
    labels = [" ".join([f"H={row[0]} {row[1]}"] + [str(row[i]) for i in extra]) for row in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4))
    width = 0.8 / max(1, len(columns))
    for j, i in enumerate(columns):
        values = [row[i] if isinstance(row[i], float) else 0.0 for row in rows]
        ax.bar([k + j * width for k in range(len(rows))], values, width, label=header[i])
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(rows))], labels, rotation=30, ha="right")
    ax.set_ylabel("ms per call (median, CUDA events)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"chart written to {path}"


def cell_text(c) -> str:
    if c is None:
        return "-"
    if isinstance(c, float):
        return f"{c:.3f}"
    return str(c)
