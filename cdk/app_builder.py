"""Build the whole app (home stack + one regional stack per training region) from a config."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import App, Environment, Tags

from cdk import checkov, nag
from cdk.config import AppConfig, from_context
from cdk.home_stack import HomeStack
from cdk.regional_stack import RegionalStack
from cdk.workflow import ASL_PATH

# Behaviour flags the constructs rely on, set here so ``python app.py`` and ``cdk synth`` agree.
FEATURE_FLAGS = {
    "@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy": True,  # log delivery by policy, not ACLs
    "@aws-cdk/core:validationReportJson": True,  # cdk-nag findings as JSON in cdk.out
}


def home_stack_name(config: AppConfig) -> str:
    return f"{config.prefix.title().replace('-', '')}Home"


def training_stack_name(config: AppConfig, region: str) -> str:
    return f"{config.prefix.title().replace('-', '')}Training-{region}"


def build(
    app: App,
    config: AppConfig | None = None,
    *,
    handlers: list[str] | None = None,
    asl_path: Path = ASL_PATH,
    checks: bool = True,
) -> dict[str, object]:
    """Add every stack to ``app``; return them by name. ``handlers`` overrides discovery (tests)."""
    for key, value in FEATURE_FLAGS.items():
        app.node.set_context(key, value)
    config = config or from_context(app.node.try_get_context)
    stacks: dict[str, object] = {}
    home = HomeStack(
        app,
        home_stack_name(config),
        config=config,
        handlers=handlers,
        asl_path=asl_path,
        env=Environment(region=config.home_region),
        description="spotrelay controller: tables, bucket, handlers, job-run workflow, rules, alarms",
    )
    stacks[home.stack_name] = home
    for region in config.training_regions:
        regional = RegionalStack(
            app,
            training_stack_name(config, region),
            config=config,
            region=region,
            env=Environment(region=region),
            description=f"spotrelay training region {region}: event forwarding, data bucket, agent launch template",
        )
        # deploy order only: replication needs the home bucket, forwarding the home rules
        regional.add_stack_dependency(home)
        stacks[regional.stack_name] = regional
    Tags.of(app).add("spotrelay:deployment", config.prefix)
    unexplained = [w for s in stacks.values() for w in getattr(s, "unexplained_wildcards", [])]
    checkov.add_skips(app)  # accepted checkov findings, with their reasons, in each resource's Metadata
    if checks:
        nag.add_checks(app)
    if unexplained and checks:
        # they also fail cdk-nag; listing them here says which pattern in cdk/nag.py is missing
        print("IAM wildcards without a reason in cdk/nag.py:\n  " + "\n  ".join(unexplained))
    return stacks
