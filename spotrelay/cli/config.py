"""Where the CLI points: flags, then environment, then a config file, then defaults.

The same CLI talks to AWS or to the local twin; ``spotrelay local up`` writes the twin's file.
Config file: ``$SPOTRELAY_CONFIG`` or ``./.spotrelay.toml`` or ``~/.config/spotrelay/config.toml``::

    endpoint_url = "http://127.0.0.1:5123"   # omit for AWS
    region = "us-east-1"
    bucket = "spotrelay-jobs"
    jobs_table = "spotrelay-jobs"
    nodes_table = "spotrelay-nodes"
    state_machine_arn = "arn:aws:states:..."
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from spotrelay.resources import JOBS, NODES, RESOURCES

# config key -> environment variable our settings read
KEYS = {
    "endpoint_url": "AWS_ENDPOINT_URL",
    "region": "AWS_REGION",
    "bucket": RESOURCES.bucket_env,
    "jobs_table": JOBS.env,
    "nodes_table": NODES.env,
    "state_machine_arn": RESOURCES.state_machine_env,
    "topic_arn": RESOURCES.topic_env,
}


def config_path() -> Path | None:
    named = os.environ.get("SPOTRELAY_CONFIG")
    if named and not Path(named).is_file():  # (a typo fell through to another file, or to AWS, silently)
        raise ValueError(f"SPOTRELAY_CONFIG {named}: is not a file (point it at the config file, or unset it)")
    candidates = [named, ".spotrelay.toml", str(Path.home() / ".config" / "spotrelay" / "config.toml")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def read_file(path: Path) -> dict[str, str]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:  # (not UTF-8: it named no file)
        raise ValueError(f"{path}: cannot read the spotrelay config: {exc}") from exc
    unknown = set(data) - set(KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(KEYS)}")
    return {k: str(v) for k, v in data.items()}


def apply(flags: dict[str, str | None]) -> None:
    """Set the environment our settings read, with flags > environment > file precedence."""
    path = config_path()
    from_file = read_file(path) if path else {}
    for key, env in KEYS.items():
        if flags.get(key):
            os.environ[env] = str(flags[key])
        elif not os.environ.get(env) and key in from_file:
            os.environ[env] = from_file[key]
    if os.environ.get("AWS_ENDPOINT_URL"):  # the twin accepts any credentials
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    from spotrelay.settings import reset

    reset()


TWIN_MARK = "# written by `spotrelay local up`, removed when it stops"


def write_file(path: Path, values: dict[str, str], header: str | None = None) -> None:
    lines = [f'{key} = "{value}"' for key, value in values.items() if key in KEYS]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *lines] if header else lines) + "\n")


def twins_file(path: Path) -> bool:
    """Whether ``path`` is missing or a config ``local up`` wrote (a twin killed before it stopped left
    it): the twin may write or remove it. A user's own config is never overwritten nor deleted."""
    try:
        with path.open("rb") as f:
            return f.readline().rstrip(b"\r\n") == TWIN_MARK.encode()
    except FileNotFoundError:
        return True
    except OSError:
        return False
