"""Code delivery: ``spotrelay submit`` packs the job's directory (pack.py), the agent unpacks it on
each node (unpack.py), both content-addressed by sha256."""
