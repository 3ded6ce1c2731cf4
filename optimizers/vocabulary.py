"""The vocabularies a switch's facts are stated in: bottleneck kinds, capabilities, phases of a step.

`Bottleneck` names what can hold a training step back. The profiler's diagnosis fires these kinds
(each rule with its threshold and evidence, docs/diagnosis.md) and a switch's `addresses` lists the
ones it relieves, so both sides must spell them alike: `Registry.register` refuses a kind that is
not a member. `Capability` names what a candidate change needs from the device or the run (a fast
bf16 matmul, CUDA, several ranks, ...); the profiler decides whether a run has it, by measurement
where it can.

`StepPhase` names the parts of a training step the step timer times and an effect can target;
the profiler's metric registry (profiler/metrics.py) builds its phase columns, shares and metrics
from it, so adding a phase is one line here.

All are `str` enums: a member compares equal to its name (`Bottleneck.MEMORY_BOUND ==
"memory_bound"`), so JSON and run.json carry plain strings. Each member has a `description`.
"""

from __future__ import annotations

import enum


class _Described(str, enum.Enum):
    """A str enum whose members carry a one-line description: `NAME = ("value", "what it means")`."""

    description: str

    def __new__(cls, value: str, description: str) -> _Described:
        member = str.__new__(cls, value)
        member._value_ = value
        member.description = description
        return member

    def __str__(self) -> str:
        return self.value


class Bottleneck(_Described):
    """What holds a training step back; the diagnosis fires these, switches address them."""

    INPUT_BOUND = ("input_bound", "the step waits for the data loader (data wait is a large share of the step)")
    HOST_BOUND = ("host_bound", "the host cannot launch work fast enough: the device idles between kernels, "
                                "or on a CPU the step is many tiny operators")
    MEMORY_BOUND = ("memory_bound", "peak memory is near the capacity: the batch or sequence cannot grow, "
                                    "or the run is close to out-of-memory")
    COMM_BOUND = ("comm_bound", "gradient communication that backward does not overlap (exposed all-reduce) "
                                "is a large share of the step")
    OPTIMIZER_BOUND = ("optimizer_bound", "the optimizer step is a large share of the step")
    ATTENTION_BOUND = ("attention_bound", "attention operators are a large share of forward and backward "
                                          "(long sequences)")
    LOW_PRECISION_UNUSED = ("low_precision_unused", "matmuls run in fp32 on a device whose bf16/fp16 matmuls "
                                                    "are measurably faster")
    PRECISION_EMULATED = ("precision_emulated", "the run's low-precision dtype is emulated on this device "
                                                "(e.g. bf16 without native support), slower than fp32")
    COMPUTE_BOUND = ("compute_bound", "the device is busy with the model's arithmetic itself: only less work "
                                      "or faster arithmetic shortens the step")
    UNSTABLE = ("unstable", "training is numerically unstable or stalls: non-finite losses or gradients, "
                            "skipped steps, loss spikes, or a loss plateau")
    CHECKPOINT_BOUND = ("checkpoint_bound", "saving checkpoints takes a visible share of the run's time")
    STRAGGLER = ("straggler", "one rank's steps are slower than the median rank's, and the others wait for it")
    CPU_OVERSUBSCRIBED = ("cpu_oversubscribed", "more busy threads and processes (torch threads, loader "
                                                "workers, other jobs) than CPU cores")
    THROTTLED = ("throttled", "the device runs below its clocks: power or thermal limits")
    RECOMPILING = ("recompiling", "torch.compile recompiles during the run (changing shapes), paying compile "
                                  "time again")


class Capability(_Described):
    """What a candidate change needs from the device or the run before it can pay off."""

    FAST_BF16_MATMUL = ("fast_bf16_matmul", "the device runs bf16 matmuls faster than fp32 (CUDA capability "
                                            ">= 8.0, a CPU with avx512_bf16 or AMX); the profiler decides by "
                                            "measurement")
    FAST_FP16_MATMUL = ("fast_fp16_matmul", "the device has fp16 tensor cores (CUDA capability >= 7.0)")
    FP16_OVER_BF16 = ("fp16_over_bf16", "fp16 matmuls beat what bf16 gives here (bf16 missing, emulated or "
                                        "slower): only then is fp16's GradScaler worth carrying")
    CUDA = ("cuda", "the run is on a CUDA device")
    SEVERAL_RANKS = ("several_ranks", "the run has more than one rank (torchrun, --nproc N)")
    SPARE_CORES = ("spare_cores", "free CPU cores beyond the training process's threads, for loader workers")
    COMPILER = ("compiler", "the toolchain Inductor needs: a C++ compiler on CPU, triton on CUDA")
    NOT_HOST_BOUND = ("not_host_bound", "the step is not host bound: smaller pieces of work per call would not "
                                        "turn it into framework overhead")


class StepPhase(_Described):
    """The parts of a step, in step order: `<value>_s` columns of steps.parquet, targets of effects."""

    DATA = ("data", "waiting for the next batch from the loader, summed over micro-batches")
    H2D = ("h2d", "host-to-device copy of the batch")
    FORWARD = ("forward", "forward pass including the loss")
    BACKWARD = ("backward", "backward pass, minus the exposed communication")
    OPTIMIZER = ("optimizer", "unscale, clip / grad norm, optimizer and scheduler step")
    COMM = ("comm", "exposed (not overlapped) communication, carved out of backward")
    CHECKPOINT = ("checkpoint", "checkpoint save after the step (0 on other steps)")
    OTHER = ("other", "the rest of the step: hooks, loop overhead, gaps (>= 0)")
