"""Advice for a user's own training (profiler.api, the Hugging Face and Lightning callbacks), in the
terms of what trains it.

The catalog's switches are the reference trainer's, but most of their candidate changes are one setting
or a few lines in any framework: `switches.amp.dtype=bf16` is `bf16=True` in the TrainingArguments,
`precision="bf16-mixed"` in Lightning's Trainer and `torch.autocast` around a plain loop's forward. A run
of one's own training records what trained it and the settings this advice checks (run.json
`config.framework`). They are read as the catalog's state (`Framework.state`), and each catalog
candidate for a bottleneck found is judged against that state as profiler.advice.recommend judges a
profile-run config: whether it applies, whether the run has it already, what it requires, and its
expected range: measured where the callback probed the change on the model and a batch of the run at its
train end (run.json `own_probes`: profiler.capture.own_probe), through this run's breakdown as for a
profile-run run; else the catalog's `expected` over this run's breakdown (modelled). A proposed change
is then said in the framework's terms (`Framework.terms`) and shown as the exact change to make
(`change.text`); one the framework has no setting for is excluded, saying so. A few
changes have no catalog switch (TF32 matmuls, DDP's bucket size): they are listed for their bottleneck
without a number (`EXTRAS`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optimizers import REGISTRY, Candidate, ConfigError, Optimization
from optimizers.config import build_section
from optimizers.vocabulary import Bottleneck, Capability
from profiler.advice.measured import expected_from_probe
from profiler.advice.probes import Probe
from profiler.advice.recommend import capabilities, expected, no_gain, proposal, severities, unmet
from profiler.advice.spread import run_to_run
from profiler.analysis import RunData
from profiler.analysis.figures import Figures
from profiler.settings import settings_text

Settings = Mapping[str, Any]
"""A run's recorded framework settings (run.json config.framework.settings)."""
Term = Callable[[Any, Settings], dict[str, Any] | None]
"""A catalog key's new value -> the framework's settings that make it (`Owner.name` -> value), given the
run's settings; None where the framework has no setting for it."""


@dataclass(frozen=True)
class Framework:
    """How one way of training records its settings and says the catalog's changes."""

    name: str
    label: str
    state: Callable[[Settings], dict[str, Any]]
    """The recorded settings as catalog keys (a key it leaves out, or None, is the catalog's default)."""
    terms: Mapping[str, Term]
    """Catalog key -> how the framework sets it; a change of a key not here has no equivalent."""


def _args(owner: str, **values: Any) -> dict[str, Any]:
    return {f"{owner}.{name}": value for name, value in values.items()}


def _ta(**values: Any) -> dict[str, Any]:
    return _args("TrainingArguments", **values)


HF_OPTIMIZERS = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "sgd": "sgd", "adagrad": "adagrad",
                 "rmsprop": "rmsprop"}
"""TrainingArguments.optim -> the catalog's optimizer (any other is not one the catalog knows)."""


def _hf_state(s: Settings) -> dict[str, Any]:
    optim = str(s.get("optim", "adamw_torch"))
    return {"switches.amp.dtype": "bf16" if s.get("bf16") else "fp16" if s.get("fp16") else "off",
            "switches.compile.mode": "default" if s.get("torch_compile") else "off",
            "switches.activation_checkpointing.mode": "full" if s.get("gradient_checkpointing") else "off",
            "switches.dataloader.num_workers": s.get("dataloader_num_workers"),
            "switches.dataloader.pin_memory": s.get("dataloader_pin_memory"),
            "switches.optimizer.name": HF_OPTIMIZERS.get(optim, optim),
            "switches.optimizer.impl": "fused" if optim == "adamw_torch_fused" else "auto",
            "switches.grad_accumulation.steps": s.get("gradient_accumulation_steps"),
            "train.batch_size": s.get("per_device_train_batch_size")}


HF = Framework("hf", "the Hugging Face Trainer", _hf_state, {
    "switches.amp.dtype": lambda dtype, s: _ta(bf16=dtype == "bf16", fp16=dtype == "fp16"),
    "switches.compile.mode": lambda mode, s: _ta(torch_compile=True) if mode == "default" else None,
    "switches.activation_checkpointing.mode": lambda mode, s: _ta(gradient_checkpointing=True) if mode == "full"
    else None,
    "switches.dataloader.num_workers": lambda n, s: _ta(dataloader_num_workers=n),
    "switches.dataloader.pin_memory": lambda pin, s: _ta(dataloader_pin_memory=pin),
    "switches.optimizer.impl": lambda impl, s: _ta(optim="adamw_torch_fused")
    if impl == "fused" and str(s.get("optim", "")).startswith("adamw_torch") else None,
    "switches.grad_accumulation.steps": lambda n, s: _ta(gradient_accumulation_steps=n),
    "train.batch_size": lambda batch, s: _ta(per_device_train_batch_size=batch),
})


def _torch_state(s: Settings) -> dict[str, Any]:
    """A plain loop's and a LightningModule's own settings: what api.run and the callback can see."""
    return {"switches.amp.dtype": s.get("autocast"),
            "switches.compile.mode": "default" if s.get("compile") else "off",
            "switches.dataloader.num_workers": s.get("num_workers"),
            "switches.dataloader.pin_memory": s.get("pin_memory"),
            "switches.optimizer.name": str(s.get("optimizer", "AdamW")).lower(),
            "switches.optimizer.impl": "fused" if s.get("fused") else "auto",
            "switches.grad_accumulation.steps": s.get("accumulate_grad_batches"),
            "train.batch_size": s.get("batch_size")}


TORCH = Framework("torch", "a plain training loop", _torch_state, {
    "switches.amp.dtype": lambda dtype, s: {"torch.autocast": dtype},
    "switches.compile.mode": lambda mode, s: {"torch.compile": True} if mode == "default" else None,
    "switches.activation_checkpointing.mode": lambda mode, s: {"torch.utils.checkpoint": True} if mode == "full"
    else None,
    "switches.dataloader.num_workers": lambda n, s: _args("DataLoader", num_workers=n),
    "switches.dataloader.pin_memory": lambda pin, s: _args("DataLoader", pin_memory=pin),
    "switches.optimizer.impl": lambda impl, s: _args(f"torch.optim.{s.get('optimizer', 'AdamW')}", fused=True)
    if impl == "fused" else None,
    "switches.grad_accumulation.steps": lambda n, s: {"loop.micro_batches": n},
    "train.batch_size": lambda batch, s: _args("DataLoader", batch_size=batch),
    "switches.ddp.comm_hook": lambda hook, s: {"DistributedDataParallel.comm_hook": hook},
})

PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", "off": "32-true"}
"""The catalog's amp dtype -> Lightning's Trainer precision."""


def _lightning_state(s: Settings) -> dict[str, Any]:
    precision = str(s.get("precision", "32-true"))
    dtype = "bf16" if precision.startswith("bf16") else "fp16" if precision.startswith("16") else "off"
    return {**_torch_state(s), "switches.amp.dtype": dtype}


LIGHTNING = Framework("lightning", "Lightning", _lightning_state, {
    **TORCH.terms,
    "switches.amp.dtype": lambda dtype, s: _args("L.Trainer", precision=PRECISION[dtype]),
    "switches.grad_accumulation.steps": lambda n, s: _args("L.Trainer", accumulate_grad_batches=n),
    "switches.ddp.comm_hook": lambda hook, s: {"DDPStrategy.ddp_comm_hook": hook} if hook == "fp16" else None,
})
FRAMEWORKS = {f.name: f for f in (HF, LIGHTNING, TORCH)}

HOOKS = {"fp16": "None, default_hooks.fp16_compress_hook",
         "powersgd": "powerSGD.PowerSGDState(None), powerSGD.powerSGD_hook"}


def _autocast(dtype: str, device: str) -> list[str]:
    if dtype == "off":
        return ["remove torch.autocast around the forward: fp32 matmuls"]
    lines = [f'with torch.autocast("{device}", dtype=torch.{"bfloat16" if dtype == "bf16" else "float16"}):'
             "  # around the forward and the loss"]
    return lines + ([f'scaler = torch.amp.GradScaler("{device}")  # scaler.scale(loss).backward(); '
                     "scaler.step(opt); scaler.update()"] if dtype == "fp16" else [])


CODE: dict[str, Callable[[Any, str], list[str]]] = {
    "torch.autocast": _autocast,
    "torch.compile": lambda on, device: ["model = torch.compile(model)"],
    "torch.utils.checkpoint": lambda on, device: [
        "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)  # each block, in forward"],
    "torch.float32_matmul_precision": lambda precision, device: [
        f"torch.set_float32_matmul_precision({json.dumps(precision)})"],
    "loop.micro_batches": lambda n, device: [f"loss = loss / {n}  # {n} micro-batches a step, backward after each",
                                             f"if (i + 1) % {n} == 0: opt.step(); opt.zero_grad()"],
    "DistributedDataParallel.comm_hook": lambda hook, device: [f"model.register_comm_hook({HOOKS[hook]})"],
    "DDPStrategy.ddp_comm_hook": lambda hook, device: [
        "L.Trainer(..., strategy=DDPStrategy(ddp_comm_hook=default_hooks.fp16_compress_hook))"],
}
"""Changes that are code, not an argument: the lines to add."""


def _python(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def change_text(said: Mapping[str, Any], device: str) -> str:
    """The exact change: `Owner(..., name=value)` for arguments, the lines to add for code."""
    calls: dict[str, list[str]] = {}
    lines: list[str] = []
    for key, value in said.items():
        if key in CODE:
            lines += CODE[key](value, device)
        else:
            owner, name = key.rsplit(".", 1)
            calls.setdefault(owner, []).append(f"{name}={_python(value)}")
    return "\n".join([f"{owner}(..., {', '.join(args)})" for owner, args in calls.items()] + lines)


@dataclass(frozen=True)
class Extra:
    """A change no catalog switch makes: proposed for the bottlenecks it addresses, without a range."""

    addresses: tuple[Bottleneck, ...]
    done: Callable[[Settings], bool]
    """Whether the run has it already, by its settings over its environment (run.json)."""
    says: Mapping[str, dict[str, Any]]
    """Framework name -> its settings for the change."""
    requires: tuple[Capability, ...]
    risk: str
    note: str

    def candidate(self, said: Mapping[str, Any]) -> Candidate:
        return Candidate(set=said, effects=(), requires=self.requires, risk=self.risk, note=self.note)


_TF32 = {"torch.float32_matmul_precision": "high"}
EXTRAS = (
    Extra((Bottleneck.COMPUTE_BOUND, Bottleneck.LOW_PRECISION_UNUSED),
          lambda s: s.get("tf32") is True or s.get("float32_matmul_precision") not in (None, "highest"),
          {"hf": _ta(tf32=True), "lightning": _TF32, "torch": _TF32},
          (Capability.CUDA, Capability.FAST_BF16_MATMUL), "numerics",
          "fp32 matmuls on the tensor cores as TF32 (10 mantissa bits): GPUs of compute capability 8.0 and newer"),
    Extra((Bottleneck.COMM_BOUND,), lambda s: s.get("ddp_bucket_cap_mb") is not None,
          {"hf": _ta(ddp_bucket_cap_mb=100), "lightning": _args("DDPStrategy", bucket_cap_mb=100),
           "torch": _args("DistributedDataParallel", bucket_cap_mb=100)},
          (Capability.SEVERAL_RANKS,), "none", "fewer, larger gradient all-reduces (DDP's buckets are 25 MB)"),
)
_UNSET = object()
NOT_MODELLED = {"source": "not modelled", "basis": "no catalog switch makes this change, so no modelled range: "
                                                    "run again with it and compare the two runs"}


def own_training(run: RunData) -> bool:
    """Whether the run is of a user's own training (profiler.api or a framework callback)."""
    return run.source == "api"


def framework_of(run: RunData) -> tuple[Framework, Settings]:
    """What trained the run and its recorded settings (a run recorded before them: a plain loop's)."""
    record = run.config.get("framework") or {}
    return FRAMEWORKS.get(str(record.get("name")), TORCH), record.get("settings") or {}


def _measured(run: RunData) -> dict[str, Any]:
    """The batch size and micro-batches a step the steps recorded, where they did (the callbacks do)."""
    out = {}
    for key, column in (("train.batch_size", "batch_size"), ("switches.grad_accumulation.steps", "micro_batches")):
        if column in run.steps and not run.steps.empty and run.steps[column].median() > 0:
            out[key] = int(run.steps[column].median())
    return out


def _stored_probes(stored: Any) -> dict[str, Probe]:
    """The changes the callback measured on the model at the train end (run.json `own_probes`: profiler.
    capture.own_probe), by their catalog change; one that does not read as a probe is passed by."""
    out = {}
    for data in stored if isinstance(stored, list) else []:
        try:
            probe = Probe(**data)
            out[json.dumps(dict(probe.change), sort_keys=True)] = probe
        except (TypeError, ValueError):
            continue
    return out


@dataclass
class _Judge:
    """One run's framework, settings and figures, against which each change is judged."""

    run: RunData
    figures: Figures
    frame: Framework
    settings: Settings
    severity: dict[Bottleneck, float]
    caps: dict[Capability, tuple[bool, str]]
    allow_model_changes: bool

    def __post_init__(self) -> None:
        recorded = {k: v for k, v in self.frame.state(self.settings).items() if v is not None}
        self.state = {**_measured(self.run), **recorded}
        self.sections = {opt.name: self.section(opt) for opt in REGISTRY}
        self.device = str(self.run.device).split(":")[0]
        self.ranked: list[dict[str, Any]] = []
        self.excluded: list[dict[str, Any]] = []
        self.probes = _stored_probes(self.run.record.get("own_probes"))

    def say(self, settings: Mapping[str, Any]) -> dict[str, Any] | None:
        """The catalog change in the framework's terms, less what the run has already (None: no equivalent)."""
        said: dict[str, Any] = {}
        for key, value in settings.items():
            term = self.frame.terms.get(key)
            own = term(value, self.settings) if term else None
            if own is None:
                return None
            said.update(own)
        return {k: v for k, v in said.items() if self.settings.get(k.rsplit(".", 1)[1], _UNSET) != v}

    def section(self, opt: Optimization) -> Any:
        """The switch's section as the run has it (the catalog's defaults where it recorded nothing), or
        the ConfigError of a setting the catalog does not know."""
        prefix = f"switches.{opt.name}."
        try:
            return build_section(opt.config, {k[len(prefix):]: v for k, v in self.state.items()
                                              if k.startswith(prefix)}, prefix[:-1])
        except ConfigError as exc:
            return exc

    def current(self, key: str) -> Any:
        """The run's value of a catalog key (None: not known)."""
        kind, switch, name = (key.split(".") + ["", ""])[:3]
        section = self.sections.get(switch) if kind == "switches" else None
        if section is None or isinstance(section, ConfigError):
            return self.state.get(key)
        return getattr(section, name, None)

    def catalog(self, opt: Optimization, candidate: Candidate, kinds: Sequence[Bottleneck]) -> None:
        """Propose, exclude or pass by (the run has it already) one catalog candidate."""
        section = self.sections[opt.name]
        if isinstance(section, ConfigError):
            return self.exclude(opt.name, candidate.set, f"the run's setting is not one the catalog knows ({section})")
        current = {k: self.current(k) for k in candidate.set}
        unknown = [k for k, v in current.items() if v is None]
        if unknown:
            return self.exclude(opt.name, candidate.set, f"the run did not record its {', '.join(unknown)}")
        settings = candidate.resolve(self.current)
        if not candidate.applies(section) or settings == current:
            return None  # what the run does already
        said = self.say(settings)
        if said is None:
            return self.exclude(opt.name, settings, f"{self.frame.label} has no setting for it")
        why = unmet(candidate, self.caps, self.allow_model_changes)
        if why:
            return self.exclude(opt.name, settings, why)
        if not said:
            return None  # the framework's settings have it already
        exp = expected(candidate, self.figures)
        exp.update(source="modelled", basis=f"modelled as the catalog's {settings_text(settings)}: {exp['basis']}")
        probe = self.probes.get(json.dumps(dict(settings), sort_keys=True))
        if probe is not None:
            exp = expected_from_probe({"switch": opt.name, "set": settings, "expected": exp}, probe, self.figures,
                                      was_cached=False, spreads={"tokens_per_s": run_to_run("tokens_per_s",
                                                                                            self.run.device)})
            exp["basis"] = f"on your model and a batch of this run, at its train end: {exp['basis']}"
        rec = proposal(opt.name, candidate, said, kinds, self.severity, exp, self.caps)
        if rec["score"] <= 0:
            return self.exclude(opt.name, settings, no_gain(rec)["reason"])
        self.propose(rec, said, settings)

    def extra(self, extra: Extra) -> None:
        """Propose or exclude a change no switch makes, where a bottleneck it addresses was found."""
        kinds = [k for k in extra.addresses if k in self.severity]
        said = extra.says.get(self.frame.name)
        if not kinds or not said or extra.done({**self.run.environment, **self.settings}):
            return
        candidate = extra.candidate(said)
        why = unmet(candidate, self.caps, self.allow_model_changes)
        if why:
            return self.exclude(None, said, why)
        self.propose(proposal(None, candidate, said, kinds, self.severity, dict(NOT_MODELLED), self.caps), said, None)

    def propose(self, rec: dict[str, Any], said: Mapping[str, Any], catalog: Mapping[str, Any] | None) -> None:
        self.ranked.append({**rec, "change": {"framework": self.frame.name, "text": change_text(said, self.device),
                                              "catalog": dict(catalog) if catalog else None}})

    def exclude(self, switch: str | None, settings: Mapping[str, Any], reason: str) -> None:
        shown = {k: None if callable(v) else v for k, v in settings.items()}
        self.excluded.append({"switch": switch, "set": shown, "reason": reason})


def own_advice(run: RunData, figures: Figures, diagnosis: Mapping[str, Any], *,
               allow_model_changes: bool = False) -> dict[str, Any]:
    """{"recommendations": [...] ranked, "excluded": [...], "framework": name} for a run of one's own
    training: the shape of profiler.advice.recommend's, each with its `change` in the framework's terms."""
    frame, settings = framework_of(run)
    judge = _Judge(run, figures, frame, settings, severities(diagnosis), capabilities(run, figures),
                   allow_model_changes)
    for opt in REGISTRY:
        kinds = [k for k in opt.addresses if k in judge.severity]
        for candidate in opt.candidates if kinds else ():
            judge.catalog(opt, candidate, kinds)
    for extra in EXTRAS:
        judge.extra(extra)
    judge.ranked.sort(key=lambda r: r["score"], reverse=True)
    return {"recommendations": judge.ranked, "excluded": judge.excluded, "framework": frame.name}
