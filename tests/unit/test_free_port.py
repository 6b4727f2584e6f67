"""Ports the twin picks now for a server that binds them later (a gang's rendezvous, moto)."""

from __future__ import annotations

import random
import socket

import pytest

from spotrelay.local.motoserver import _FIXED_FLOOR, _ephemeral_low, free_port


def test_a_port_for_a_later_server_is_below_the_ephemeral_range() -> None:
    """No outgoing connection can take it as its source port before its server binds it."""
    low = _ephemeral_low()
    if low <= _FIXED_FLOOR + 1000:
        pytest.skip(f"this kernel's ephemeral range starts at {low}")
    for port in {free_port() for _ in range(20)}:
        assert _FIXED_FLOOR <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free, as promised


def test_a_port_someone_listens_on_is_not_handed_out() -> None:
    low = _ephemeral_low()
    if low <= _FIXED_FLOOR + 1000:
        pytest.skip(f"this kernel's ephemeral range starts at {low}")
    first = random.Random(3).randrange(_FIXED_FLOOR, low)
    with socket.socket() as taken:
        try:
            taken.bind(("127.0.0.1", first))
        except OSError:
            pytest.skip(f"port {first} is in use on this machine")
        taken.listen()
        assert free_port(random.Random(3)) != first
