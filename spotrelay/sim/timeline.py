"""One run's timeline notes as bars a plot can draw: per pool, when a gang of the job booted there and
when it trained, and the moments the market took a node. Pure: the notes (``Metrics.timeline``:
simulated seconds, pool key, what) in, spans out.

The notes say when a gang launched, when it started training, and when a recovery or a move began;
they do not say when an old gang's last save landed, so a gang's training bar ends where the next
gang starts training (a make-before-break move, launch at notice) or where a recovery begins. At the
scale of a plot (hours) the minutes between are invisible."""

from __future__ import annotations

from dataclasses import dataclass, field

BOOT, TRAIN = "boot", "train"


@dataclass
class Bars:
    spans: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)  # pool -> (start, end, phase)
    losses: list[tuple[float, str]] = field(default_factory=list)  # (t, pool): a notice or a lost node
    end: float = 0.0

    def pools(self) -> list[str]:
        """The pools in the order the job first used them."""
        return list(self.spans)


def bars(timeline: list[tuple[float, str, str]]) -> Bars:
    out = Bars()
    open_: dict[str, tuple[float, str]] = {}  # pool -> (start, phase) of the bar still running

    def close(pool: str, t: float) -> None:
        start, phase = open_.pop(pool)
        if t > start:
            out.spans.setdefault(pool, []).append((start, t, phase))

    def close_all(t: float, keep: str | None = None) -> None:
        for pool in [p for p in open_ if p != keep]:
            close(pool, t)

    for t, pool, what in timeline:
        out.end = max(out.end, t)
        if what.startswith("launch"):
            out.spans.setdefault(pool, [])
            if pool in open_:  # a new gang (or ranks of one) in the same pool: the last bar there ends
                close(pool, t)
            open_[pool] = (t, BOOT)
        elif what.startswith("training from"):
            close_all(t, keep=pool)  # the gang before it stops once this one trains
            if pool in open_:
                close(pool, t)
            open_[pool] = (t, TRAIN)
        elif what.startswith("recover"):
            close_all(t)
            if "lost" in what:
                out.losses.append((t, pool))
        elif what.startswith("notice") or "lost" in what:
            out.losses.append((t, pool))
        elif what == "finished":
            close_all(t)
    close_all(out.end)
    return out
