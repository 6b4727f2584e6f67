"""The fleet simulator (``spotrelay simulate``; docs/simulator.md).

spotrelay's own decisions (placement, recovery strategies, retry budget, cost ledger and the job-run
ASL's paths) replayed on a simulated clock over months of spot markets, beside the baselines teams
run today, all on the same markets and seeds.

- ``bounds``: the input bounds (the CLI's options and the library judge the same numbers).
- ``inputs``: Bamboo traces and the pools CSV (strict readers, errors name file and line).
- ``market`` / ``build``: pools, prices, capacity and reclaims; the synthetic generator.
- ``job``: the stated job (step times, checkpoint stall/flush, restore) and its derivation.
- ``asl``: an interpreter of functions/workflows/job_run.asl.json.
- ``engine`` / ``training``: the event loop and the physics every policy shares; a gang's training progress.
- ``controller``: spotrelay (the ASL walked, its tasks served by the shipped decisions).
- ``baselines``: on-demand, price-limit, skypilot-like, sagemaker-like.
- ``runner`` / ``report``: every policy x seed, the contract's numbers, table, JSON, plot.
"""

from spotrelay.sim_native import activate

# the native build's modules first on this package's path, when it matches the source (spotrelay/sim_native.py)
activate(__path__)
