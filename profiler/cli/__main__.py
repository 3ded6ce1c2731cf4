"""`python -m profiler.cli`: profile-run, for a process started without the installed scripts."""

import sys

from profiler.cli import profile_run_main

sys.exit(profile_run_main())
