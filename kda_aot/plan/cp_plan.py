"""Intracard context-parallel (CP) planning (spec section 4.1): pure Python, no GPU.

A plan cuts every sequence into tile-aligned segments. Segment `s` covers global tiles
`[seg_cu[s], seg_cu[s+1])` and tokens `[seg_token_start[s], seg_token_start[s+1])` of the packed
token axis; segments partition both axes contiguously, so segmented K2 reuses the `seq_start` /
`tile_prefix` sequence tables of docs/kernel_abi.md with segments in place of sequences. Only the last segment of a sequence can end in a partial tile, and an empty
sequence gets one empty segment.

A plan with no more segments than sequences is `trivial`: the caller runs the serial path.

Modes: "off" (or None) -> serial; "auto" -> CP iff it pays the re-run cost; "on" -> the balanced
split, raising NotSplittableError where that is trivial; an int s -> up to s segments per
sequence of at least MIN_SEG_TILES tiles each (tests; no cost check). Every decision depends only
on the arguments, so a plan is deterministic.

The runtime may hold cu_seqlens on the device only. Then the tables come from a kernel
(cp_seg_tables_*) that splits every sequence with one rule: c_n = max(1, min(ceil(t_n / seg_len),
max_count, t_n // min_tiles)) segments of near-equal size per sequence of t_n tiles (its exact CPU
twin, `device_segment_tables`, and the host tables of a plan, `segment_tables`, are in
tests/cp_twins.py, beside the tests that compare them with the kernels). A host plan exposes the parameters that
reproduce its own segments (CPPlan.seg_len, max_count, min_tiles), and `device_plan` chooses them
from what the host knows without the lengths (T, N, H, SMs), with a bound on the segment count
that holds for any cu_seqlens content.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

from ..library.constants import CHUNK  # tokens per tile
from ..spec.problem import int_entries, parse_cp

DEFAULT_SM_COUNT = 132  # H100 SXM / H200
AUTO_MIN_SEG_TILES = 32  # shortest segment split_balanced makes (512 tokens)
RERUN_RATIO = 3  # pre_scan + segmented K2 cost relative to serial K2, per tile (docs/algorithm.md §4.7)
MIN_SEG_TILES = 4  # shortest segment a manual plan makes
INT32_MAX = 2 ** 31 - 1

CpMode = Union[str, int, None]


class NotSplittableError(ValueError):
    """CP was required ("on" or a manual segment count) but the plan would be serial."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class CPPlan:
    """Segments of every sequence; see the module docstring for the tables' meaning.

    `P`, `target`, `load`, `serial_wall` and `cp_wall` are the numbers of docs/algorithm.md §4.1 that the
    decision was made from (None for mode "off", where nothing was computed).
    """

    seq_tiles: Tuple[int, ...]
    seg_cu: Tuple[int, ...]
    per_seq: Tuple[Tuple[int, int], ...]
    seg_token_start: Tuple[int, ...]
    mode: CpMode
    reason: str
    seq_lens: Tuple[int, ...] = ()
    sm_count: int = DEFAULT_SM_COUNT
    num_heads: int = 1
    P: Optional[int] = None
    target: Optional[int] = None
    load: Optional[int] = None
    serial_wall: Optional[int] = None
    cp_wall: Optional[int] = None
    # The device rule's parameters that give exactly these segments (device_segment_tables with
    # max_segments = n_segments reproduces the host tables). Serial plans: max_count = 1.
    seg_len: int = 1
    max_count: int = 1
    min_tiles: int = 1

    @property
    def n_sequences(self) -> int:
        return len(self.seq_tiles)

    @property
    def n_segments(self) -> int:
        return len(self.seg_cu) - 1

    @property
    def trivial(self) -> bool:
        """True when the plan is serial (one segment per sequence)."""
        return self.n_segments <= self.n_sequences

    @property
    def segment_tiles(self) -> Tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.seg_cu, self.seg_cu[1:]))

    @property
    def max_segment_tiles(self) -> int:
        return max(self.segment_tiles, default=0)

    @property
    def total_tiles(self) -> int:
        return self.seg_cu[-1]

    def describe(self) -> str:
        decision = "serial" if self.trivial else "CP"
        counts = _run_length([n for _, n in self.per_seq])
        lines = [
            f"CP plan ({decision}), mode {self.mode!r}: {self.n_sequences} sequences, "
            f"{self.total_tiles} tiles, H={self.num_heads}, {self.sm_count} SMs",
            f"  segments: {self.n_segments}, per sequence: {counts}; longest {self.max_segment_tiles} tiles",
            f"  reason: {self.reason}",
        ]
        return "\n".join(lines)


def _run_length(values: Sequence[int]) -> str:
    """[14, 1, 1, 1] -> '14, 1 (x3)'."""
    parts = []
    i = 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        parts.append(str(values[i]) if j - i == 1 else f"{values[i]} (x{j - i})")
        i = j
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------------
# validation

def _check_seq_lens(seq_lens) -> Tuple[int, ...]:
    if isinstance(seq_lens, (str, bytes)):
        raise ValueError(f"seq_lens: expected a sequence of non-negative ints, got {seq_lens!r}")
    try:
        items = list(seq_lens)
    except TypeError:
        raise ValueError(f"seq_lens: expected a sequence of non-negative ints, got {seq_lens!r}") from None
    if not items:
        raise ValueError("seq_lens: expected at least one sequence, got an empty list")
    out = int_entries(items, "seq_lens", ValueError)
    for i, v in enumerate(out):
        if v < 0:
            raise ValueError(f"seq_lens: entry {i} must be >= 0, got {v}")
    return tuple(out)


def _check_positive(name: str, value) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected an int >= 1, got the bool {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected an int >= 1, got {value!r} ({type(value).__name__})") from None
    if v < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {v}")
    return int(v)


def _check_mode(mode) -> CpMode:
    """prefill's cp argument rules (kda_aot/spec/problem.py parse_cp), with None meaning "off"."""
    return "off" if mode is None else parse_cp(mode, "mode")


# ------------------------------------------------------------------------------------------------
# docs/algorithm.md §4.1

def concurrent_slots(num_heads: int, sm_count: int) -> int:
    """P: segments that run at once when each takes H CTAs (one per head) of `sm_count` SMs."""
    return max(1, sm_count // num_heads)


def balanced_counts(seq_tiles: Sequence[int], num_heads: int, sm_count: int) -> Tuple[List[int], int, int]:
    """split_balanced's segment count per sequence, with P and target."""
    P = concurrent_slots(num_heads, sm_count)
    target = max(AUTO_MIN_SEG_TILES, _ceil_div(sum(seq_tiles), P))
    counts = [max(1, min(_ceil_div(t, target), t // AUTO_MIN_SEG_TILES)) for t in seq_tiles]
    return counts, P, target


def fit_to_slots(seq_tiles: Sequence[int], counts: Sequence[int], P: int) -> List[int]:
    """Fewer, slightly longer segments when split_balanced makes more than the P that run at once.

    Deviation from docs/algorithm.md §4.1, settled by measurement (docs/cp_tuning.md): for H=8 [8192, 2048]
    split_balanced gives 13 + 4 = 17 segments for P = 16 slots, so 8 x 17 = 136 K2 CTAs share
    132 SMs and the call took 0.244 ms; 12 + 3 segments of at most 43 tiles take 0.213 ms.

    Slots needed for a segment length L: ceil(tiles / L) per split sequence (never more than its
    balanced count), plus ceil(U / L) for the unsplit sequences of U tiles in all, which can run
    one after another in a slot. Returns the counts for the smallest L that fits, or the balanced
    counts when they fit already or when nothing does.
    """
    counts = list(counts)
    L = fitted_length(seq_tiles, counts, P)
    if L is not None:
        for i, c in enumerate(counts):
            if c > 1:
                counts[i] = min(c, _ceil_div(seq_tiles[i], L))
    return counts


def fitted_length(seq_tiles: Sequence[int], counts: Sequence[int], P: int) -> Optional[int]:
    """The segment length L fit_to_slots cuts the split sequences to, or None when it keeps the
    balanced counts."""
    split = [i for i, c in enumerate(counts) if c > 1]
    if not split or sum(counts) <= P:
        return None
    unsplit = sum(t for t, c in zip(seq_tiles, counts) if c == 1)

    def slots(L: int) -> int:
        return sum(min(counts[i], _ceil_div(seq_tiles[i], L)) for i in split) + _ceil_div(unsplit, L)

    lo = max(_ceil_div(seq_tiles[i], counts[i]) for i in split)  # the balanced segment length
    hi = max(seq_tiles[i] for i in split)  # one segment per split sequence
    if slots(lo) <= P or slots(hi) > P:
        return None
    while lo < hi:  # slots(L) only falls as L grows: bisect for the smallest L that fits
        mid = (lo + hi) // 2
        if slots(mid) <= P:
            hi = mid
        else:
            lo = mid + 1
    return lo


def manual_counts(seq_tiles: Sequence[int], segments: int) -> List[int]:
    """plan_manual: up to `segments` parts per sequence, each at least MIN_SEG_TILES tiles."""
    return [max(1, min(segments, t // MIN_SEG_TILES)) for t in seq_tiles]


def split_sizes(tiles: int, parts: int) -> List[int]:
    """`tiles` into `parts` near-equal parts; the first `tiles % parts` get one extra tile."""
    base, extra = divmod(tiles, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def _walls(seq_tiles: Sequence[int], max_seg: int, P: int) -> Tuple[int, int, int]:
    load = _ceil_div(sum(seq_tiles), P)
    serial_wall = max(max(seq_tiles), load)
    cp_wall = RERUN_RATIO * max(max_seg, load)
    return load, serial_wall, cp_wall


def _build(seq_lens: Tuple[int, ...], seq_tiles: Tuple[int, ...], counts: Sequence[int], **fields) -> CPPlan:
    seg_cu = [0]
    seg_tok = []
    per_seq = []
    tok0 = 0
    for length, tiles, n in zip(seq_lens, seq_tiles, counts):
        per_seq.append((len(seg_cu) - 1, n))
        local = 0
        for size in split_sizes(tiles, n):
            seg_tok.append(tok0 + CHUNK * local)
            local += size
            seg_cu.append(seg_cu[-1] + size)
        tok0 += length
    seg_tok.append(tok0)
    return CPPlan(seq_tiles=seq_tiles, seg_cu=tuple(seg_cu), per_seq=tuple(per_seq),
                  seg_token_start=tuple(seg_tok), seq_lens=seq_lens, **fields)


def plan_prefill(seq_lens: Sequence[int], num_heads: int, sm_count: Optional[int] = None,
                 mode: CpMode = "auto") -> CPPlan:
    """Plan the CP segments of a prefill of sequences `seq_lens` (tokens) with `num_heads` heads.

    mode: "off" | "auto" | "on" | int (segments per sequence). Raises NotSplittableError when
    "on" or an int yields a serial plan, ValueError for bad arguments.
    """
    lens = _check_seq_lens(seq_lens)
    H = _check_positive("num_heads", num_heads)
    assumed = sm_count is None
    sms = DEFAULT_SM_COUNT if assumed else _check_positive("sm_count", sm_count)
    mode = _check_mode(mode)
    tiles = tuple(_ceil_div(n, CHUNK) for n in lens)
    sm_note = f"{sms} SMs (assumed: H100/H200)" if assumed else f"{sms} SMs"
    common = dict(mode=mode, sm_count=sms, num_heads=H)

    if mode == "off":
        return _build(lens, tiles, [1] * len(tiles), reason="cp off", **common)

    if mode in ("auto", "on"):
        counts, P, target = balanced_counts(tiles, H, sms)
        fitted = fitted_length(tiles, counts, P)
        counts = fit_to_slots(tiles, counts, P)
        head = f"P={P} ({sm_note} // H={H}), target={target} tiles"
        # min(ceil(t / target), ceil(t / fitted)) = ceil(t / max(target, fitted)), and a sequence
        # balanced_counts leaves whole stays whole with the longer length
        device = dict(seg_len=max(target, fitted or target), max_count=INT32_MAX, min_tiles=AUTO_MIN_SEG_TILES)
    else:
        counts = manual_counts(tiles, mode)
        P = concurrent_slots(H, sms)
        target = None
        head = f"manual {mode} segments per sequence (>= {MIN_SEG_TILES} tiles each), P={P} ({sm_note} // H={H})"
        # ceil(t / 1) = t >= t // MIN_SEG_TILES: the rule reduces to manual_counts
        device = dict(seg_len=1, max_count=min(mode, INT32_MAX), min_tiles=MIN_SEG_TILES)
    max_seg = max(_ceil_div(t, n) for t, n in zip(tiles, counts))
    load, serial_wall, cp_wall = _walls(tiles, max_seg, P)
    walls = f"serial_wall={serial_wall} vs cp_wall={RERUN_RATIO}*max({max_seg}, {load})={cp_wall}"
    nums = dict(P=P, target=target, load=load, serial_wall=serial_wall, cp_wall=cp_wall, **common)
    trivial = sum(counts) <= len(counts)

    if mode == "auto":
        if trivial:
            return _build(lens, tiles, [1] * len(tiles),
                          reason=f"serial: machine full / too short ({head}: every sequence is one segment, "
                                 f"none is longer than target with >= 2 x {AUTO_MIN_SEG_TILES} tiles)",
                          **nums)
        if serial_wall >= cp_wall:
            return _build(lens, tiles, counts, reason=f"CP: {head}; {walls}: serial_wall >= cp_wall", **nums,
                          **device)
        return _build(lens, tiles, [1] * len(tiles),
                      reason=f"serial: does not pay the re-run cost ({head}; {walls}: serial_wall < cp_wall)",
                      **nums)

    if trivial:
        if mode == "on":
            why = (f"{head}: no sequence is longer than target with >= 2 x {AUTO_MIN_SEG_TILES} tiles "
                   f"(too short, or the heads alone fill the machine)")
        else:
            why = f"{head}: the count is 1 or no sequence has >= 2 x {MIN_SEG_TILES} tiles"
        raise NotSplittableError(f"cp={mode!r}: seq_lens {list(lens)} (tiles {list(tiles)}) give a serial plan; {why}")
    label = "forced" if mode == "on" else "manual"
    return _build(lens, tiles, counts, reason=f"CP ({label}, no cost check): {head}; {walls}", **nums, **device)


def device_plan(t_total: int, n_seq: int, num_heads: int, sm_count: Optional[int] = None, mode: CpMode = "auto") -> Optional[Tuple[int, int, int, int]]:
    """The CP parameters when only the device holds cu_seqlens: None for the serial path, else
    (seg_len, max_count, min_tiles, max_segments) for cp_seg_tables, where max_segments S bounds
    sum c_n for ANY cu_seqlens content (so the runtime can size grids and scratch by S).

    The bound uses t_n = ceil(len_n / 16) of the clamped lengths, sum len_n <= T, and
        sum_n ceil(x_n / L) <= ceil(sum_n x_n / L) + N - 1     (each ceil adds less than 1)
    so sum t_n <= ceil(T / 16) + N - 1 =: T_b, the same bound as tile_prefix[N].

    "auto": CP iff plan_prefill picks CP for T split evenly over the N sequences (the lengths are
    unknown; equal lengths are the common case and the least favourable to CP). Then with
    P = max(1, sm_count // H) >= N slots, L = max(AUTO_MIN_SEG_TILES, ceil(T_b / (P - N + 1))) and
    S = min(P, ceil(T_b / L) + N - 1). Proof that sum c_n <= S: c_n <= ceil(t_n / L) for each of the N' sequences with
    t_n >= 1 and c_n = 1 for the N - N' empty ones, so if N' >= 1
        sum c_n <= ceil(sum t_n / L) + N' - 1 + (N - N') <= ceil(T_b / L) + N - 1 <= P
    since L >= T_b / (P - N + 1); if N' = 0, sum c_n = N <= P.
    "on": the same L and S when T_b >= 2 * AUTO_MIN_SEG_TILES and P >= N, else NotSplittableError.
    int s: L = 1, max_count = s, min_tiles = MIN_SEG_TILES and S = N + min(N (s - 1), T_b // 4):
    c_n - 1 <= s - 1, and c_n - 1 <= t_n // 4 (c_n > 1 needs c_n <= t_n // 4), so
    sum (c_n - 1) <= sum t_n // 4 <= T_b // 4. NotSplittableError when S = N (never a split).
    """
    if isinstance(t_total, bool) or not isinstance(t_total, int) or t_total < 0:
        raise ValueError(f"t_total: expected an int >= 0, got {t_total!r}")
    N = _check_positive("n_seq", n_seq)
    H = _check_positive("num_heads", num_heads)
    sms = DEFAULT_SM_COUNT if sm_count is None else _check_positive("sm_count", sm_count)
    mode = _check_mode(mode)
    bound = _ceil_div(t_total, CHUNK) + N - 1  # T_b: tiles of any clamped cu_seqlens
    if mode == "off":
        return None
    if isinstance(mode, int):
        S = N + min(N * (mode - 1), bound // MIN_SEG_TILES)
        if S <= N:
            raise NotSplittableError(f"cp={mode!r}: {N} sequences of {t_total} tokens in all never split "
                                     f"(count 1, or fewer than 2 x {MIN_SEG_TILES} tiles)")
        return 1, min(mode, INT32_MAX), MIN_SEG_TILES, S
    P = concurrent_slots(H, sms)
    if mode == "auto":
        even = [t_total // N + (1 if n < t_total % N else 0) for n in range(N)]
        if P < N or plan_prefill(even, H, sms, "auto").trivial:
            return None
    elif P < N or bound < 2 * AUTO_MIN_SEG_TILES:
        raise NotSplittableError(f"cp='on': {N} sequences of {t_total} tokens in all, P={P} slots (H={H}, "
                                 f"{sms} SMs): need P >= N and >= {2 * AUTO_MIN_SEG_TILES} tiles")
    L = max(AUTO_MIN_SEG_TILES, _ceil_div(bound, P - N + 1))
    # The same inequality gives a tighter bound than P when L is the 32-tile floor: sizing grids,
    # scratch and the K2 value split by S = P there would be measurably slower (H=4 [8192]: S = 33
    # for 16 real segments took 0.144 ms against 0.117 ms sized by 16 on the H200).
    return L, INT32_MAX, AUTO_MIN_SEG_TILES, min(P, _ceil_div(bound, L) + N - 1)
