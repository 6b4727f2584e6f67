"""The checkpoint engine: full resumable state, two tiers (local + S3), atomic commit, safe loading.

Training scripts use it through :mod:`agent.training`; see docs/checkpoints.md for the protocol.
"""
