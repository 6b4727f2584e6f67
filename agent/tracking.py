"""MLflow lineage of a job: one parent run per job, one nested child run per attempt.

Only node rank 0's agent writes. The parent run id lives on the job record (``mlflow_run_id``, which
the controller records from the agent's ``TrackingStarted`` event; a run tagged ``spotrelay.job_id``
is found again if that event was lost); a child is found again by its ``spotrelay.job_id`` and
``spotrelay.attempt`` tags, so a restarted agent does not make a second one.

A job ``spotrelay resume`` started (its spec's ``spotrelay.resumed_run`` tag) continues the stopped
job's parent run: one loss curve across both, the new job's attempts as children named
``attempt-N (JOB)``, its lifecycle metrics at steps after the earlier jobs' attempts (the offset is
kept on the parent as ``spotrelay.attempts_before.JOB``, so a restarted agent finds it again).

- parent: the job's params (once), lifecycle metrics with the attempt as their step (steps lost,
  downtime before the attempt, cost so far, recoveries), the per-step training metrics as one curve
  across attempts, the final manifest as an artifact, the registered model;
- child: where the attempt ran (pool, instance type, nodes), when, how it ended, the step it resumed
  from, its own per-step metrics and each checkpoint's stall and persist time.

Per-step metrics come from rank 0's ``metrics.jsonl`` and are sent in batches (``flush``), so the
training loop never waits for the tracking server. Every call is best effort: MLflow trouble is
logged, never raised.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.reporting import warn
from spotrelay.contracts.agent import RESUMED_RUN_TAG, JobView
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.spec.models import JobSpec

FLUSH_S = 5.0
STEP_METRICS = ("loss", "lr", "grad_norm", "samples_s", "step_s")


class JobTracking:
    def __init__(self, client: Any, run_id: str, attempt: int, clock: Callable[[], float] = time.time) -> None:
        self.client, self.run_id, self.attempt, self.clock = client, run_id, attempt, clock
        self.offset = 0  # attempts earlier jobs logged on this run (a resumed job continues it)
        self.continuing = False
        self.child_id: str | None = None
        self._pending: list[Any] = []
        self._flushed = clock()

    # --- the runs ----------------------------------------------------------------------------------
    @classmethod
    def for_job(cls, config: AgentConfig, job: JobView, spec: JobSpec,
                record_run: Callable[[str], object]) -> JobTracking | None:
        """The job's tracking (None without a tracking URI); ``record_run`` reports a new run id
        (Reporter.tracking_started: the controller writes it on the job record)."""
        uri = spec.tracking.tracking_uri
        if not uri:
            return None
        try:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri)
            run_id = job.mlflow_run_id or cls._continued(client, spec) or cls._find_or_create(client, config, spec)
            if job.mlflow_run_id != run_id:
                record_run(run_id)
            tracking = cls(client, run_id, config.attempt)
            tracking.attempt_started(config, spec, job)
            return tracking
        except Exception as exc:  # tracking must never stop training
            warn("MLflow unavailable; not tracking", error=str(exc))
            return None

    @staticmethod
    def _continued(client: Any, spec: JobSpec) -> str | None:
        """The stopped job's run a resumed one continues, if the tracking server still has it."""
        run_id = spec.tracking.tags.get(RESUMED_RUN_TAG)
        if not run_id:
            return None
        try:
            return str(client.get_run(run_id).info.run_id)
        except Exception as exc:  # another server, or the run was deleted: a run of its own
            warn("the resumed job's run is not on this tracking server; starting a new one", run_id=run_id,
                 error=str(exc))
            return None

    def _attempts_before(self, parent: Any, job_id: str) -> int:
        """0 on the job's own run; on a run it continues, the attempts logged before it first attached."""
        if parent.data.tags.get("spotrelay.job_id") == job_id:
            return 0
        self.continuing = True
        key = f"spotrelay.attempts_before.{job_id}"
        if key in parent.data.tags:
            return int(parent.data.tags[key])
        logged = self.client.get_metric_history(self.run_id, "attempt")
        before = max((int(m.step) for m in logged), default=0)
        self.client.set_tag(self.run_id, key, str(before))
        self.client.set_tag(self.run_id, "spotrelay.continued_by", job_id)
        self._safe(self.client.update_run, self.run_id, status="RUNNING")  # the stopped job's run goes on
        return before

    @staticmethod
    def _find_or_create(client: Any, config: AgentConfig, spec: JobSpec) -> str:
        name = spec.tracking.mlflow_experiment or "spotrelay"
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        found = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`spotrelay.job_id` = '{config.job_id}' and tags.`spotrelay.role` = 'job'",
            max_results=1,
        )
        if found:
            return str(found[0].info.run_id)
        tags = {**spec.tracking.tags, "spotrelay.job_id": config.job_id, "spotrelay.role": "job",
                "mlflow.runName": spec.name}  # fmt: skip
        return str(client.create_run(experiment_id, tags=tags).info.run_id)

    def attempt_started(self, config: AgentConfig, spec: JobSpec, job: JobView | None = None) -> None:
        """Parent params (once) and lifecycle metrics; this attempt's child run."""
        self.attempt = config.attempt
        parent = self.client.get_run(self.run_id)
        self.offset = self._attempts_before(parent, config.job_id)
        params = {"job_id": config.job_id, "nodes": spec.resources.nodes, "launcher": spec.launcher.type,
                  "gpus_per_node": spec.resources.gpus_per_node,
                  "checkpoint_every_steps": spec.checkpoint.every_steps,
                  "checkpoint_every_minutes": spec.checkpoint.every_minutes}  # a number or "auto"  # fmt: skip
        for key, value in params.items():
            if key not in parent.data.params:
                self.client.log_param(self.run_id, key, value)
        self.client.set_tag(self.run_id, "spotrelay.attempt", str(config.attempt))
        self.client.log_metric(self.run_id, "attempt", config.attempt, step=self.step)
        if job is not None:
            self._lifecycle(job)
        self.child_id = self._child(config, parent.info.experiment_id, job)
        self._close_orphans(parent.info.experiment_id, config.job_id, job)

    def _lifecycle(self, job: JobView) -> None:
        now = self.clock()
        previous = [a for a in job.attempts if a.number < self.attempt and a.ended_at]
        values = {"steps_lost": job.steps_lost, "cost_so_far": job.cost_so_far, "recoveries": job.recoveries}
        if previous:
            values["downtime_s"] = max(0.0, now - max(a.ended_at or 0.0 for a in previous))
        for key, value in values.items():
            self._safe(self.client.log_metric, self.run_id, key, float(value), step=self.step)

    @property
    def step(self) -> int:
        """The step of the parent's lifecycle metrics: this attempt, after earlier jobs' (resumed)."""
        return self.offset + self.attempt

    def _child(self, config: AgentConfig, experiment_id: str, job: JobView | None) -> str:
        mine = (f"tags.`mlflow.parentRunId` = '{self.run_id}' and tags.`spotrelay.attempt` = '{self.attempt}' "
                f"and tags.`spotrelay.job_id` = '{config.job_id}'")
        found = self.client.search_runs([experiment_id], filter_string=mine, max_results=1)
        if found:
            return str(found[0].info.run_id)
        record = next((a for a in (job.attempts if job else []) if a.number == self.attempt), None)
        pool = record.pool if record is not None else None
        name = f"attempt-{self.attempt}" + (f" ({config.job_id})" if self.continuing else "")
        tags = {"mlflow.parentRunId": self.run_id, "mlflow.runName": name,
                "spotrelay.job_id": config.job_id, "spotrelay.role": "attempt", "spotrelay.attempt": str(self.attempt),
                "spotrelay.instance_type": config.instance_type or (pool.instance_type if pool else ""),
                "spotrelay.pool": pool.key if pool else f"{config.region or '?'}/{config.az or '?'}"}  # fmt: skip
        child = str(self.client.create_run(experiment_id, tags=tags).info.run_id)
        params = {"attempt": self.attempt, "nodes": config.nodes or (record.nodes if record else ""),
                  "instance_type": tags["spotrelay.instance_type"], "pool": tags["spotrelay.pool"],
                  "market": pool.market if pool else "", "started_at": round(self.clock(), 3)}  # fmt: skip
        for key, value in params.items():
            self._safe(self.client.log_param, child, key, value)
        return child

    def _close_orphans(self, experiment_id: str, job_id: str, job: JobView | None) -> None:
        """End earlier attempts' runs still RUNNING: their rank 0 was lost before it could report, so
        the next attempt's agent closes them (KILLED, with the reason the controller recorded)."""
        try:
            stale = self.client.search_runs(
                [experiment_id],
                filter_string=f"tags.`mlflow.parentRunId` = '{self.run_id}' and attributes.status = 'RUNNING' "
                              f"and tags.`spotrelay.job_id` = '{job_id}'",  # (a continued run: this job's)
            )
        except Exception as exc:
            warn("MLflow search failed", error=str(exc))
            return
        records = {a.number: a for a in (job.attempts if job else [])}
        for run in stale:
            number = int(run.data.tags.get("spotrelay.attempt", "0") or 0)
            if run.info.run_id == self.child_id or not 0 < number < self.attempt:
                continue
            record = records.get(number)
            why = (record.end_reason if record and record.end_reason else "node-lost") + " (closed by a later attempt)"
            end_ms = int(record.ended_at * 1000) if record and record.ended_at else None
            self._safe(self.client.set_tag, run.info.run_id, "spotrelay.end_reason", why)
            self._safe(self.client.set_terminated, run.info.run_id, "KILLED", end_ms)

    # --- during the attempt ------------------------------------------------------------------------
    def resumed(self, step: int) -> None:
        if self.child_id:
            self._safe(self.client.set_tag, self.child_id, "spotrelay.resumed_from_step", str(step))
            self._safe(self.client.log_metric, self.child_id, "resumed_from_step", step, step=step)

    def add_metrics(self, rows: list[dict[str, float]]) -> None:
        """Per-step rows from rank 0 (step, loss, lr, grad_norm, samples_s, step_s); sent by ``flush``."""
        from mlflow.entities import Metric

        ms = int(self.clock() * 1000)
        for row in rows:
            step = int(row.get("step", 0))
            self._pending += [Metric(key, float(row[key]), ms, step) for key in STEP_METRICS if key in row]
        if self.clock() - self._flushed >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        self._flush(self.child_id)

    def _flush(self, child: str | None) -> None:
        pending, self._pending, self._flushed = self._pending, [], self.clock()
        for start in range(0, len(pending), 1000):  # MLflow takes at most 1000 metrics per batch
            chunk = pending[start : start + 1000]
            for run in filter(None, (child, self.run_id)):  # the parent holds the curve across attempts
                self._safe(self.client.log_batch, run, metrics=chunk)

    def checkpoint(self, step: int, duration_s: float, emergency: bool, stall_s: float | None = None) -> None:
        for run in filter(None, (self.child_id, self.run_id)):
            self._safe(self.client.log_metric, run, "checkpoint_persist_s", duration_s, step=step)
            if stall_s is not None:
                self._safe(self.client.log_metric, run, "checkpoint_stall_s", stall_s, step=step)
        if emergency:
            self._safe(self.client.log_metric, self.run_id, "emergency_checkpoint_step", step, step=self.step)

    # --- the end -----------------------------------------------------------------------------------
    def attempt_ended(self, exit_code: int, last_committed_step: int | None, reason: str = "",
                      manifest: Path | None = None, final_uri: str | None = None,
                      register_model: str | None = None) -> None:  # fmt: skip
        # this attempt's run and step, read first: past end_within's bound the agent may go on to the
        # next attempt (a survivor) and open its child while these calls still wait for the server
        child, step, ended_at = self.child_id, self.step, round(self.clock(), 3)
        self._flush(child)
        self._safe(self.client.log_metric, self.run_id, "exit_code", exit_code, step=step)
        if last_committed_step is not None:
            self._safe(self.client.log_metric, self.run_id, "last_committed_step", last_committed_step,
                       step=step)  # fmt: skip
        if child:
            why = reason or ExitCode.describe(exit_code)
            self._safe(self.client.set_tag, child, "spotrelay.end_reason", why)
            self._safe(self.client.log_param, child, "ended_at", ended_at)
            status = "FINISHED" if exit_code == 0 else "KILLED" if exit_code in (75, 76, 78) else "FAILED"
            self._safe(self.client.set_terminated, child, status)
        if exit_code != 0:
            return
        if manifest is not None and manifest.is_file():
            self._safe(self.client.log_artifact, self.run_id, str(manifest), "final-checkpoint")
        if register_model and final_uri:
            self._register(register_model, final_uri)
        self._safe(self.client.set_terminated, self.run_id, "FINISHED")

    def end_within(self, bound_s: float, *args: Any, **kwargs: Any) -> bool:
        """``attempt_ended`` before the exit is reported, waiting at most ``bound_s``: the controller may
        terminate this instance once it hears the exit (a drained rank, a finished job's teardown), and a
        slow or unreachable server (MLflow's client retries for minutes) must not hold the node, billed.
        False when the bound ran out: the call goes on in a daemon thread while the node lives."""
        done = threading.Thread(target=self.attempt_ended, args=args, kwargs=kwargs, daemon=True,
                                name="mlflow-attempt-end")
        done.start()
        done.join(bound_s)
        return not done.is_alive()

    def _register(self, name: str, source: str) -> None:
        """A model version whose source is the final checkpoint (its manifest lists the files)."""
        try:
            try:
                self.client.create_registered_model(name)
            except Exception as exc:
                if "RESOURCE_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                    raise
            self.client.create_model_version(name, source, run_id=self.run_id)
        except Exception as exc:
            warn("model registration failed", name=name, error=str(exc))

    @staticmethod
    def _safe(call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            call(*args, **kwargs)
        except Exception as exc:
            warn("MLflow call failed", call=getattr(call, "__name__", "?"), error=str(exc))
