"""``spotrelay demo``: the whole system on this machine, interrupted twice and recovered.

Submits the tiny 2-node job by dropping it into the twin's S3, announces a spot interruption on one
node mid-run, later takes a node of the next attempt away without notice, lets the controller
recover both, then checks the final model against an uninterrupted reference run and reports.
``--scenario elastic`` instead takes the capacity for the full gang away at the notice, so the job
trains on fewer nodes and grows back when capacity returns (spotrelay/local/demo_elastic.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.live import Live

from spotrelay.contracts.control import PROGRESS_FILE, read_events
from spotrelay.domain.models import Job, Node
from spotrelay.local import demo_report as report
from spotrelay.local.campaign import _scale_cooldowns as scale_cooldowns
from spotrelay.local.chaos import ChaosDriver, Fired, node_step, places_of
from spotrelay.local.code_delivery import deliver_script_dir
from spotrelay.local.compute import LocalInstance
from spotrelay.local.demo_elastic import ELASTIC_STEPS, SMALL_REFERENCE, ElasticScript, elastic_spec
from spotrelay.local.demo_summary import RESULT, print_summary, summarize
from spotrelay.local.demo_view import EventLog, render
from spotrelay.local.dispatcher import Delivery
from spotrelay.local.market import ChaosAction, MarketModel
from spotrelay.local.reference import start_reference
from spotrelay.local.twin import Twin, TwinOptions
from spotrelay.local.twinlog import quiet_logs
from spotrelay.spec.load import parse_spec, read_spec_file
from spotrelay.spec.models import JobSpec

ENSURE_EXPERIMENT = (
    "import sys, pathlib; from spotrelay.local.demo_report import ensure_experiment as e; "
    "e(sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]))"
)


SCENARIOS = ("interrupt", "elastic")


@dataclass
class DemoOptions:
    out: Path = Path("demo-out")
    json_path: Path | None = None
    spec: Path = Path("examples/tiny.yaml")
    live: bool = True
    # enough that attempt 1 trains through the whole notice window and attempt 2 runs on (None: 200; the
    # elastic scenario's default is demo_elastic.ELASTIC_STEPS)
    steps: int | None = None
    notice_step: int = 20  # spot notice on rank 1 when attempt 1 reaches this step
    kill_after_steps: int = 25  # rank 0 of attempt 2 vanishes this many steps after attempt 2 resumed
    step_sleep_s: float = 0.25  # pace training so the faults land mid-run and a human can follow
    timeout_s: float = 900.0  # from the submission to a terminal status (about 4 min on a quiet machine)
    boot_s: float = 300.0  # modeled boot time of a GPU instance
    time_scale: float = 0.01
    notice_window_s: float = 30.0
    s3_mb_s: float | None = 0.5  # the nodes' S3 through a bandwidth throttle (None: full speed)
    reference: bool = True
    spares: int | None = None  # resources.spares for the job (None: the example's own)
    scenario: str = "interrupt"  # interrupt: a notice, then a node lost | elastic: shrink, then grow back
    grow_after_steps: int = 25  # elastic: capacity returns this many steps after the smaller gang resumed


def clear_out(out: Path) -> None:
    """``out`` made an empty folder: a new one, an empty one, or a previous demo's (it holds that demo's
    twin.log), emptied. Anything else is refused (ValueError): a mistyped --out never deletes files."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: is a file, not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / "twin.log").is_file():
            raise ValueError(f"--out {out}: holds files that are not a demo's output; name a new or empty folder")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def prepare_spec(path: Path, out: Path, step_sleep_s: float, steps: int | None = None,
                 spares: int | None = None, elastic: bool = False) -> tuple[str, JobSpec, str]:
    """The example spec with the demo's pacing and length, per-node results and the local MLflow store:
    its text, that text parsed, and the store's URI."""
    body = read_spec_file(path)  # (bounded; unreadable or not UTF-8: one line naming the file, cli/errors.py)
    parse_spec(body, source=str(path))  # the file as written is a spec (SpecError names its fields)
    text = body.decode("utf-8-sig")
    data = yaml.safe_load(text)
    if elastic:
        data = elastic_spec(data)
    if spares is not None:
        data["resources"]["spares"] = spares
    args = [a for a in data["entrypoint"].get("args", [])]
    args += ["--step-sleep", str(step_sleep_s), "--out", RESULT] + (["--steps", str(steps)] if steps else [])
    data["entrypoint"]["args"] = args
    uri = f"sqlite:///{(out / 'mlflow.db').resolve()}"
    data.setdefault("tracking", {})["tracking_uri"] = uri
    text = yaml.safe_dump(data, sort_keys=False)
    spec = parse_spec(text, source=str(path))  # fail here, not in the twin, if the example is broken
    return text, spec, uri


class Recorder:
    """Everything the demo watches, for the live view and the report."""

    def __init__(self, twin: Twin, log: EventLog, on_resumed: Callable[[int, int], None] | None = None) -> None:
        self.twin, self.log = twin, log
        self.on_resumed = on_resumed  # (attempt, step) the first time a node of that attempt resumed
        self.faults: list[report.Fault] = []
        self.job: Job | None = None
        self.nodes: list[Node] = []
        self.steps: dict[str, int | None] = {}
        self._status: str | None = None
        self._resumed: dict[str, tuple[int, int]] = {}  # instance -> (attempt, step) of its newest resume
        self._resumes_seen: dict[str, int] = {}

    def on_delivery(self, d: Delivery) -> None:
        what = d.detail_type or "schedule"
        kind = d.detail.get("kind") if isinstance(d.detail, dict) else None
        if kind == "Heartbeat" or (what == "Scheduled Event" and not d.error):
            return  # routine: heartbeats and quiet reconcile ticks
        label = f"{d.function.removeprefix('spotrelay-')} <- {kind or what}"
        self.log.add(label + (f"  [{d.error}]" if d.error else ""), "red" if d.error else "")

    def on_ec2(self, detail_type: str, detail: dict[str, object]) -> None:
        extra = f" {detail.get('state')}" if "state" in detail else ""
        self.log.add(f"EC2 {detail_type.removeprefix('EC2 ')} {detail.get('instance-id')}{extra}", "yellow")

    def on_fault(self, f: Fired) -> None:
        kind = "spot-notice" if f.kind == "interrupt" else "node-lost"
        attempt = int(f.node[1:].split("-")[0])
        self.faults.append(report.Fault(kind, f.time, f.node, f.instance_id, f.step, attempt))
        self.log.add(f"CHAOS {kind} on {f.node} ({f.instance_id}) at step {f.step}", "bold red")

    def poll(self, key: str) -> None:
        from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore

        if self.job is None:
            self.job = self.twin.job_for_key(key)
        else:
            self.job = DynamoDBJobStore().find_job(self.job.job_id) or self.job
        if self.job is None:
            return
        self.nodes = DynamoDBJobStore().nodes_of(self.job.job_id)
        if self.job.status.value != self._status:
            self._status = self.job.status.value
            self.log.add(f"job {self._status} (attempt {self.job.attempt})", "bold cyan")
        assert self.twin.compute is not None
        for li in self.twin.compute.instances():
            if li.alive and li.booted_at is not None:
                self.steps[li.instance.instance_id] = node_step(li)
            self._watch_resume(li)

    def _watch_resume(self, li: LocalInstance) -> None:
        """Close a fault when a later attempt has finished a step after resuming. An instance serves
        the attempt its newest node record says (a survivor or a promoted spare outlives its launch
        attempt); only a resume seen in that attempt counts."""
        iid = li.instance.instance_id
        attempt, rank = places_of(self.nodes).get(iid, (li.instance.attempt or 0, li.instance.rank))
        events, _ = read_events(li.work_dir / "control")
        resumed = [e for e in events if e.kind == "resumed"]
        if len(resumed) > self._resumes_seen.get(iid, 0):
            self._resumes_seen[iid] = len(resumed)
            self._resumed[iid] = (attempt, resumed[-1].step)
            self.log.add(f"a{attempt}-r{rank} resumed from step {resumed[-1].step}", "green")
            if self.on_resumed is not None and rank == 0:
                self.on_resumed(attempt, resumed[-1].step)
        step = self.steps.get(iid)
        seen = self._resumed.get(iid)
        for fault in self.faults:
            if fault.resumed_at is None and attempt > fault.attempt and step is not None:
                if seen is None or seen[0] != attempt or step <= seen[1]:
                    continue  # not restarted in this attempt yet, or no step finished since
                fault.resumed_at = _progress_time(li)  # when that step was written, not when we looked
                fault.resumed_from_step = seen[1]


def run_demo(opts: DemoOptions) -> report.Summary:
    out = opts.out
    elastic = opts.scenario == "elastic"
    steps = opts.steps or (ELASTIC_STEPS if elastic else 200)
    # the spec and the folder are judged first, while errors still reach the terminal and nothing is removed
    spec_text, spec, tracking_uri = prepare_spec(opts.spec, out, opts.step_sleep_s, steps, opts.spares, elastic)
    clear_out(out)
    console = Console(file=quiet_logs(out / "twin.log"))
    experiment = spec.tracking.mlflow_experiment or "spotrelay"
    market = MarketModel(
        regions=spec.resources.regions,
        boot_time_s=opts.boot_s,
        time_scale=opts.time_scale,
        notice_window_s=opts.notice_window_s,
        chaos=[ChaosAction("interrupt", "1", at_step=opts.notice_step, attempt=1)],
    )
    script = ElasticScript(market, spec.resources.nodes, opts.notice_step, opts.grow_after_steps) if elastic else None
    if script is not None:
        market.chaos = script.chaos()

    def kill_later(attempt: int, step: int) -> None:  # the loss lands mid-run whatever step attempt 2 resumed at
        if script is not None:
            script.on_resumed(attempt, step, len([n for n in rec.nodes if n.attempt == attempt and not n.spare]))
        elif attempt == 2:
            market.add_chaos(ChaosAction("kill", "0", at_step=step + opts.kill_after_steps, attempt=2))

    t0 = time.time()
    log = EventLog(t0)
    # The three slow starts overlap: the reference run, MLflow's store migrations, the twin.
    ref_proc = start_reference(spec, (out / "reference").resolve(), Path.cwd()) if opts.reference else None
    # elastic: the same run straight through on the smallest gang, for where the two world sizes' own
    # numerics part (demo_elastic.judge)
    small = spec.resources.smallest_gang
    small_proc = start_reference(spec, (out / SMALL_REFERENCE).resolve(), Path.cwd(), small) \
        if opts.reference and elastic and small < spec.resources.nodes else None
    # a process, not a thread: MLflow's first open (SQLite migrations) is slow and would hold our GIL
    mlflow_ready = subprocess.Popen(
        [sys.executable, "-c", ENSURE_EXPERIMENT, tracking_uri, experiment, str(out / "mlartifacts")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ami = (out / "twin" / "ami").resolve()  # nothing baked in: the code is delivered (local/code_delivery.py)
    ami.mkdir(parents=True)
    twin = Twin(TwinOptions(root=(out / "twin").resolve(), market=market, s3_mb_s=opts.s3_mb_s, code_dir=ami)).start()
    assert twin.compute is not None and twin.dispatcher is not None
    _mark(log, "twin up")
    mlflow_ready.wait(120)  # before any agent looks the experiment up
    rec = Recorder(twin, log, kill_later)
    twin.dispatcher.listeners.append(rec.on_delivery)
    twin.bus.listeners.append(rec.on_ec2)
    chaos = ChaosDriver(market, twin.compute, where=lambda: places_of(rec.nodes))
    chaos.listeners.append(rec.on_fault)
    if script is not None:
        chaos.listeners.append(lambda f: script.on_notice(f.time))
    chaos.start()
    spec_text = deliver_script_dir(spec_text, Path.cwd())
    key = twin.submit(spec_text, f"{spec.name}.yaml")
    log.add(f"submitted s3://{twin.env.get('SPOTRELAY_BUCKET', 'spotrelay-jobs')}/{key}")
    live = opts.live and console.is_terminal
    if elastic:  # the outage and its end take a minute here: cooldowns of real minutes would outlast the run
        scale_cooldowns(opts.time_scale)
    try:
        with Live(console=console, refresh_per_second=4, transient=False) if live else _NoLive() as view:
            submitted = time.time()
            printed = 0
            while time.time() - submitted < opts.timeout_s:
                rec.poll(key)
                frame = render(
                    rec.job,
                    rec.nodes,
                    twin.compute.instances(),
                    rec.steps,
                    log,
                    time.time() - t0,
                    "ref run: " + _ref_state(ref_proc),
                )
                view.update(frame)
                if not live:  # no terminal to redraw: one line per event as it happens
                    lines, printed = log.since(printed)
                    for t, text, _ in lines:
                        console.print(f"{t - t0:7.1f}s  {text}", highlight=False, soft_wrap=True)
                if rec.job is not None and rec.job.status.terminal:
                    break
                grown = script.tick(max((s for s in rec.steps.values() if s is not None), default=None),
                                    time.time()) if script is not None else None
                if grown:
                    log.add(grown, "bold yellow")
                time.sleep(0.5)
        if ref_proc is not None:
            _mark(log, "waiting for the reference run")
            _wait(ref_proc, 120)
        if small_proc is not None:
            _wait(small_proc, 120)
        _mark(log, "summarizing")
        summary = summarize(opts, twin, rec, market, spec.resources.nodes, tracking_uri, experiment, t0)
    finally:
        if elastic:
            scale_cooldowns(None)
        chaos.stop()
        twin.stop()
        for proc in (ref_proc, small_proc):
            if proc is not None and proc.poll() is None:
                proc.kill()
    (out / "events.json").write_text(json.dumps(log.all(), indent=1))
    if opts.json_path:
        opts.json_path.parent.mkdir(parents=True, exist_ok=True)
        opts.json_path.write_text(summary.to_json())
    print_summary(console, summary)
    return summary


def _progress_time(li: LocalInstance) -> float:
    try:
        return (li.work_dir / "control" / PROGRESS_FILE).stat().st_mtime
    except OSError:
        return time.time()


def _mark(log: EventLog, what: str) -> None:
    log.add(what, "dim")


class _NoLive:
    def __enter__(self) -> _NoLive:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, _: object) -> None:
        return None


def _ref_state(proc: subprocess.Popen[bytes] | None) -> str:
    if proc is None:
        return "off"
    code = proc.poll()
    return "running" if code is None else f"done ({code})"


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(max(timeout, 1))
    except subprocess.TimeoutExpired:
        proc.kill()
