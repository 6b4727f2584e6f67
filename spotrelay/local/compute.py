"""The twin's Compute adapter: every "instance" is a real local process running the real agent.

Each instance gets its own fake IMDS (instance id, AZ, type, lifecycle, user data, spot notices) and
its own work directory. A launch asks the market model first (capacity errors), then the agent
process starts after the modeled boot time, scaled. Faults behave like EC2's:

- ``interrupt``: the spot notice appears on the node's IMDS and the Spot Interruption Warning goes to
  the bus; when the notice window ends the instance is taken (shut down, state-change events).
- ``kill``: the instance vanishes now (SIGKILL, no notice); only the state-change event tells.
- ``terminate`` (the controller's call): shut down, state-change events, as EC2 reports them too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotrelay.domain.models import Pool
from spotrelay.local.ec2_events import Ec2EventBus
from spotrelay.local.fake_imds import FakeImds
from spotrelay.local.market import MarketModel
from spotrelay.local.motoserver import free_port
from spotrelay.ports.compute import Instance, LaunchRequest

log = logging.getLogger(__name__)


@dataclass
class LocalInstance:
    instance: Instance
    work_dir: Path
    imds: FakeImds
    launched_at: float
    user_data: str = ""
    process: subprocess.Popen[bytes] | None = None
    booted_at: float | None = None
    ended_at: float | None = None
    end_reason: str | None = None  # interrupted | killed | terminated
    notice_at: float | None = None
    timers: list[threading.Timer] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.ended_at is None

    def lifetime(self) -> dict[str, Any]:
        i = self.instance
        return {
            "instance_id": i.instance_id,
            "job_id": i.job_id,
            "attempt": i.attempt,
            "rank": i.rank,
            "pool": i.pool.key,
            "launched_at": self.launched_at,
            "booted_at": self.booted_at,
            "notice_at": self.notice_at,
            "ended_at": self.ended_at,
            "end_reason": self.end_reason,
        }


class LocalCompute:
    """Implements ``spotrelay.ports.compute.Compute`` with local processes."""

    def __init__(
        self,
        market: MarketModel,
        root: Path,
        agent_env: dict[str, str] | None = None,
        agent_cmd: list[str] | None = None,
        bus: Ec2EventBus | None = None,
        code_dir: Path | None = None,
    ) -> None:
        self.market = market
        self.root = root
        self.agent_env = agent_env or {}
        self.agent_cmd = agent_cmd or [_python(), "-m", "agent.main"]
        self.bus = bus or Ec2EventBus()
        self.code_dir = code_dir or Path.cwd()  # where the job's code is "baked into the AMI"
        self._instances: dict[str, LocalInstance] = {}
        self._lock = threading.RLock()
        self._closed = False

    # --- Compute port ------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> list[Instance]:
        with self._lock:  # the pool's instances of every job (survivors included) count against its capacity
            live = sum(1 for li in self._instances.values() if li.alive and li.instance.pool == request.pool)
        self.market.check_capacity(request.pool, request.count, live)  # all or nothing: nothing started yet
        port = free_port()  # one rendezvous port per gang
        launched = []
        for rank in request.ranks[: request.count]:
            launched.append(self._start_instance(request, rank, port))
        return [li.instance for li in launched]

    def expected_boot_s(self, pool: Pool) -> float:
        return self.market.boot_delay_s()  # the modeled boot, scaled as the launches' timers are

    def terminate(self, instance_ids: list[str], region: str) -> None:
        for iid in instance_ids:
            self._end(iid, "terminated", graceful=True)

    def spot_reclaimed(self, instance_id: str, region: str) -> bool:
        """Taken by the market model after a notice; ``kill`` is a crash (an unannounced loss that is
        not EC2's interruption), so the twin's unannounced losses stay billed."""
        with self._lock:
            li = self._instances.get(instance_id)
            return li is not None and li.end_reason == "interrupted"

    def terminate_job(self, job_id: str, regions: list[str]) -> list[str]:
        with self._lock:
            ids = [i for i, li in self._instances.items() if li.alive and li.instance.job_id == job_id]
        self.terminate(ids, "")
        return ids

    def list_tagged(self, regions: list[str]) -> list[Instance]:
        with self._lock:
            return [
                li.instance.model_copy()
                for li in self._instances.values()
                if li.alive and (not regions or li.instance.pool.region in regions)
            ]

    def job_profiles(self, skip: frozenset[str] = frozenset()) -> list[str]:
        return []  # local nodes run as this user: no per-job roles

    def delete_job_profile(self, job_id: str) -> None:
        return None

    # --- faults (the market model, the demo and `spotrelay local interrupt|kill`) ------------
    def interrupt(self, ref: str) -> str:
        """Spot notice now; the instance is taken when the notice window ends."""
        li = self.find(ref)
        notice_at = time.time()
        action_time = notice_at + self.market.notice_window()
        li.notice_at = notice_at
        li.imds.set_interruption(action="terminate", when=action_time)
        self.bus.spot_interruption_warning(li.instance)
        timer = threading.Timer(self.market.notice_window(), self._end, (li.instance.instance_id, "interrupted"))
        timer.daemon = True
        li.timers.append(timer)
        timer.start()
        log.info(
            "spot notice for %s (rank %s), taken in %.0fs",
            li.instance.instance_id,
            li.instance.rank,
            self.market.notice_window(),
        )
        return li.instance.instance_id

    def kill(self, ref: str) -> str:
        """The instance disappears without notice."""
        li = self.find(ref)
        self._end(li.instance.instance_id, "killed", graceful=False)
        return li.instance.instance_id

    def find(self, ref: str) -> LocalInstance:
        """An alive instance by instance id, node id (``a2-r1``) or rank (newest attempt first)."""
        with self._lock:
            alive = sorted(
                (li for li in self._instances.values() if li.alive), key=lambda li: li.launched_at, reverse=True
            )
        for li in alive:
            i = li.instance
            if ref in (i.instance_id, f"a{i.attempt}-r{i.rank}", str(i.rank)):
                return li
        raise KeyError(f"no live instance '{ref}'")

    def instances(self) -> list[LocalInstance]:
        with self._lock:
            return list(self._instances.values())

    def history(self) -> list[dict[str, Any]]:
        return [li.lifetime() for li in self.instances()]

    def close(self) -> None:
        """Take every instance down (twin shutdown); no events."""
        self._closed = True
        for li in self.instances():
            if li.alive:
                self._end(li.instance.instance_id, "terminated", graceful=False, emit=False)

    # --- internals -----------------------------------------------------------------------------
    def _start_instance(self, request: LaunchRequest, rank: int, port: int) -> LocalInstance:
        iid = "i-" + secrets.token_hex(8)[:17]
        work = self.root / "nodes" / f"{request.job_id}-a{request.attempt}-r{rank}-{iid}"
        self._prepare_disk(work)
        inst = Instance(
            instance_id=iid,
            pool=request.pool,
            rank=rank,
            private_ip="127.0.0.1",
            state="pending",
            job_id=request.job_id,
            attempt=request.attempt,
        )
        tags = {
            "spotrelay:job-id": request.job_id,
            "spotrelay:attempt": str(request.attempt),
            "spotrelay:rank": str(rank),
            "spotrelay:nodes": str(request.gang or request.count),
        }
        imds = FakeImds(
            instance_id=iid,
            region=request.pool.region,
            az=request.pool.az,
            instance_type=request.pool.instance_type,
            private_ip="127.0.0.1",
            tags=tags,
            user_data=request.user_data or None,
        ).start()
        li = LocalInstance(
            instance=inst, work_dir=work, imds=imds, launched_at=time.time(), user_data=request.user_data
        )
        with self._lock:
            self._instances[iid] = li
        timer = threading.Timer(self.market.boot_delay_s(), self._boot, (li, request, port))
        timer.daemon = True
        li.timers.append(timer)
        timer.start()
        return li

    def _prepare_disk(self, work: Path) -> None:
        """The node's own disk with the job's code on it, as if baked into the AMI: the top-level
        entries of ``code_dir`` linked in, so relative paths in the spec resolve per node."""
        work.mkdir(parents=True, exist_ok=True)
        root = self.root.resolve()
        for entry in self.code_dir.resolve().iterdir():
            if entry.name.startswith(".") or root.is_relative_to(entry) or entry == root:
                continue
            link = work / entry.name
            if not link.exists():
                link.symlink_to(entry)

    def _boot(self, li: LocalInstance, request: LaunchRequest, port: int) -> None:
        with self._lock:
            if not li.alive or self._closed:
                return
            env = {**os.environ, **self.agent_env, **agent_environment(li, request, port)}
            log_file = open(li.work_dir / "agent.log", "ab")  # noqa: SIM115 - the child owns it
            li.process = subprocess.Popen(
                self.agent_cmd,
                cwd=str(li.work_dir),
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: kill takes torchrun and ranks too
            )
            log_file.close()
            li.booted_at = time.time()
            li.instance.state = "running"

    def _end(self, iid: str, reason: str, graceful: bool = True, emit: bool = True) -> None:
        with self._lock:
            li = self._instances.get(iid)
            if li is None or not li.alive:
                return
            li.ended_at = time.time()
            li.end_reason = reason
            li.instance.state = "terminated"
            for timer in li.timers:
                timer.cancel()
        if emit:
            self.bus.state_change(li.instance, "shutting-down")
        _stop_process(li.process, graceful)
        li.imds.stop()
        if emit:
            self.bus.state_change(li.instance, "terminated")
        log.info("instance %s (rank %s) %s", iid, li.instance.rank, reason)


def agent_environment(li: LocalInstance, request: LaunchRequest, master_port: int) -> dict[str, str]:
    """What a real node learns from tags and user data, plus where its own disks are.

    Every node gets its own work dir and fast checkpoint tier (two "instances" on one machine must
    not share a disk), and the gang one rendezvous port (they share 127.0.0.1).
    """
    i = li.instance
    agent = {
        "job_id": request.job_id,
        "attempt": str(request.attempt),
        "rank": str(i.rank),
        "nodes": str(request.gang or request.count),
        "imds_endpoint": li.imds.url,
        "work_dir": str(li.work_dir),
        "checkpoint_dir": str(li.work_dir / "checkpoints"),
        "master_port": str(master_port),
        "private_ip": "127.0.0.1",
    }
    if request.config_uri:
        agent["config_uri"] = request.config_uri
    return {f"SPOTRELAY_AGENT_{k.upper()}": v for k, v in agent.items()}


def _stop_process(proc: subprocess.Popen[bytes] | None, graceful: bool, grace_s: float = 5.0) -> None:
    """Stop the agent and everything under it (launchers may start their own sessions)."""
    if proc is None or proc.poll() is not None:
        return
    pids = [proc.pid, *_descendants(proc.pid)]
    if graceful:
        _signal(pids, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    _signal([proc.pid, *_descendants(proc.pid), *pids], signal.SIGKILL)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        log.warning("agent %s did not die", proc.pid)


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in dict.fromkeys(pids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _descendants(root: int) -> list[int]:
    """Children, grandchildren, ... of ``root`` from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _python() -> str:
    import sys

    return sys.executable
