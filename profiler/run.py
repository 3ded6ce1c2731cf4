"""`python -m profiler.run --run-dir DIR`: one rank of a stored run, as torchrun starts it.

profile-run launches its ranks this way, and so does a user on each node of a run made by
`glmperf init-run` (docs/distributed.md). The work is in profiler.capture.launch.
"""

from profiler.capture.launch import rank_main

if __name__ == "__main__":
    rank_main()
