"""``spotrelay local ...`` (the twin as a long-running service) and ``spotrelay demo``.

Wired into the main app as ``app.add_typer(local_app, name="local")`` and ``app.command("demo")(demo)``.
"""

from __future__ import annotations

import fnmatch
import json
import signal
import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from spotrelay.cli.common import given_path, number_option
from spotrelay.cli.errors import SpotrelayGroup, UsageProblem, check_folder, check_writable
from spotrelay.cli.tables import show
from spotrelay.errors import SpotrelayError

local_app = typer.Typer(
    help="Run the whole system on this machine (the local twin) and inject faults.",
    no_args_is_help=True,
    cls=SpotrelayGroup,  # the same one-line errors when invoked on its own
)
out = Console()

StateOpt = Annotated[Path, typer.Option("--state", help="the twin's state file (written by `local up`)")]


def _check_pool_glob(glob: str, regions: list[str]) -> None:
    """A pool glob that can match a pool of the twin: one of the catalog's there (``*`` does), or any
    REGION/AZ/TYPE/MARKET (a spec may name a type the catalog has not). UsageProblem otherwise."""
    from spotrelay.placement import catalog

    pools = catalog.pools(regions, catalog.instance_types(), ["spot", "on-demand"])
    if any(fnmatch.fnmatch(p.key, glob) for p in pools):
        return
    parts = glob.split("/")
    if len(parts) == 4 and any(fnmatch.fnmatch(m, parts[3]) for m in ("spot", "on-demand")):
        return
    raise UsageProblem(f"--capacity-error {glob!r}: matches no pool; a pool is REGION/AZ/TYPE/MARKET, e.g. "
                       "'us-east-1/*/p5.48xlarge/spot'")


@local_app.command()
def up(
    work_dir: Annotated[Path, typer.Option("--dir", help="node work dirs and logs")] = Path(".cache/twin"),
    trace: Annotated[bool, typer.Option(help="interrupt spot nodes as the bamboo g4dn trace did")] = False,
    speedup: Annotated[float, typer.Option(
        **number_option(0, 1e6, above=True), help="trace seconds per twin second")] = 600.0,
    capacity_error: Annotated[
        list[str] | None,
        typer.Option(
            "--capacity-error", help="pool glob that fails its next launch, e.g. 'us-east-1/*/p5.48xlarge/spot'"
        ),
    ] = None,
    boot_s: Annotated[float, typer.Option(**number_option(0, 86400), help="modeled boot time, seconds")] = 300.0,
    time_scale: Annotated[float, typer.Option(
        **number_option(0, 1, above=True), help="twin seconds per modeled second: boots, Plan's waits")] = 0.01,
    notice_s: Annotated[float, typer.Option(
        **number_option(0, 120, above=True), help="twin seconds from a spot notice to the reclaim")] = 30.0,
    s3_mb_s: Annotated[float, typer.Option(
        **number_option(0, 1e6), help="the nodes' S3 bandwidth, MB/s (0: unthrottled)")] = 0.0,
    write_config: Annotated[bool, typer.Option(help="write ./.spotrelay.toml for the CLI")] = True,
    state: StateOpt = Path(".spotrelay-twin.json"),
) -> None:
    """Start the twin and keep it running; print the environment that points the CLI at it."""
    from spotrelay.cli import config
    from spotrelay.local.chaos import ChaosDriver
    from spotrelay.local.control import ENV_URL, ControlServer, write_state
    from spotrelay.local.market import CapacityRule, MarketModel
    from spotrelay.local.twin import Twin, TwinOptions
    from spotrelay.local.twinlog import quiet_logs

    check_writable(state, "--state")  # refused now, not after the twin started
    regions = ["us-east-1", "us-west-2"]
    for glob in capacity_error or []:  # (a typo matched no pool: the twin ran without the fault, silently)
        _check_pool_glob(glob, regions)
    check_folder(work_dir, "--dir")  # (the last check: it makes the folder)
    market = MarketModel(
        regions=regions,
        boot_time_s=boot_s,
        time_scale=time_scale,
        notice_window_s=notice_s,
        capacity=[CapacityRule(p) for p in capacity_error or []],
    )
    if trace:
        market.use_trace(speedup=speedup)
    term = Console(file=quiet_logs(work_dir / "twin.log"))
    twin = Twin(TwinOptions(root=work_dir.resolve(), market=market, s3_mb_s=s3_mb_s or None)).start()
    assert twin.compute is not None
    control = ControlServer(twin.compute, twin.env).start()
    chaos = ChaosDriver(market, twin.compute).start()
    env = {**twin.env, ENV_URL: control.url}
    write_state(state, control.url, env)
    cfg = Path(".spotrelay.toml")
    write_config = write_config and config.twins_file(cfg)  # (a user's own file stays as it is)
    if write_config:
        config.write_file(cfg, {k: env[v] for k, v in config.KEYS.items() if env.get(v)}, header=config.TWIN_MARK)
    term.print(f"[green]twin up[/] (moto at {twin.env['AWS_ENDPOINT_URL']}); logs in {work_dir}/twin.log")
    term.print("# point the CLI at it (or use ./.spotrelay.toml, written now):" if write_config else
               "# point the CLI at it with these (./.spotrelay.toml is your own: left as it is; the "
               "environment wins over it):")
    for key, value in sorted(env.items()):
        term.print(f"export {key}={value}", highlight=False, soft_wrap=True)
    term.print(
        "# then: spotrelay submit examples/tiny.yaml; spotrelay jobs; spotrelay local nodes; "
        "spotrelay local interrupt 1. Ctrl-C stops the twin."
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        chaos.stop()
        control.stop()
        twin.stop()
        state.unlink(missing_ok=True)
        if write_config and config.twins_file(cfg):
            cfg.unlink(missing_ok=True)
        term.print("twin stopped")


def _call(method: str, path: str, state: Path) -> tuple[int, dict[str, Any]]:
    """Ask the running twin; a missing state file is a usage error, a twin that does not answer
    (stopped, with its state file left behind) a runtime one."""
    import requests

    from spotrelay.local.control import call, control_url

    try:
        url = control_url(state)
    except RuntimeError as exc:
        raise UsageProblem(str(exc)) from exc
    try:
        return call(method, path, state)
    except (requests.RequestException, ValueError) as exc:
        raise SpotrelayError(
            f"the twin at {url} does not answer ({type(exc).__name__}); if it stopped, delete the stale "
            f"{state} and start it again with `spotrelay local up`"
        ) from exc


def _fault(kind: str, node: str, state: Path) -> None:
    status, body = _call("POST", f"/{kind}/{node}", state)
    if status != 200:
        raise SpotrelayError(str(body.get("error")))
    out.print(f"{kind}: {body['instance_id']}")


@local_app.command()
def interrupt(
    node: Annotated[str, typer.Argument(help="rank, node id (a1-r0) or instance id")],
    state: StateOpt = Path(".spotrelay-twin.json"),
) -> None:
    """Announce a spot interruption on a node (IMDS notice + EventBridge warning); it is reclaimed
    when the notice window ends."""
    _fault("interrupt", node, state)


@local_app.command()
def kill(
    node: Annotated[str, typer.Argument(help="rank, node id (a1-r0) or instance id")],
    state: StateOpt = Path(".spotrelay-twin.json"),
) -> None:
    """Take a node away without notice (only the EC2 state-change event tells)."""
    _fault("kill", node, state)


@local_app.command()
def nodes(state: StateOpt = Path(".spotrelay-twin.json"), as_json: bool = typer.Option(False, "--json")) -> None:
    """The twin's instances: live and gone."""
    _, body = _call("GET", "/nodes", state)
    if as_json:
        out.print_json(json.dumps(body["nodes"]))
        return
    rows = [[n["instance_id"], n["job_id"], f"a{n['attempt']}-r{n['rank']}", n["pool"],
             n["end_reason"] or ("running" if n["booted_at"] else "booting")] for n in body["nodes"]]
    show(out, ("instance", "job", "node", "pool", "state"), rows)


def demo(
    out_dir: Annotated[Path, typer.Option("--out", help="where the timeline, logs and MLflow store go")] = Path(
        "demo-out"
    ),
    json_file: Annotated[Path | None, typer.Option("--json", help="write the summary as JSON here")] = None,
    spec: Annotated[Path, typer.Option(parser=given_path, help="the job to run")] = Path("examples/tiny.yaml"),
    live: Annotated[bool, typer.Option(help="live Rich view (off: one line per change)")] = True,
    s3_mb_s: Annotated[float, typer.Option(
        **number_option(0, 1e6), help="the nodes' S3 bandwidth, MB/s (0: unthrottled)")] = 0.5,
    timeout_s: Annotated[float, typer.Option(
        **number_option(0, 86400, above=True), help="seconds from the submission to a finished job")] = 900.0,
    spares: Annotated[int | None, typer.Option(min=0, max=4, help="hot spares booted with the gang")] = None,
    scenario: Annotated[str, typer.Option(
        help="interrupt: a spot notice, then a node lost without notice; elastic: the capacity for the full "
             "gang disappears at the notice, the job trains on fewer nodes and grows back when it returns")
    ] = "interrupt",
) -> None:
    """Run the whole system on this machine: submit a 2-node job, interrupt it with a spot notice,
    lose a node without notice, recover both, and check the result against an uninterrupted run."""
    from spotrelay.local.demo import SCENARIOS, DemoOptions, run_demo

    if scenario not in SCENARIOS:
        raise typer.BadParameter(f"{scenario!r} is not one of {', '.join(SCENARIOS)}", param_hint="--scenario")
    if json_file is not None:  # refused now, not after the demo's minutes
        check_writable(json_file, "--json")
    opts = DemoOptions(
        out=out_dir, json_path=json_file, spec=spec, live=live, s3_mb_s=s3_mb_s or None, timeout_s=timeout_s,
        spares=spares, scenario=scenario,
    )
    summary = run_demo(opts)
    raise typer.Exit(0 if summary.ok else 1)


@local_app.command()
def chaos(
    jobs: Annotated[int, typer.Option("--jobs", help="how many jobs to run")] = 4,
    seed: Annotated[int, typer.Option("--seed", help="draws the faults, their targets and their times")] = 1,
    faults: Annotated[str, typer.Option("--faults", help="comma list of fault kinds (default: all)")] = "",
    max_faults: Annotated[int | None, typer.Option("--max-faults", help="stop injecting after this many")] = None,
    parallel: Annotated[int, typer.Option("--parallel", help="jobs training at once")] = 2,
    steps: Annotated[int, typer.Option("--steps", help="training steps per job")] = 40,
    job_timeout: Annotated[float, typer.Option("--job-timeout", help="seconds after its submission a job not "
                                               "ended counts as stuck")] = 600.0,
    out_dir: Annotated[Path, typer.Option("--out", help="the twin's and the reference's files")] = Path("chaos-out"),
    json_file: Annotated[Path | None, typer.Option("--json", help="write the result as JSON here")] = None,
) -> None:
    """Run JOBS jobs in the twin under faults drawn from SEED; exit 1 unless nothing got stuck, no
    checkpoint was lost, no cluster was launched twice, nothing was left running and every
    succeeded job's model is bit-identical to an uninterrupted run (docs/chaos.md)."""
    from spotrelay.local.campaign import CampaignOptions, run_campaign, write_json
    from spotrelay.local.faults import KINDS
    from spotrelay.local.twinlog import quiet_logs

    kinds = tuple(k.strip() for k in faults.split(",") if k.strip())
    if faults.strip() and not kinds:
        raise UsageProblem(f"--faults {faults!r} names no fault kind; known: {', '.join(KINDS)}")
    kinds = kinds or KINDS
    try:
        options = CampaignOptions(jobs=jobs, seed=seed, faults=kinds, max_faults=max_faults, parallel=parallel,
                                  steps=steps, job_timeout_s=job_timeout, out=out_dir)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from exc
    # refused now, not after a campaign of half an hour whose result would have nowhere to go
    check_folder(out_dir, "--out")
    check_writable(out_dir / "twin.log", "--out")
    (out_dir / "twin.log").touch()  # the campaign's log, empty until a twin starts (as before the check)
    if json_file:
        check_writable(json_file, "--json")
    term = Console(file=quiet_logs(out_dir / "twin.log"), width=150)  # the twin's own logs go to the file
    result = run_campaign(options, on_line=lambda line: term.print(line, highlight=False))
    if json_file:
        write_json(result, json_file)
    show(term, ("job", "status", "attempts", "spot wait", "plan waits", "faults", "resumed from", "lost",
                "bit-identical", "reason"),
         [[r["name"], r["status"], str(r["attempts"]), r["spot_wait"], str(r["plan_waits"]),
           ",".join(r["faults"]) or "-", ",".join(map(str, r["resumed_from"])) or "-", str(r["checkpoints_lost"]),
           {True: "yes", False: "NO", None: "-"}[r["bit_identical"]], r["reason"][:60]] for r in result["records"]],
         title=f"chaos campaign, seed {seed}")
    keys = ("jobs", "succeeded", "failed", "stuck", "faults", "checkpoints_lost", "duplicate_clusters",
            "instances_left", "bit_identical", "plan_waits")
    term.print("  ".join(f"{k}={result[k]}" for k in keys) + f"  wall={result['wall_s']}s", highlight=False)
    for kind, d in result["downtime_s_by_kind"].items():
        term.print(f"downtime {kind}: mean {d['mean']} s, max {d['max']} s over {d['n']}", highlight=False)
    ok = (result["stuck"] == 0 and result["checkpoints_lost"] == 0 and result["duplicate_clusters"] == 0
          and result["instances_left"] == 0 and result["bit_identical"] == result["succeeded"]
          and result["failed_without_reason"] == 0)
    raise typer.Exit(0 if ok else 1)
