"""Training logs from the nodes' work directories (the local twin: ``<root>/nodes/<job>-a<A>-r<R>-<id>/``)."""

from __future__ import annotations

import re
from pathlib import Path

from spotrelay.ports.logs import LogStream

_NODE_DIR = re.compile(r"^(?P<job>.+)-a(?P<attempt>\d+)-r(?P<rank>\d+)-i-[0-9a-f]+$")


class FileTrainingLogs:
    def __init__(self, root: Path) -> None:
        self.root = root

    def streams(self, job_id: str) -> list[LogStream]:
        found = []
        for node_dir in (self.root / "nodes").glob(f"{job_id}-a*-r*-i-*"):
            match = _NODE_DIR.match(node_dir.name)
            if match is None or match["job"] != job_id:
                continue
            attempt, rank = int(match["attempt"]), int(match["rank"])
            log = node_dir / f"train-a{attempt}.log"
            found.append(LogStream(attempt, rank, str(log)))
        return sorted(found, key=lambda s: (s.attempt, s.rank))

    def read(self, stream: LogStream, cursor: str | None = None) -> tuple[list[str], str | None]:
        offset = int(cursor or 0)
        try:
            with open(stream.name, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except FileNotFoundError:
            return [], cursor
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next read
        lines = complete.decode(errors="replace").splitlines()
        return lines, str(offset + len(complete))
