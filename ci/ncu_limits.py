"""Turn ci/ncu_limits.sh's raw Nsight Compute CSV into a markdown table: per shape and kernel, the
duration, the DRAM bytes moved, the time those bytes take at the copy bandwidth (the kernel's
DRAM floor), and DRAM / SM throughput as a percent of peak. A kernel near its floor is bandwidth
bound; one far above it with low DRAM throughput is latency bound (K2's serial tile chain).

    python ci/ncu_limits.py ncu_limits.csv [--bandwidth-tbs 4.26]
"""

import argparse
import csv
import io
import sys


def parse(text: str):
    """Yields (shape, rows) per '# shape' block; rows are dicts of ncu's raw page (units row dropped)."""
    shape, lines = None, []
    for line in text.splitlines() + ["# shape <end>"]:
        if line.startswith("# shape "):
            if shape is not None:
                body = [x for x in lines if x.startswith('"')]
                rows = list(csv.DictReader(io.StringIO("\n".join(body))))
                yield shape, [r for r in rows if r.get("ID", "").isdigit()]
            shape, lines = line[len("# shape "):], []
        else:
            lines.append(line)


def number(row, key):
    value = row.get(key, "").replace(",", "")
    try:
        return float(value)
    except ValueError:
        return float("nan")


def table(text: str, bandwidth: float) -> str:
    out = ["| H, lengths | kernel | grid | time us | DRAM MB | DRAM floor us | time / floor | DRAM % | SM % |",
           "|---|---|---|---|---|---|---|---|---|"]
    for shape, rows in parse(text):
        H, *lens = shape.split()
        label = f"{H}, [{' '.join(lens)}]" if len(lens) < 4 else f"{H}, {len(lens)} seqs ({sum(map(int, lens))} tok)"
        total_t = total_floor = 0.0
        for r in rows:
            ns = number(r, "gpu__time_duration.sum")
            nbytes = number(r, "dram__bytes_read.sum") + number(r, "dram__bytes_write.sum")
            floor_us = nbytes / (bandwidth * 1e12) * 1e6
            name = r.get("Kernel Name", "?").split("(")[0].replace("kernel_cutlass_", "")[:38]
            out.append(f"| {label} | {name} | {r.get('launch__grid_size', '')} | {ns / 1e3:.1f} | {nbytes / 1e6:.1f} | "
                       f"{floor_us:.1f} | {ns / 1e3 / floor_us if floor_us else float('nan'):.2f} | "
                       f"{number(r, 'dram__throughput.avg.pct_of_peak_sustained_elapsed'):.0f} | "
                       f"{number(r, 'sm__throughput.avg.pct_of_peak_sustained_elapsed'):.0f} |")
            total_t += ns / 1e3
            total_floor += floor_us
        out.append(f"| {label} | **all kernels** | | {total_t:.1f} | | {total_floor:.1f} | "
                   f"{total_t / total_floor if total_floor else float('nan'):.2f} | | |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--bandwidth-tbs", type=float, default=4.26,
                        help="copy bandwidth in TB/s (H200 device-to-device copy, measured)")
    args = parser.parse_args(argv)
    print(table(open(args.csv).read(), args.bandwidth_tbs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
