"""The agent ships complete lines of the training log, keeps them on a failed send, and the rest at the end."""

from __future__ import annotations

from pathlib import Path

from agent.log_shipper import LogShipper


class Sink:
    def __init__(self) -> None:
        self.got: list[tuple[str, int, int, list[str]]] = []
        self.fail = False

    def put(self, job_id: str, attempt: int, rank: int, lines: list[tuple[int, str]]) -> None:
        if self.fail:
            raise RuntimeError("throttled")
        self.got.append((job_id, attempt, rank, [text for _, text in lines]))


def test_complete_lines_then_retry_then_the_partial_tail_at_the_end(tmp_path: Path) -> None:
    log = tmp_path / "train-a2.log"
    log.write_text("from an earlier launch\n")
    sink = Sink()
    shipper = LogShipper(sink, "j-1", 2, 1, log, clock=lambda: 1000.0)
    with log.open("a") as fh:
        fh.write("step 1\nstep 2\npart")
    shipper.ship()
    assert sink.got == [("j-1", 2, 1, ["step 1", "step 2"])]
    sink.fail = True
    with log.open("a") as fh:
        fh.write("ial\n")
    shipper.ship()  # kept for the next try
    sink.fail = False
    shipper.ship()
    with log.open("a") as fh:
        fh.write("Traceback: no newline")
    shipper.ship(final=True)
    assert [lines for *_, lines in sink.got] == [["step 1", "step 2"], ["partial"], ["Traceback: no newline"]]
    assert shipper.shipped == 4


def test_a_missing_log_ships_nothing(tmp_path: Path) -> None:
    sink = Sink()
    LogShipper(sink, "j-1", 1, 0, tmp_path / "none.log").ship(final=True)
    assert sink.got == []
