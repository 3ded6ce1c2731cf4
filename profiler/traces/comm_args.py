"""What PyTorch records of each collective in its events' args (c10d's RECORD_PARAM_COMMS), on the host's
`record_param_comms` event and, in newer versions, on the NCCL kernel itself:

    'Collective name': 'allreduce', 'In msg nelems': 6637568, 'Out msg nelems': 6637568, 'Group size': 2,
    'dtype': 'Float', 'Process Group Name': '0', 'Process Group Description': 'default_pg',
    'Process Group Ranks': '[0, 1]'

The reader keeps these for those events only (Trace.comms: a few per step, where the events number
millions). They give a collective's kind where the kernel's name gives none (`ncclDevKernel_Generic`),
its payload bytes where the operators record no shapes, and its process group, which tells a tensor-parallel
group's all-reduces from a data-parallel group's.

Bytes are the elements times the dtype's size, counted as nccl-tests counts the size its algorithm bandwidth
divides (doc/PERFORMANCE.md), which is `glmperf plan`'s payload too: an all_gather its output (`Out msg
nelems`, the gathered tensor; its input is one rank's share), a reduce_scatter its input (`In msg nelems`,
the tensor reduced; its output is one share), an all_reduce, broadcast or all_to_all its input (the
same size as its output), a send or recv the tensor moved (`In msg nelems`, which both counts give).
"""

from __future__ import annotations

import ast
import math
from typing import Any

import numpy as np
import orjson
import pandas as pd

ARGS = {"collective": "Collective name", "in_nelems": "In msg nelems", "out_nelems": "Out msg nelems",
        "group_size": "Group size", "dtype": "dtype", "pg_name": "Process Group Name",
        "pg_desc": "Process Group Description", "pg_ranks": "Process Group Ranks"}
"""Trace.comms's columns and the args they come from."""
COUNTS = ("in_nelems", "out_nelems", "group_size")
"""The integer ones (-1 when absent); the others are text (None when absent)."""
ITEMSIZE = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
            "Byte": 1, "Bool": 1, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16, "Float8_e4m3fn": 1,
            "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8}
"""Bytes per element of the dtypes as `dtype` names them (c10's ScalarType names)."""
KIND_PREFIX = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
               ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("send", "send_recv"), ("recv", "send_recv"))
"""c10d's collective names (`allreduce`, `_allgather_base`, `all_to_allv`, `reduce_scatter_tensor_coalesced`,
`recvAnySource`, ...), lower-cased without underscores, by how they begin; the others (`barrier`, `reduce`,
`gather`, `scatter`, a work's `wait`) are none of the kinds analyzed."""
OUTPUT_COUNTED = "all_gather"
"""The kind whose bytes are its output's (module docstring)."""


def of_records(args: list[Any]) -> dict[str, list[Any]]:
    """`fields` of the events' args decoded by the reader's msgspec records (ARGS's fields raw, empty when
    absent): of those that name a collective only."""
    return fields([(i, {f: bytes(getattr(a, f)) for f in ARGS}) for i, a in enumerate(args) if a.collective])


def of_dicts(args: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The same from args as JSON objects."""
    return fields([(i, {f: a.get(key) for f, key in ARGS.items()}) for i, a in enumerate(args)
                   if a.get("Collective name") is not None])


def fields(rows: list[tuple[int, dict[str, Any]]]) -> dict[str, list[Any]]:
    """The args of (event's position in its block, its args by ARGS's column: values, or their JSON text as
    bytes, b"" when absent) as Trace.comms's columns: counts as ints (-1: absent or not one), the rest as text
    (None: absent; a list, such as ranks written as one, as its JSON)."""
    out: dict[str, list[Any]] = {"row": [i for i, _ in rows]}
    for f in ARGS:
        values = [(orjson.loads(v) if v else None) if isinstance(v, bytes) else v for v in (a[f] for _, a in rows)]
        out[f] = [_int(v) for v in values] if f in COUNTS else \
            [v if v is None or isinstance(v, str) else orjson.dumps(v, default=str).decode() for v in values]
    return out


def frame(columns: dict[str, list[Any]], first_row: int) -> pd.DataFrame:
    """Trace.comms from `fields`' columns, of a block whose first event is `first_row`."""
    return pd.DataFrame({"row": np.asarray(columns["row"], dtype=np.int64) + first_row,
                         **{f: np.asarray(columns[f], dtype=np.int64 if f in COUNTS else object) for f in ARGS}})


def joined(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The blocks' `frame`s as one, its text columns objects whichever blocks held none (a concat infers a
    string dtype from some mixes and not from others)."""
    out = pd.concat(frames, ignore_index=True)
    return out.astype({f: object for f in ARGS if f not in COUNTS})


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def kind(name: str | None) -> str | None:
    """The kind of collective c10d's name `name` is, or None (KIND_PREFIX)."""
    key = (name or "").lower().replace("_", "")
    return next((k for prefix, k in KIND_PREFIX if key.startswith(prefix)), None)


def ranks(text: str | None) -> list[int] | None:
    """`Process Group Ranks` ('[0, 1]') as a list, or None where it is not one."""
    try:
        value = ast.literal_eval(text) if text else None
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, list) and all(isinstance(r, int) for r in value) else None


def described(comms: pd.DataFrame) -> pd.DataFrame:
    """Trace.comms read: `row`, `kind` (None: not one of the kinds analyzed), `bytes` (NaN: unknown; module
    docstring), `group` (the process group's name, else its ranks' text, else "": none recorded), `group_desc`,
    `group_ranks` (text, None when absent) and `group_size` (-1 when absent)."""
    kinds = [kind(c) for c in comms["collective"]]
    counted = np.where(np.array([k == OUTPUT_COUNTED for k in kinds], dtype=bool), comms["out_nelems"].to_numpy(),
                       comms["in_nelems"].to_numpy())
    itemsize = np.array([ITEMSIZE.get(d, math.nan) for d in comms["dtype"]], dtype=np.float64)
    nbytes = np.where(counted >= 0, counted * itemsize, np.nan)
    group = [n if n else (r or "") for n, r in zip(comms["pg_name"], comms["pg_ranks"], strict=True)]
    return pd.DataFrame({"row": comms["row"].to_numpy(), "kind": np.array(kinds, dtype=object), "bytes": nbytes,
                         "group": np.array(group, dtype=object), "group_desc": comms["pg_desc"].to_numpy(),
                         "group_ranks": comms["pg_ranks"].to_numpy(), "group_size": comms["group_size"].to_numpy()})
