"""The command line: `profile-run` (measure a run) and `glmperf <command>` (everything else)."""

import os

# Before torch loads (every entry point imports this package first): kineto logs every profiler
# start/stop (USDT, STAGE lines) into the progress output; 6 silences its info levels, a user's own
# KINETO_LOG_LEVEL wins.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

from profiler.cli.main import main  # noqa: E402
from profiler.cli.profile_run import main as profile_run_main  # noqa: E402

__all__ = ["main", "profile_run_main"]
