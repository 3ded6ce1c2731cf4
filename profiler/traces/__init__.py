"""Reading existing torch.profiler chrome traces (one per rank) into a run."""
