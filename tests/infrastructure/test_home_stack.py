"""Template assertions on the home stack: the properties that matter, never hashed logical ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cdk import staging
from cdk.workflow import ASL_PATH, placeholders, render
from spotrelay.ports.logs import LOG_GROUP_DEFAULT
from spotrelay.ports.metrics import METRICS
from spotrelay.resources import RESOURCES
from tests.infrastructure.conftest import Synth


def _by_prop(resources: dict[str, dict[str, Any]], key: str, value: object) -> tuple[str, dict[str, Any]]:
    matches = [(k, v) for k, v in resources.items() if v["Properties"].get(key) == value]
    assert len(matches) == 1, f"expected one resource with {key}={value!r}, got {[k for k, _ in matches]}"
    return matches[0]


def test_tables_have_pitr_encryption_and_the_shared_keys(synth: Synth) -> None:
    tables = synth.resources(synth.home, "AWS::DynamoDB::Table")
    assert len(tables) == len(RESOURCES.tables)
    for spec in RESOURCES.tables:
        _, table = _by_prop(tables, "TableName", spec.default_name)
        props = table["Properties"]
        assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
        assert props["SSESpecification"]["SSEEnabled"] is True
        assert props["BillingMode"] == "PAY_PER_REQUEST"
        keys = {k["KeyType"]: k["AttributeName"] for k in props["KeySchema"]}
        assert keys["HASH"] == spec.partition_key and keys.get("RANGE") == spec.sort_key
        assert sorted(i["IndexName"] for i in props.get("GlobalSecondaryIndexes", [])) == sorted(
            i.name for i in spec.indexes
        )
        if spec.ttl_attribute:
            assert props["TimeToLiveSpecification"] == {"AttributeName": spec.ttl_attribute, "Enabled": True}
        assert table["DeletionPolicy"] == "Retain"


def _jobs_bucket(synth: Synth) -> tuple[str, dict[str, Any]]:
    buckets = synth.resources(synth.home, "AWS::S3::Bucket")
    jobs = [
        (k, v)
        for k, v in buckets.items()
        if "NotificationConfiguration" in json.dumps(v) or "checkpoints-to-glacier" in json.dumps(v)
    ]
    assert len(jobs) == 1
    return jobs[0]


def _assert_secure_bucket(template: dict[str, Any], logical: str) -> None:
    props = template["Resources"][logical]["Properties"]
    sse = props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]
    assert sse["SSEAlgorithm"] in ("AES256", "aws:kms")
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    policies = [
        r
        for r in template["Resources"].values()
        if r["Type"] == "AWS::S3::BucketPolicy" and r["Properties"]["Bucket"] == {"Ref": logical}
    ]
    assert policies, f"{logical} has no bucket policy"
    deny_http = [
        s
        for s in policies[0]["Properties"]["PolicyDocument"]["Statement"]
        if s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
    ]
    assert deny_http and deny_http[0]["Action"] == "s3:*", "bucket is not TLS-only"


def test_jobs_bucket_encrypted_private_tls_only_versioned_with_glacier_lifecycle(synth: Synth) -> None:
    template = synth.template(synth.home)
    logical, bucket = _jobs_bucket(synth)
    _assert_secure_bucket(template, logical)
    props = bucket["Properties"]
    rules = {r["Id"]: r for r in props["LifecycleConfiguration"]["Rules"]}
    glacier = rules["checkpoints-to-glacier"]
    assert glacier["Prefix"] == RESOURCES.checkpoints_prefix
    assert glacier["Transitions"] == [
        {"StorageClass": "GLACIER", "TransitionInDays": synth.config.checkpoint_glacier_days}
    ]
    assert props["LoggingConfiguration"]["DestinationBucketName"]["Ref"] != logical
    # submissions reach on_submission through EventBridge
    assert "EventBridgeConfiguration" in json.dumps(template["Resources"])


def _functions(synth: Synth) -> dict[str, dict[str, Any]]:
    out = {}
    for fn in synth.resources(synth.home, "AWS::Lambda::Function").values():
        handler = fn["Properties"].get("Handler", "")
        if handler.startswith("functions."):
            out[handler.split(".")[1]] = fn["Properties"]
    return out


def test_one_lambda_per_handler_module_each_with_its_own_role(synth: Synth) -> None:
    functions = _functions(synth)
    assert sorted(functions) == staging.discover_handlers()
    assert set(RESOURCES.handlers) <= set(functions)
    roles = [p["Role"]["Fn::GetAtt"][0] for p in functions.values()]
    assert len(set(roles)) == len(roles), "handlers share a role"
    for module, props in functions.items():
        assert props["FunctionName"] == f"spotrelay-{module.replace('_', '-')}"
        assert props["Runtime"] in ("python3.11", "python3.12")
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert len(props["Layers"]) == 1
        env = props["Environment"]["Variables"]
        for table in RESOURCES.tables:
            assert table.env in env
        for name in (
            RESOURCES.bucket_env,
            RESOURCES.topic_env,
            RESOURCES.state_machine_env,
            RESOURCES.event_bus_env,
            RESOURCES.slack_secret_env,
        ):
            assert name in env, f"{module} misses {name}"


def _policy_actions(template: dict[str, Any], role_logical: str) -> set[str]:
    actions: set[str] = set()
    for res in template["Resources"].values():
        if res["Type"] not in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            continue
        roles = res["Properties"].get("Roles", [])
        if {"Ref": role_logical} not in roles:
            continue
        for statement in res["Properties"]["PolicyDocument"]["Statement"]:
            acts = statement["Action"]
            actions.update(acts if isinstance(acts, list) else [acts])
    return actions


def test_roles_grant_only_what_each_handler_needs(synth: Synth) -> None:
    template = synth.template(synth.home)
    functions = _functions(synth)
    actions = {m: _policy_actions(template, p["Role"]["Fn::GetAtt"][0]) for m, p in functions.items()}
    assert "secretsmanager:GetSecretValue" in actions["slack_notifier"]
    assert not any(a.startswith("dynamodb:") for a in actions["slack_notifier"])
    assert "states:StartExecution" in actions["on_submission"]
    assert not any(a.startswith("ec2:") for a in actions["on_submission"])
    assert "ec2:CreateFleet" in actions["sfn_provision"] and "iam:PassRole" in actions["sfn_provision"]
    assert {"iam:ListRoles", "iam:ListRoleTags", "iam:DeleteRole"} <= set(actions["reconcile"])  # leak sweep
    assert "iam:ListRoles" not in actions["sfn_provision"]
    for module, granted in actions.items():
        assert "secretsmanager:GetSecretValue" not in granted or module == "slack_notifier"
        assert "*" not in granted and not any(a.endswith(":*") for a in granted), module


def test_layer_holds_dependencies_but_no_torch_and_handlers_asset_only_source(synth: Synth) -> None:
    layer_dir = staging.BUILD / "layer" / "python"
    names = {p.name for p in layer_dir.iterdir()}
    assert {"pydantic", "pydantic_core", "yaml", "aws_lambda_powertools"} <= names
    assert not names & {"torch", "deepspeed", "boto3", "botocore", "numpy"}
    handlers_dir = staging.BUILD / "handlers"
    files = [p for p in handlers_dir.rglob("*") if p.is_file()]
    assert files and {p.relative_to(handlers_dir).parts[0] for p in files} == {"functions", "spotrelay"}
    assert all(p.suffix in (".py", ".pyc", ".json", ".yaml") for p in files)
    assert not any(".venv" in p.parts or "cdk.out" in p.parts for p in files)
    # the asset CDK staged is that folder (Code.from_asset of layers/build/handlers)
    assets = [p for p in synth.outdir.iterdir() if p.is_dir() and (p / "functions" / "on_submission.py").exists()]
    assert len(assets) == 1 and not (assets[0] / "tests").exists()


def test_rules_patterns_equal_the_shared_description_with_dlq_and_retry(synth: Synth) -> None:
    rules = synth.resources(synth.home, "AWS::Events::Rule")
    functions = synth.resources(synth.home, "AWS::Lambda::Function")
    for spec in RESOURCES.rules:
        _, rule = _by_prop(rules, "Name", f"spotrelay-{spec.logical}")
        props = rule["Properties"]
        assert props["EventPattern"] == spec.pattern
        (target,) = props["Targets"]
        assert "DeadLetterConfig" in target
        assert target["RetryPolicy"]["MaximumRetryAttempts"] > 0
        fn = functions[target["Arn"]["Fn::GetAtt"][0]]
        assert fn["Properties"]["Handler"] == f"functions.{spec.handler}.handler"
    _, schedule = _by_prop(rules, "Name", "spotrelay-Reconcile")
    assert schedule["Properties"]["ScheduleExpression"] == "rate(1 minute)"
    fn = functions[schedule["Properties"]["Targets"][0]["Arn"]["Fn::GetAtt"][0]]
    assert fn["Properties"]["Handler"] == "functions.reconcile.handler"
    for queue in synth.resources(synth.home, "AWS::SQS::Queue").values():
        assert "KmsMasterKeyId" in queue["Properties"]  # the stack's customer key


def test_state_machine_definition_is_the_asl_file_after_substitution(synth: Synth) -> None:
    (sm,) = synth.resources(synth.home, "AWS::StepFunctions::StateMachine").values()
    props = sm["Properties"]
    assert props["TracingConfiguration"] == {"Enabled": True}
    assert props["LoggingConfiguration"]["Level"] == "ALL"
    key = props["DefinitionS3Location"]["Key"]
    asset = synth.outdir / f"asset.{key}"
    asl_text = ASL_PATH.read_text()
    assert asset.read_text() == asl_text
    subs = props["DefinitionSubstitutions"]
    assert sorted(subs) == placeholders(asl_text)
    resources = synth.template(synth.home)["Resources"]
    arns = {}
    for name, value in subs.items():
        logical = value["Fn::GetAtt"][0] if "Fn::GetAtt" in value else value["Ref"]
        if name.startswith("fn_"):
            assert resources[logical]["Properties"]["Handler"] == f"functions.{name[3:]}.handler"
            function_name = resources[logical]["Properties"]["FunctionName"]
            arns[name] = f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}"
        else:
            arns[name] = f"resolved:{logical}"
    definition = json.loads(render(asl_text, arns))
    tasks = [s for s in _states(definition) if s.get("Type") == "Task"]
    assert tasks and all("${" not in json.dumps(t) for t in tasks)


def _states(definition: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for state in definition.get("States", {}).values():
        found.append(state)
        for branch in state.get("Branches", []):
            found.extend(_states(branch))
        if "Iterator" in state or "ItemProcessor" in state:
            found.extend(_states(state.get("Iterator") or state["ItemProcessor"]))
    return found


def test_alarms_cover_failed_executions_dlqs_and_handler_errors(synth: Synth) -> None:
    alarms = [a["Properties"] for a in synth.resources(synth.home, "AWS::CloudWatch::Alarm").values()]
    metrics = {(a["Namespace"], a["MetricName"]) for a in alarms}
    assert ("AWS/States", "ExecutionsFailed") in metrics
    dlq_alarms = [a for a in alarms if a["MetricName"] == "ApproximateNumberOfMessagesVisible"]
    assert len(dlq_alarms) == len(RESOURCES.rules) + 1  # every rule and the schedule
    error_alarms = [a for a in alarms if (a["Namespace"], a["MetricName"]) == ("AWS/Lambda", "Errors")]
    assert len(error_alarms) == len(_functions(synth))
    assert all(a["AlarmActions"] for a in alarms)
    assert {("Spotrelay", "TrainingAnomalies"), ("Spotrelay", "Recoveries")} <= metrics
    (dashboard,) = synth.resources(synth.home, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    assert all(name in body for name in METRICS)  # every controller metric is on the dashboard


def test_topic_encrypted_tls_only_with_slack_and_email(synth: Synth) -> None:
    (topic,) = synth.resources(synth.home, "AWS::SNS::Topic").values()
    assert "KmsMasterKeyId" in topic["Properties"]
    policies = synth.resources(synth.home, "AWS::SNS::TopicPolicy").values()
    assert any(
        s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
        for p in policies
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    )
    subs = [s["Properties"] for s in synth.resources(synth.home, "AWS::SNS::Subscription").values()]
    assert {s["Protocol"] for s in subs} == {"lambda", "email"}
    (secret,) = synth.resources(synth.home, "AWS::SecretsManager::Secret").values()
    assert secret["Properties"]["Name"] == synth.config.slack_secret_name


def test_asset_paths_never_hold_venv(synth: Synth) -> None:
    manifest = json.loads((synth.outdir / f"{synth.home}.assets.json").read_text())
    sources = [Path(a["source"]["path"]) for a in manifest["files"].values()]
    for source in sources:
        folder = synth.outdir / source
        if folder.is_dir():
            assert not (folder / ".venv").exists() and not (folder / "cdk.out").exists()


def _statements(template: dict[str, Any], role_logical: str) -> list[dict[str, Any]]:
    return [
        statement
        for res in template["Resources"].values()
        if res["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy")  # CDK overflows big policies
        and {"Ref": role_logical} in res["Properties"].get("Roles", [])
        for statement in res["Properties"]["PolicyDocument"]["Statement"]
    ]


def _acts(statement: dict[str, Any]) -> list[str]:
    return statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]


def test_per_job_agent_profiles_only_with_the_boundary(synth: Synth) -> None:
    from cdk.nag import flatten

    template = synth.template(synth.home)
    _, boundary = _by_prop(synth.resources(synth.home, "AWS::IAM::ManagedPolicy"), "Path", "/spotrelay/")
    props = boundary["Properties"]
    assert props["ManagedPolicyName"] == "spotrelay-agent-boundary" and props["Path"] == "/spotrelay/"
    boundary_text = flatten(props["PolicyDocument"])
    assert "iam:" not in boundary_text and "ec2:" not in boundary_text and "spotrelay.agent" in boundary_text
    assert "dynamodb:GetItem" in boundary_text and not any(  # the agents never write a record
        w in boundary_text for w in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"))
    boundary_arn = "arn:<AWS::Partition>:iam::<AWS::AccountId>:policy/spotrelay/spotrelay-agent-boundary"

    functions = _functions(synth)
    for module, fn in functions.items():
        statements = _statements(template, fn["Role"]["Fn::GetAtt"][0])
        # which handler holds which iam: action is test_grants.py's; here: where they may act
        for s in statements:
            if not any(a.startswith("iam:") for a in _acts(s)) or "iam:CreateServiceLinkedRole" in _acts(s):
                continue
            if set(_acts(s)) == {"iam:ListRoles"}:  # no resource-level permissions: read-only, reconcile only
                assert module == "reconcile" and s["Resource"] == "*"
                continue
            resources = [flatten(r) for r in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])]
            assert all(r.endswith((":role/spotrelay/spotrelay-agent-job-*",
                                   ":instance-profile/spotrelay/spotrelay-agent-job-*")) for r in resources), resources
            if {"iam:CreateRole", "iam:PutRolePolicy"} & set(_acts(s)):
                assert flatten(s["Condition"]["StringEquals"]["iam:PermissionsBoundary"]) == boundary_arn
            if "iam:PassRole" in _acts(s):
                assert s["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}

    ec2_config = flatten(functions["sfn_provision"]["Environment"]["Variables"]["SPOTRELAY_EC2_CONFIG"])
    assert '"permissions_boundary_arn": "' + boundary_arn in ec2_config
    assert '"ssm_prefix": "/spotrelay/training"' in ec2_config
    for region in synth.config.training_regions:  # checkpoints/<job>/ in every region's data bucket
        assert f'"{region}": "spotrelay-data-<AWS::AccountId>-{region}"' in ec2_config

    # where a submission may point checkpoint.s3_prefix: exactly the boundary's object resources
    objects = [s for s in props["PolicyDocument"]["Statement"] if "s3:PutObject" in _acts(s)]
    assert len(objects) == 1
    allowed = sorted(flatten(r).replace("arn:<AWS::Partition>:s3:::", "s3://") for r in objects[0]["Resource"])
    for module, fn in functions.items():
        roots = flatten(fn["Environment"]["Variables"][RESOURCES.checkpoint_roots_env]).split(",")
        assert sorted(f"{r}*" for r in roots) == allowed, module
    assert len(allowed) == 1 + len(synth.config.training_regions)

    # where a dataset may be: the data buckets' data/, and each bucket of dataset_buckets, whole
    reads = [s for s in props["PolicyDocument"]["Statement"] if _acts(s) == ["s3:GetObject"]]
    readable = {flatten(r).replace("arn:<AWS::Partition>:s3:::", "s3://") for s in reads
                for r in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])}
    for module, fn in functions.items():
        datasets = flatten(fn["Environment"]["Variables"][RESOURCES.dataset_roots_env]).split(",")
        assert {f"{d}*" for d in datasets} <= readable, (module, datasets, readable)
        assert {"s3://acme-ml-data/", "s3://acme-ml-data-usw2/"} <= set(datasets)
        assert fn["Environment"]["Variables"][RESOURCES.fsx_env] == str(synth.config.fsx_enabled).lower()
        assert len(datasets) == len(synth.config.training_regions) + 2


def test_training_log_group_for_the_nodes_output(synth: Synth) -> None:
    groups = [g["Properties"] for g in synth.resources(synth.home, "AWS::Logs::LogGroup").values()]
    [training] = [g for g in groups if g.get("LogGroupName") == LOG_GROUP_DEFAULT]
    assert training["RetentionInDays"] > 0
