"""Interval arithmetic on event spans (numpy arrays of starts and ends, any unit)."""

from __future__ import annotations

import numpy as np


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) spans as disjoint sorted spans (HTA's merge_kernel_intervals)."""
    if len(starts) == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, float)[order], np.asarray(ends, float)[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    out_s = s[new]
    out_e = np.maximum.reduceat(e, np.flatnonzero(new))
    return out_s, out_e


def length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Time covered by the union of the spans."""
    s, e = merge(starts, ends)
    return float((e - s).sum())


def _sweep(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray],
           state: int) -> tuple[np.ndarray, np.ndarray]:
    """The spans where the sweep over the merged unions `a` (+1) and `b` (+2) stands at `state`:
    3 in both, 1 in `a` only."""
    (a_s, a_e), (b_s, b_e) = a, b
    points = np.concatenate([a_s, a_e, b_s, b_e])
    delta = np.concatenate([np.ones(len(a_s)), -np.ones(len(a_e)), 2 * np.ones(len(b_s)), -2 * np.ones(len(b_e))])
    order = np.lexsort((delta, points))  # at a tie, ends (negative) before starts
    points, delta = points[order], delta[order]
    inside = np.cumsum(delta)[:-1] == state
    keep = inside & (np.diff(points) > 0)
    return points[:-1][keep], points[1:][keep]


def overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Time covered by both unions `a` and `b` (each given as merged, disjoint sorted spans)."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return 0.0
    s, e = _sweep(a, b, 3)
    return float((e - s).sum())


def difference(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The spans of union `a` that union `b` does not cover (both merged, disjoint sorted spans)."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return a
    return merge(*_sweep(a, b, 1))


def clip(starts: np.ndarray, ends: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """The spans cut to [lo, hi], empty ones dropped."""
    s, e = np.maximum(starts, lo), np.minimum(ends, hi)
    keep = e > s
    return s[keep], e[keep]
