"""The job spec: what a researcher writes (version 1)."""

from spotrelay.spec.load import load_spec, parse_spec, spec_hash, training_hash
from spotrelay.spec.models import JobSpec

__all__ = ["JobSpec", "load_spec", "parse_spec", "spec_hash", "training_hash"]
