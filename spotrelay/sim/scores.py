"""The simulated market's derived spot placement scores (``gang_score``): a coarse 1-10 score for
launching a gang where the pool's free capacity is known, with a seeded noise per pool and 10-minute
window (``score_noise``). Split from sim/market.py, whose capacity models supply the free capacity."""

from __future__ import annotations

import _random
import math
import random
import zlib
from array import array

SCORE_NOISE = 1.5  # standard deviation of a derived placement score, in score points
SCORE_WINDOW_S = 600.0  # a derived score's noise is redrawn every 10 minutes


# (seed, pool key) -> noise per window (NaN: not drawn yet): every job of a seed shares the market, so
# the draws are kept for all of it (about 90k windows x 8 bytes per pool for a 10-month job), one seed at a time
_NOISE: dict[tuple[int, str], array[float]] = {}
_PREFIX: dict[tuple[int, str], int] = {}  # crc32 of "seed/key/": crc32 continues over the window's digits
_DRAW = random.Random()  # seeded again for every draw
_SEED = _random.Random.seed  # what random.Random.seed(an int) calls (its wrapper only adds type checks)
_TWOPI = 2.0 * math.pi
_UNDRAWN = float("nan")
_UNDRAWN_BLOCK = array("d", [_UNDRAWN]) * 1024  # windows added to a pool's draws at a time


def score_noise(seed: int, key: str, t: float) -> float:
    """The derived score's noise for ``key`` in the 10-minute window holding ``t`` (seeded, stable):
    ``random.Random(crc32(f"{seed}/{key}/{window}")).gauss(0.0, SCORE_NOISE)``, computed as gauss
    computes its first value, from one reseeded generator (a draw per pool and window was a fifth of
    a long run's CPU)."""
    window = int(t // SCORE_WINDOW_S)
    drawn = _NOISE.get((seed, key))
    if drawn is None:
        if any(s != seed for s, _ in _NOISE):
            _NOISE.clear()
            _PREFIX.clear()
        drawn = _NOISE[(seed, key)] = array("d")
        _PREFIX[(seed, key)] = zlib.crc32(f"{seed}/{key}/".encode())
    while window >= len(drawn):  # (from an array of NaNs: a copy, not 1,024 floats boxed in a list)
        drawn.extend(_UNDRAWN_BLOCK)
    found = drawn[window] if window >= 0 else _UNDRAWN
    if found != found:  # NaN: draw it
        _SEED(_DRAW, zlib.crc32(b"%d" % window, _PREFIX[(seed, key)]))
        r = _DRAW.random
        x2pi = r() * _TWOPI
        found = 0.0 + math.cos(x2pi) * math.sqrt(-2.0 * math.log(1.0 - r())) * SCORE_NOISE
        if window >= 0:
            drawn[window] = found
    return found


def gang_score(free: int, count: int, seed: int, key: str, t: float) -> float:
    """A coarse spot placement score (1-10) for launching ``count`` nodes where ``free`` are free:
    about 8 when the gang just fits, 10 with a quarter to spare, falling linearly to 1 at none."""
    base = 1.0 + 9.0 * min(1.0, max(0, free) / (1.25 * max(1, count)))
    return float(min(10, max(1, round(base + score_noise(seed, key, t)))))
