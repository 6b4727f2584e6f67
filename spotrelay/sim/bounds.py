"""The simulator's input bounds: every input finite and every run ending.

Kept apart (no imports) so the CLI states them in its options without importing the simulator at
start-up, and the library judges the same numbers where a value arrives another way (``--boot-s-for``).
"""

MAX_JOB_HOURS = 10 * 8760.0  # ten years of training (the horizon is runner.HORIZON_JOBS jobs plus 30 days)
MAX_BOOT_S = 86400.0  # a day to boot
MAX_CHECKPOINT_MINUTES = 7 * 24 * 60.0  # a checkpoint at least weekly
MAX_USD_PER_HOUR = 10_000.0  # per node-hour
MAX_CHECKPOINT_GB = 1_000_000.0  # a petabyte of checkpoint
MAX_STEP_S = 86400.0  # a day per training step
# runs one call makes at most (seeds x jobs x policies): each takes about a second, and a sweep keeps every
# run's result (and, with workers, its task) in memory: 10^9 seeds would exhaust it before the first table
MAX_RUNS = 100_000
MAX_WORKERS = 256  # worker processes (each a Python interpreter of ~100 MB)
