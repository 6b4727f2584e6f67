"""The node agent and the training library (checkpoint engine, training API)."""
