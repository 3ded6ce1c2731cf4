"""What the framework callbacks share: the framework check, tokens from a batch, the timing of a
loader's batches, and the run a callback opens from its options (profiler.api.OPTIONS) and the
framework's own facts."""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch

from profiler import api
from profiler.settings import RERUN_OVERRIDES as OVERRIDES
from profiler.settings import RERUN_RUN_FILE as RUN_FILE

TokensOf = Callable[[Any], int]


def require(module: str, *, extra: str, what: str) -> ModuleType:
    """Import a framework, or one ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{what} needs {module.split('.')[0]}, which is not installed ({exc}); install it "
                          f"with: pip install -e '.[{extra}]'  (or: pip install 'glmperf[{extra}]')") from None


def batch_tokens(batch: Any) -> int:
    """Input tokens in a batch: its `input_ids` (a mapping), else its first tensor (a tuple or list,
    or the batch itself). Pass `tokens_of=` to a callback for any other layout."""
    if isinstance(batch, Mapping):
        ids = batch.get("input_ids")
        if isinstance(ids, torch.Tensor):
            return int(ids.numel())
        batch = list(batch.values())
    if isinstance(batch, torch.Tensor):
        return int(batch.numel())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            if isinstance(item, torch.Tensor):
                return int(item.numel())
    raise TypeError(f"cannot count the tokens of a batch of type {type(batch).__name__}: pass "
                    "tokens_of=<function of the batch returning its input tokens> to the callback")


def overrides(owner: str) -> dict[str, Any]:
    """The settings of `owner` a rerun of `glmperf recommend RUN --verify -- COMMAND` asks this process to
    take (profiler.experiments.rerun); {} in any other run."""
    text = os.environ.get(OVERRIDES)
    if not text:
        return {}
    try:
        wanted = json.loads(text).get(owner) or {}
    except (ValueError, AttributeError):
        raise ValueError(f"{OVERRIDES}: got {text!r}; allowed: JSON {{owner: {{name: value}}}}") from None
    return dict(wanted)


def take_overrides(cls: type, method: str, apply: Callable[[Any, dict[str, Any]], dict[str, Any]],
                   wanted: Mapping[str, Any]) -> None:
    """Have `cls.method` take `wanted` first, once per process: `apply(instance, kwargs)` sets them and returns
    the keyword arguments the original method then gets (see the Hugging Face and Lightning callbacks)."""
    original = getattr(cls, method)
    if not wanted or getattr(original, "__glmperf_overrides__", False):
        return

    @functools.wraps(original)
    def taking(self: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, *args, **apply(self, {**kwargs, **wanted}))

    taking.__glmperf_overrides__ = True  # type: ignore[attr-defined]
    setattr(cls, method, taking)


class _Fetched:
    """A loader's iterator whose every batch is fetched through `fetch(next_batch)`."""

    def __init__(self, iterator: Any, fetch: Callable[[Callable[[], Any]], Any]) -> None:
        self._iterator, self._fetch = iterator, fetch

    def __iter__(self) -> _Fetched:
        return self

    def __next__(self) -> Any:
        return self._fetch(lambda: next(self._iterator))

    def __len__(self) -> int:
        return len(self._iterator)

    def __getattr__(self, name: str) -> Any:  # the loader's own calls on its iterator (`_reset`)
        return getattr(self._iterator, name)


def time_fetches(loader: Any, fetch: Callable[[Callable[[], Any]], Any]) -> Callable[[], None]:
    """Have every batch of `loader` fetched through `fetch(next_batch)`, so that a callback times it as the
    `data` phase (the framework fetches batches before any event of its own); returns what undoes it.

    A torch DataLoader starts each iteration from its `_get_iterator` (inside accelerate's wrapper, its
    `base_dataloader`, too): that one loader's is wrapped. A loader of another kind is left as it is."""
    base = getattr(loader, "base_dataloader", loader)
    make = getattr(base, "_get_iterator", None)
    if not isinstance(base, torch.utils.data.DataLoader) or make is None:
        return lambda: None
    vars(base)["_get_iterator"] = lambda: _Fetched(make(), fetch)
    return lambda: vars(base).pop("_get_iterator", None)


class CallbackRun:
    """The run behind a callback: opened once the framework knows the model, ended once.

    A run still open when the interpreter exits (the framework raised past every hook) ends then,
    `failed` or `interrupted` with the exception Python reports, so a crash loses nothing measured.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        api.check_options(options)
        self.options = dict(options)
        self.run: api.Run | None = None
        """The run while training runs."""
        self.last: api.Run | None = None
        """The run most recently ended (its `dir`, `status` and `summary`)."""
        self._atexit = False

    def open(self, *, defaults: Mapping[str, Any], framework: Mapping[str, Any], rank: int | None = None,
             world_size: int | None = None) -> api.Run:
        """Start the run with the user's options over the framework's `defaults` (name, config, model, amp);
        `framework`: its name and the settings the advice checks (run.json config.framework)."""
        self.run = api.Run(**{**defaults, **self.options})
        self.run.framework = dict(framework)
        if rank is not None and world_size is not None:
            self.run.rank, self.run.world_size = rank, world_size
        self.run.start()
        named = os.environ.get(RUN_FILE)
        if named and self.run.dir is not None:  # a rerun's: which run this process made
            with open(named, "a", encoding="utf-8") as f:
                f.write(f"{self.run.dir}\n")
        if not self._atexit:
            atexit.register(self._at_exit)
            self._atexit = True
        return self.run

    def close(self, error: BaseException | None = None) -> None:
        run, self.run = self.run, None
        if run is not None:
            self.last = run
            run.end(error)

    def _at_exit(self) -> None:
        if self.run is not None:
            self.close(getattr(sys, "last_value", None) or RuntimeError(
                "training ended without the framework's train-end hook (an exception it did not report)"))
