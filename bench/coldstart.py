"""Lambda cold start per handler: the cold import and the first invocation, each in a fresh process.

Each handler runs the way Lambda runs it: a new interpreter (``python -S``) whose path holds only the
production bundle and the layer as the CDK app stages them (cdk/staging.py) plus what the Lambda runtime
ships (boto3 and its dependencies). moto's server stands in for AWS, with the controller's tables, bucket
and topic; the first invocation gets the handler's real event sample from tests/events (a workflow task
gets a job id nobody submitted, so its first call ends in a NotFoundError after its first AWS calls).

    python bench/coldstart.py [--repeat 3] [--json out.json]

Prints, per handler, the fastest of ``--repeat`` fresh processes (the machine's noise only adds time), in
CPU and wall seconds, whether the cold import loaded boto3 (it must not: clients load on first use), and
the ratio of the import's CPU time to the 0.4 s cold-import budget.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.handler_samples import first_event  # noqa: E402

BUDGET_S = 0.4
RUNTIME_MODULES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six", "urllib3")
JOB = "coldstart-bench-job"

CHILD = r"""
import importlib, json, sys, time
handler, event_json = sys.argv[1], sys.argv[2]
t0, c0 = time.perf_counter(), time.process_time()
module = importlib.import_module(f"functions.{handler}")
t1, c1 = time.perf_counter(), time.process_time()
loaded = sorted({m.split(".")[0] for m in sys.modules})

class Context:
    function_name = f"spotrelay-{handler}"
    function_version = "$LATEST"
    invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:spotrelay-{handler}"
    memory_limit_in_mb = 512
    aws_request_id = "coldstart"
    log_group_name = f"/aws/lambda/spotrelay-{handler}"
    log_stream_name = "coldstart"
    def get_remaining_time_in_millis(self):
        return 60_000

try:
    module.handler(json.loads(event_json), Context())
    outcome = "ok"
except Exception as exc:  # the time to the first answer counts either way
    outcome = type(exc).__name__
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"import_s": t1 - t0, "first_call_s": t2 - t1, "import_cpu_s": c1 - c0,
                  "first_call_cpu_s": c2 - c1, "outcome": outcome,
                  "boto3_at_import": "boto3" in loaded}))
"""


def _runtime_dir(tmp: Path) -> Path:
    runtime = tmp / "runtime"
    runtime.mkdir()
    for name in RUNTIME_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise SystemExit(f"{name} is not installed")
        origin = Path(spec.origin)
        source = origin.parent if origin.name == "__init__.py" else origin
        (runtime / source.name).symlink_to(source)
    return runtime


def _one(handler: str, env: dict[str, str]) -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-S", "-c", CHILD, handler, json.dumps(first_event(handler, JOB))],
                            env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in result.stdout.splitlines() if line.startswith('{"import_s"')]
    if result.returncode != 0 or not lines:
        raise SystemExit(f"{handler}: the bench process failed:\n{result.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per handler (the fastest counts)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    from cdk import staging
    from spotrelay.local import motoserver, provision
    from spotrelay.settings import reset, settings

    server = motoserver.start(apply_env=True)
    try:
        reset()
        created = provision.create_storage()
        body = (ROOT / "examples" / "tiny.yaml").read_bytes()
        from spotrelay.adapters.aws import client

        client("s3").put_object(Bucket=settings().bucket, Key="submissions/llm-pretrain.yaml", Body=body)
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            bundle = staging.stage_handlers(out=tmp / "handlers")
            layer = staging.BUILD / "layer" / "python"
            if not layer.exists():
                staging.stage_layer()
            env = {
                **server.env(),
                "PYTHONPATH": os.pathsep.join(map(str, (bundle, layer, _runtime_dir(tmp)))),
                "PYTHONDONTWRITEBYTECODE": "1",  # Lambda's /var/task and /opt are read-only: staged .pyc only
                "AWS_DEFAULT_REGION": "us-east-1",
                "SPOTRELAY_TOPIC_ARN": created["topic_arn"],
                "POWERTOOLS_SERVICE_NAME": "spotrelay",
                "POWERTOOLS_TRACE_DISABLED": "true",
                "POWERTOOLS_LOG_LEVEL": "ERROR",
            }
            results = {}
            for handler in staging.discover_handlers():
                runs = [_one(handler, env) for _ in range(max(1, args.repeat))]
                results[handler] = {
                    **{key: min(r[key] for r in runs)
                       for key in ("import_s", "first_call_s", "import_cpu_s", "first_call_cpu_s")},
                    "outcome": runs[-1]["outcome"],
                    "boto3_at_import": any(r["boto3_at_import"] for r in runs),
                }
    finally:
        server.stop()

    print(f"{'handler':24} {'import cpu':>10} {'/budget':>8} {'import wall':>11} {'1st call cpu':>12} "
          f"{'1st call wall':>13}  boto3@import  first call ended")
    for handler, r in results.items():
        print(f"{handler:24} {r['import_cpu_s']:>9.3f}s {r['import_cpu_s'] / BUDGET_S:>7.2f}x {r['import_s']:>10.3f}s "
              f"{r['first_call_cpu_s']:>11.3f}s {r['first_call_s']:>12.3f}s  "
              f"{'yes' if r['boto3_at_import'] else 'no':>12}  {r['outcome']}")
    worst = max(results.values(), key=lambda r: r["import_cpu_s"])
    print(f"slowest cold import: {worst['import_cpu_s']:.3f}s of CPU = {worst['import_cpu_s'] / BUDGET_S:.2f}x the "
          f"{BUDGET_S}s budget (the budget is on CPU time: on a shared machine wall time measures the neighbours; "
          f"on an idle one the two agree)")
    if args.json:
        args.json.write_text(json.dumps({"budget_s": BUDGET_S, "handlers": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
