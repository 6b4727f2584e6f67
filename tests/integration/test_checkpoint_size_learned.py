"""The controller learns a job's checkpoint size from the rank that committed it (CheckpointCommitted's
``total_bytes``) and placement weighs sending it between regions without the team stating it
(services/controller.spec_of, placement/policy.checkpoint_home; docs/placement.md)."""

from __future__ import annotations

from functions import on_agent_event
from spotrelay.services.controller import spec_of
from spotrelay.settings import settings
from tests.integration.controller_doubles import Env, agent_event, ctx, env, running_job

__all__ = ["env"]

TB = 1_120_000_000_000


def test_the_committing_ranks_size_is_kept_whoever_reports_first(env: Env) -> None:
    job, gang = running_job(env.store, env.compute)
    assert spec_of(job).checkpoint.size_gb is None  # nothing learned, nothing stated: nothing weighed
    on_agent_event.handler(agent_event("CheckpointCommitted", gang[1], step=50, duration_s=4.7, emergency=False,
                                       total_bytes=None), ctx())
    assert env.store.get_job(job.job_id).checkpoint_bytes is None  # (another node's rank: no size)
    on_agent_event.handler(agent_event("CheckpointCommitted", gang[0], step=50, duration_s=4.5, emergency=False,
                                       total_bytes=TB), ctx())
    learned = env.store.get_job(job.job_id)
    assert learned.checkpoint_bytes == TB and learned.last_checkpoint is not None
    spec = spec_of(learned)
    assert spec.checkpoint.size_gb == 1120.0 and spec.checkpoint.region == settings().region  # the jobs bucket
    # a late report of an older save does not undo the newer size
    on_agent_event.handler(agent_event("CheckpointCommitted", gang[0], step=40, duration_s=4.0, emergency=False,
                                       total_bytes=5), ctx())
    assert env.store.get_job(job.job_id).checkpoint_bytes == TB
    on_agent_event.handler(agent_event("CheckpointCommitted", gang[0], step=60, duration_s=4.0, emergency=False,
                                       total_bytes=TB + 1), ctx())
    assert env.store.get_job(job.job_id).checkpoint_bytes == TB + 1
