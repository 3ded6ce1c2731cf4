"""The command line: `profile-run` (measure a run) and `glmperf <command>` (everything else)."""

from profiler.cli.main import main, profile_run_main

__all__ = ["main", "profile_run_main"]
