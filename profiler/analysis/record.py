"""run.json read through typed accessors: each field a reader needs, with its one default said here.

A stored run's record is a plain dict (docs/run-format.md): which keys it has depends on what made the
run (profile-run, `profiler.api`, `glmperf import`) and how far it got. Readers ask `RunRecord`
instead of the dict, so a missing key means the same everywhere: `warmup_steps` of a config without
it is `ProfileConfig`'s default (0 for an import, whose traces hold steady steps only), not a number
each reader picks. `RunData` (profiler.analysis.loader) is a `RunRecord` with the run's tables; a
listing of runs (`store.list_runs`) wraps each record alone.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from profiler import store
from profiler.settings import ProfileConfig
from profiler.store.checks import said

PROFILE_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(ProfileConfig) if f.default is not MISSING}
"""The profile section's defaults, for a stored config without the key (an imported run's config is empty)."""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class RunRecord:
    """A run's run.json (`record`) and directory (`path`), read by name."""

    path: Path
    record: dict[str, Any]

    def __init__(self, path: Path, record: dict[str, Any]) -> None:
        self.path = path
        self.record = record

    @property
    def id(self) -> str:
        return str(self.record.get("id") or self.path.name)

    @property
    def recorded_status(self) -> str:
        """The status run.json holds (a listing's record or a loaded run may read `corrupt` instead)."""
        return str(self.record.get("status"))

    @property
    def status(self) -> str:
        return self.recorded_status

    @property
    def ended(self) -> bool:
        """True once the run was finalized (its summary in run.json is the stored one)."""
        return self.recorded_status in store.FINAL_STATUSES

    @property
    def name(self) -> str | None:
        return self.record.get("name")

    @property
    def created(self) -> str | None:
        """When the run was made (ISO 8601, UTC)."""
        return self.record.get("created")

    @property
    def ended_at(self) -> str | None:
        """When the run ended (ISO 8601, UTC); None while it runs or after a kill."""
        return self.record.get("ended")

    @property
    def error(self) -> str | None:
        """Why the run failed, as its ranks or the launcher said it."""
        return self.record.get("error")

    @property
    def source(self) -> str:
        """What made the run: `profile-run` (also for runs stored without the field), `api`, `import`."""
        return str(self.record.get("source") or "profile-run")

    @property
    def world_size(self) -> int:
        return int(self.record.get("world_size") or 1)

    @property
    def config(self) -> dict[str, Any]:
        return _dict(self.record.get("config"))

    @property
    def own_model(self) -> bool:
        """Whether the run trained a model of its own (an imported trace, a user's training), not the reference
        trainer's: its config has no switches of ours, so no preset to differ from and none to flip."""
        return "switches" not in self.config

    def _profile(self, key: str) -> float:
        """config.profile's number `key` (its default when absent); a StoreError naming it when it is no number."""
        value = _dict(self.config.get("profile")).get(key, PROFILE_DEFAULTS[key])
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise store.StoreError(f"{self.path / 'run.json'}: config.profile.{key} is {said(value)}; "
                                   "allowed: a number")
        return value

    @property
    def warmup_steps(self) -> int:
        """config.profile.warmup_steps: the first steps a summary leaves out. An imported run leaves out
        none: its traces hold the profiler's active steps only, the schedule's own warmup already dropped."""
        if self.source == "import":
            return 0
        return int(self._profile("warmup_steps"))

    @property
    def preset_changes(self) -> list[str] | None:
        """The config keys changed from the run's preset, as `key=value` (stored when profile-run made the
        run); None for a run stored without them."""
        changed = self.record.get("preset_changes")
        return [str(c) for c in changed] if isinstance(changed, list) else None

    @property
    def memory_budget_gb(self) -> float:
        """config.profile.memory_budget_gb (0: the device's, or on CPU the machine's, memory)."""
        return float(self._profile("memory_budget_gb"))

    @property
    def environment(self) -> dict[str, Any]:
        """Where the run ran (profiler.instruments.machine.environment)."""
        return _dict(self.record.get("environment"))

    @property
    def device(self) -> str:
        """environment.device: `cuda`, `cuda:<n>` or `cpu` (a run without it ran on the CPU)."""
        return str(self.environment.get("device") or "cpu")

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def peak(self) -> dict[str, Any]:
        """The device's peak in the run's matmul dtype: `flops`, `dtype`, `source`."""
        return _dict(self.record.get("peak"))

    @property
    def matmul_peaks(self) -> dict[str, Any]:
        """Every matmul dtype's peak FLOP/s on the run's device, by dtype."""
        return _dict(self.record.get("matmul_peaks"))

    @property
    def shape_speedup(self) -> dict[str, Any]:
        """bf16/fp16 over fp32 at the run's own heaviest matmul shapes, by dtype."""
        return _dict(self.record.get("shape_speedup"))

    @property
    def model(self) -> dict[str, Any]:
        """Model facts stored when the run ended: num_params, flops_per_token, attention_flops_per_token,
        and for a user's own model flops_source."""
        return _dict(self.record.get("model"))

    @property
    def sampling(self) -> dict[str, Any]:
        """The sampler the run had: `source`, `hz`, `why` (when not NVML)."""
        return _dict(self.record.get("sampling"))

    @property
    def switches_applied(self) -> list[Any]:
        return list(self.record.get("switches_applied") or [])

    @property
    def stored_summary(self) -> dict[str, Any] | None:
        """run.json `summary`: the finalized summary, or None (profiler.analysis.summary_of computes one)."""
        return self.record.get("summary")

    @property
    def diagnosis(self) -> dict[str, Any]:
        """run.json `diagnosis` ({} when the run was stored without one)."""
        return _dict(self.record.get("diagnosis"))

    @property
    def verification(self) -> dict[str, Any] | None:
        """diagnosis.verification: the verdicts of rerunning its recommendations, or None."""
        return self.diagnosis.get("verification")

    @property
    def verifies(self) -> dict[str, Any]:
        """The link of a run made to verify another: `run`, `trial`, `repeat` ({} for any other run)."""
        return _dict(self.record.get("verifies"))
