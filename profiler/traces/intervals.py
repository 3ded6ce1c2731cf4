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


def overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Time covered by both unions `a` and `b` (each given as merged, disjoint sorted spans)."""
    (a_s, a_e), (b_s, b_e) = a, b
    if len(a_s) == 0 or len(b_s) == 0:
        return 0.0
    # each span of a against the b spans that can overlap it: sweep over the sorted boundaries
    points = np.concatenate([a_s, a_e, b_s, b_e])
    delta = np.concatenate([np.ones(len(a_s)), -np.ones(len(a_e)), 2 * np.ones(len(b_s)), -2 * np.ones(len(b_e))])
    order = np.lexsort((delta, points))  # at a tie, ends (negative) before starts
    points, delta = points[order], delta[order]
    running = np.cumsum(delta)
    both = running[:-1] == 3
    return float((np.diff(points)[both]).sum())


def clip(starts: np.ndarray, ends: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """The spans cut to [lo, hi], empty ones dropped."""
    s, e = np.maximum(starts, lo), np.minimum(ends, hi)
    keep = e > s
    return s[keep], e[keep]
