"""AWS's own checks on the synthesized app: cdk-nag AwsSolutions and cfn-lint."""

from __future__ import annotations

from pathlib import Path

from tests.infrastructure.conftest import Synth

# cfn-lint W3005: CDK writes DependsOn on a Lambda's (and the state machine's) role although the
# resource already GetAtts it. Redundant, harmless, and not ours to change; everything else must pass.
CFN_LINT_IGNORED = ["W3005"]


def _violations(synth: Synth) -> list[str]:
    assert synth.report is not None, "no policy-validation-report.json: the cdk-nag plugin did not run"
    found = []
    for plugin in synth.report["pluginReports"]:
        assert plugin["summary"]["pluginName"] == "AwsSolutions"
        for violation in plugin["violations"]:
            for resource in violation["violatingResources"]:
                found.append(f"{violation['ruleName']} at {resource['constructPath']}")
    return found


def test_cdk_nag_aws_solutions_has_no_unacknowledged_findings(synth: Synth) -> None:
    assert _violations(synth) == [], "\n".join(_violations(synth))
    assert synth.error is None


def test_every_acknowledgement_carries_a_real_reason(synth: Synth) -> None:
    acknowledged = 0
    for name, template in synth.templates.items():
        for logical, resource in template["Resources"].items():
            for rule in resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", []):
                acknowledged += 1
                # ours are AwsSolutions-*; aws-cdk-lib adds its own (CloudFormation-Validate::...)
                assert rule["id"].startswith(("AwsSolutions-", "CloudFormation-Validate::")), (name, logical, rule)
                assert len(rule["reason"]) >= 30, (name, logical, rule)
    assert acknowledged > 0, "acknowledgements are not written to the templates"


def test_no_blanket_acknowledgement_of_wildcards(synth: Synth) -> None:
    for template in synth.templates.values():
        for resource in template["Resources"].values():
            for rule in resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", []):
                assert rule["id"] not in ("AwsSolutions-IAM5", "AwsSolutions-IAM4"), rule


def test_cfn_lint_clean_on_every_template(synth: Synth) -> None:
    from cfnlint.api import ManualArgs, lint_file

    problems = []
    for name in synth.templates:
        path = Path(synth.outdir) / f"{name}.template.json"
        matches = lint_file(path, ManualArgs(regions=[synth.regions[name]], ignore_checks=CFN_LINT_IGNORED))
        problems += [f"{name}: {m.rule.id} {m.message[:300]} (line {m.linenumber})" for m in matches]
    assert problems == [], "\n".join(problems)


def test_checkov_finds_nothing_that_is_not_fixed_or_accepted_with_a_reason(synth: Synth) -> None:
    """checkov (pinned, own venv) on every synthesized template; acceptances live in cdk/checkov.py."""
    from cdk.checkov import ACCEPTED
    from tests.infrastructure import checkov_env

    reports = checkov_env.run([Path(synth.outdir) / f"{name}.template.json" for name in synth.templates])
    failed, skipped, passed = [], [], 0
    for report in reports:
        results = report["results"]
        passed += int(report["summary"]["passed"])
        failed += [f"{c['check_id']} ({c['check_name']}) at {Path(c['file_path']).name}: {c['resource']}"
                   for c in results["failed_checks"]]
        skipped += results["skipped_checks"]
    assert not failed, (
        "checkov findings: fix each, or accept it in ACCEPTED in cdk/checkov.py with its reason:\n  "
        + "\n  ".join(sorted(failed))
    )
    assert passed > 100, "checkov checked almost nothing: did it read the templates?"
    for check in skipped:
        assert len(check["check_result"].get("suppress_comment") or "") >= 30, (check["check_id"], check["resource"])
    unused = {a.rule for a in ACCEPTED} - {c["check_id"] for c in skipped}
    assert not unused, f"cdk/checkov.py accepts {sorted(unused)}, which no template needs any more: remove them"


def test_every_sqs_queue_is_encrypted_and_every_handler_has_reserved_concurrency(synth: Synth) -> None:
    for name, template in synth.templates.items():
        for logical, resource in template["Resources"].items():
            props = resource.get("Properties", {})
            if resource["Type"] == "AWS::SQS::Queue":
                assert props.get("KmsMasterKeyId") or props.get("SqsManagedSseEnabled") is True, (name, logical)
                if name == synth.home:  # the home stack has a customer key that EventBridge may use
                    assert props.get("KmsMasterKeyId"), (name, logical)
            if resource["Type"] == "AWS::Lambda::Function" and str(props.get("Handler", "")).startswith("functions."):
                assert int(props["ReservedConcurrentExecutions"]) >= 1, (name, logical)
