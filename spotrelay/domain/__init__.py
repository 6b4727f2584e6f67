"""Pure domain: no boto3, no clock, no randomness it did not receive."""
