"""What autograd keeps between forward and backward, counted one way for the plan and for a run.

`glmperf plan` traces the model under FakeTensorMode and counts the distinct storages its forward
saves; the tests measure the same count on real ranks. A pipeline stage holds several micro-batches'
saved tensors at once and frees each batch's in its backward, so there the number that matters is
the peak of what is alive, not one forward's total: `SavedTracker` follows both.
"""

from __future__ import annotations

import weakref
from types import TracebackType
from typing import Any

import torch
from torch import nn

from reference_model.grads import local_part


def _storage(t: torch.Tensor) -> torch.UntypedStorage:
    """The storage holding `t`'s bytes on this rank (a DTensor's local shard, not its wrapper)."""
    return local_part(t).untyped_storage()


def _weight_kind(t: torch.Tensor) -> str | None:
    """"param" for a parameter or a view of one, "copy" for autocast's compute-dtype copy of one (or a
    view of that copy), None for an activation."""
    root = t._base if t._base is not None else t
    if isinstance(t, nn.Parameter) or isinstance(root, nn.Parameter):
        return "param"
    fn = root.grad_fn
    if fn is None or fn.name() != "ToCopyBackward0":
        return None
    source = fn.next_functions[0][0]
    return "copy" if isinstance(getattr(source, "variable", None), nn.Parameter) else None


class _Ticket:
    """What autograd keeps in place of a saved tensor: the tensor, and a release when autograd drops it."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class SavedTracker:
    """Live and peak bytes of the distinct storages autograd saves while it is entered, and of tensors
    passed to `hold` (a pipeline stage's outputs, kept for its backward though nothing on the rank saves
    them). Weights are the parameters' memory and are skipped: a parameter or a view of it, FSDP's
    gathered copy (a parameter too) and autocast's compute-dtype copy, which autocast makes once per
    weight and context however many micro-batches it serves (`glmperf plan` counts those copies once).
    `model`'s parameters' storages are known before the forward."""

    def __init__(self, model: nn.Module) -> None:
        self._own = {_storage(p)._cdata for p in model.parameters()}
        self._live: dict[int, list[int]] = {}  # storage -> [bytes, holders]
        self.current = 0
        self.peak = 0
        self.copies: dict[int, int] = {}
        """Autocast's weight copies that were saved: storage -> bytes."""
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda ticket: ticket.tensor)
        self._ways = 1
        self._handles: list[Any] = []

    def split_inside(self, modules: list[nn.Module], ways: int) -> None:
        """Count what is first saved while one of `modules` runs at 1/`ways` of its bytes: a trace at
        whole-sequence shapes of modules that a rank runs on 1/ways of the sequence (sequence parallelism)."""
        def enter(*_: Any) -> None:
            self._ways = ways

        def leave(*_: Any) -> None:
            self._ways = 1

        for module in modules:
            self._handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]

    def hold(self, t: torch.Tensor, owner: object | None = None) -> None:
        """Count `t`'s storage until `owner` (default: `t` itself) is freed."""
        storage = _storage(t)
        key = storage._cdata
        if key in self._own:
            return
        entry = self._live.setdefault(key, [storage.nbytes() // self._ways, 0])
        if entry[1] == 0:
            self.current += entry[0]
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        weakref.finalize(t if owner is None else owner, self._release, key)

    def _release(self, key: int) -> None:
        entry = self._live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self._live[key]

    def _pack(self, t: torch.Tensor) -> Any:
        kind = _weight_kind(t)
        if kind == "copy":
            storage = _storage(t)
            self.copies[storage._cdata] = storage.nbytes()
        if kind is not None:
            return _Ticket(t)
        ticket = _Ticket(t)
        self.hold(t, owner=ticket)
        return ticket

    def __enter__(self) -> SavedTracker:
        self._hooks.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._hooks.__exit__(kind, error, trace)
        for handle in self._handles:
            handle.remove()


def forward_saved(model: nn.Module, input_ids: torch.Tensor, autocast_dtype: torch.dtype | None, *,
                  split: tuple[list[nn.Module], int] | None = None) -> tuple[int, int]:
    """(Bytes of the distinct storages one forward saves for backward plus the logits, bytes of the
    weight copies autocast saved): what a step holds between forward and backward. Real or fake tensors.
    `split`: modules whose saves count at 1/ways (`SavedTracker.split_inside`)."""
    device_type = input_ids.device.type
    with SavedTracker(model) as tracker, torch.autocast(device_type, dtype=autocast_dtype,
                                                        enabled=autocast_dtype is not None):
        if split is not None:
            tracker.split_inside(*split)
        out = model(input_ids, labels=input_ids)
    tracker.hold(out.logits)
    return tracker.current, sum(tracker.copies.values())


def saved_bytes(model: nn.Module, input_ids: torch.Tensor, autocast_dtype: torch.dtype | None) -> int:
    """The activations of `forward_saved`: what `glmperf plan` traces per block and micro-batch."""
    return forward_saved(model, input_ids, autocast_dtype)[0]
