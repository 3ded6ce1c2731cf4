"""The devices `glmperf plan --gpu` knows by name, in a module of their own: the command line lists them
without loading the plan's model code (and torch)."""

GPUS_GB: dict[str, float] = {"a100-40gb": 40.0, "a100-80gb": 80.0, "h100": 80.0, "h200": 141.0,
                             "b200": 180.0, "l40s": 48.0, "rtx4090": 24.0}
"""Device memory by name (the vendors' datasheets, GB = 1e9 bytes), for `--gpu`."""
