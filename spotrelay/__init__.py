"""spotrelay: keep long distributed training runs alive and cheap on EC2 Spot capacity."""

from __future__ import annotations

__version__ = "0.1.0"
