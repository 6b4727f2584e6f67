"""The ``spotrelay`` command line."""
