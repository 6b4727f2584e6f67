"""Which AWS actions each Lambda handler's code can call, found by reading the source (no AWS, no moto).

From ``functions/<handler>.py``'s ``handler`` the walk follows every call it can resolve:

- plain and module-qualified names, through imports, to first-party functions and classes;
- ``self.m(...)`` to the method of the enclosing class;
- calls on a port (``ctl.store.x``, ``ctl.need_compute().x``, a parameter or local named ``compute``...)
  to the production adapter behind it (:data:`PORT_ADAPTERS`, the defaults of ``functions/_runtime.py``);
- in adapters, ``obj.m(...)`` to a method ``m`` of a first-party class the module defines or imports;
- a first-party function passed to a call (``each("stale", job, [], _stale, ...)``, a callback:
  plain or module-qualified) as if it were called there.

Every call whose name is an operation of a boto3 client the code uses (``client("ec2")``...), and every
``get_paginator("op")``, is an AWS call; its IAM action, plus the actions AWS checks along with it
(:data:`IMPLIED`), is what the handler's role must hold. Third-party helpers that call AWS on our behalf
are listed in :data:`LIBRARY_CALLS`. Resolution over-approximates: any branch counts, error paths
included, which is what a role must allow.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import lru_cache

from botocore import xform_name
from botocore.session import get_session

from cdk import imports

# port attribute / variable name -> (module, class) of the adapter production builds
PORT_ADAPTERS: dict[str, tuple[str, str]] = {
    "store": ("spotrelay.adapters.dynamodb_job_store", "DynamoDBJobStore"),
    "workflow": ("spotrelay.adapters.sfn_workflow", "SfnWorkflow"),
    "compute": ("spotrelay.adapters.ec2_compute", "Ec2Compute"),
    "market": ("spotrelay.adapters.ec2_market", "Ec2MarketData"),
    "pool_stats": ("spotrelay.adapters.dynamodb_pool_stats", "DynamoDBPoolStatsStore"),
    "notifier": ("spotrelay.adapters.sns_notifier", "SnsNotifier"),
    "objects": ("spotrelay.adapters.s3_object_store", "S3ObjectStore"),
    "events": ("spotrelay.adapters.eventbridge_publisher", "EventBridgePublisher"),
}
_NEED = {"need_compute": "compute", "need_workflow": "workflow"}
# Modules whose calls on arbitrary objects may be boto3 client calls.
ADAPTER_PACKAGES = ("spotrelay.adapters", "functions")
# Methods of dicts, lists and strings: never taken for a first-party method of the same name.
_BUILTIN_METHODS = frozenset(name for t in (dict, list, str, set) for name in dir(t) if not name.startswith("_"))
# Third-party helpers we call, and the actions they make (name called -> actions).
LIBRARY_CALLS: dict[str, tuple[str, ...]] = {
    # Powertools idempotency: save in progress, read on conflict, save the result, delete on failure
    "DynamoDBPersistenceLayer": ("dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"),
    "SecretsProvider": ("secretsmanager:GetSecretValue",),
}
# Operations whose IAM action has another name.
ACTION_NAMES: dict[str, str] = {
    "s3:HeadObject": "s3:GetObject",
    "s3:ListObjectsV2": "s3:ListBucket",
    "s3:ListObjects": "s3:ListBucket",
    "s3:DeleteObjects": "s3:DeleteObject",
    "s3:HeadBucket": "s3:ListBucket",
}
# Actions AWS authorizes along with an operation (tag-on-create, passing the instance role, KMS).
IMPLIED: dict[str, tuple[str, ...]] = {
    "ec2:CreateFleet": ("ec2:RunInstances", "ec2:CreateTags", "iam:PassRole", "iam:CreateServiceLinkedRole"),
    "ec2:RunInstances": ("ec2:CreateTags", "iam:PassRole"),
    "ec2:CreateLaunchTemplate": ("ec2:CreateTags",),
    "ec2:CreatePlacementGroup": ("ec2:CreateTags",),
    "iam:CreateRole": ("iam:TagRole",),
    "iam:AddRoleToInstanceProfile": ("iam:PassRole",),
    "sns:Publish": ("kms:GenerateDataKey", "kms:Decrypt"),  # the topic is encrypted with the stack's key
}


@dataclass(frozen=True)
class Call:
    action: str
    via: tuple[str, ...]  # the call chain from the handler, outermost first

    def chain(self) -> str:
        return " -> ".join(self.via)


@dataclass
class _Module:
    name: str
    tree: ast.Module
    defs: dict[str, ast.AST] = field(default_factory=dict)  # "f", "Class", "Class.m"
    classes: dict[str, set[str]] = field(default_factory=dict)
    aliases: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # name -> (module, attr)
    services: set[str] = field(default_factory=set)


@lru_cache(maxsize=256)
def _module(name: str) -> _Module | None:
    path = imports.module_path(name)
    if path is None:
        return None
    mod = _Module(name, ast.parse(path.read_text(), filename=str(path)))
    for node in mod.tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            mod.defs[node.name] = node
        elif isinstance(node, ast.ClassDef):
            mod.defs[node.name] = node
            methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            mod.classes[node.name] = methods
            for n in node.body:
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                    mod.defs[f"{node.name}.{n.name}"] = n
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for item in ast.walk(mod.tree):
        if isinstance(item, ast.Import):
            for alias in item.names:  # ``import a.b as c`` binds a.b; ``import a.b`` binds a
                bound = alias.name if alias.asname else alias.name.split(".")[0]
                mod.aliases[alias.asname or bound] = (bound, None)
        elif isinstance(item, ast.ImportFrom):
            base = item.module or ""
            if item.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - item.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            for alias in item.names:
                sub = f"{base}.{alias.name}"
                target = (sub, None) if imports.module_path(sub) else (base, alias.name)
                mod.aliases[alias.asname or alias.name] = target
        elif (isinstance(item, ast.Call) and _name_of(item.func) in ("client", "_client", "resource")
              and item.args and isinstance(item.args[0], ast.Constant) and isinstance(item.args[0].value, str)):
            mod.services.add(item.args[0].value)
    return mod


def _name_of(func: ast.AST) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


@lru_cache(maxsize=32)
def _operations(service: str) -> tuple[str, dict[str, str]]:
    """(IAM prefix, snake_case name -> operation name) of a boto3 service."""
    model = get_session().get_service_model(service)
    return model.signing_name, {xform_name(op): op for op in model.operation_names}


def _action(service: str, operation: str) -> str:
    prefix, _ = _operations(service)
    action = f"{prefix}:{operation}"
    return ACTION_NAMES.get(action, action)


class Analyzer:
    def __init__(self) -> None:
        self._services: set[str] = set()
        for name in imports.closure(["functions._runtime", *_all_adapter_modules()]):
            mod = _module(name)
            if mod is not None:
                self._services |= mod.services

    def _resolve(self, module: str, name: str, depth: int = 0) -> tuple[str, str] | None:
        """A first-party function or class named ``name`` in ``module`` (following re-exports)."""
        mod = _module(module)
        if mod is None or depth > 5:
            return None
        if name in mod.defs:
            return module, name
        if name in mod.aliases:
            target, attr = mod.aliases[name]
            return self._resolve(target, attr, depth + 1) if attr else None
        return None

    def _ops_for(self, mod: _Module, method: str) -> list[str]:
        services = mod.services or self._services
        return [_action(s, _operations(s)[1][method]) for s in sorted(services) if method in _operations(s)[1]]

    def calls(self, handler: str) -> dict[str, Call]:
        """Action -> the first call chain found that needs it, for ``functions/<handler>.py``."""
        return self.calls_from((f"functions.{handler}", "handler"), f"functions/{handler}.py:handler")

    def calls_from(self, start: tuple[str, str], label: str) -> dict[str, Call]:
        """Action -> the first call chain found that needs it, from the function ``start`` (module, name):
        a handler, or a CLI command (tests/infrastructure/test_cli_permissions.py)."""
        found: dict[str, Call] = {}
        todo: list[tuple[tuple[str, str], tuple[str, ...]]] = [(start, (label,))]
        seen: set[tuple[str, str]] = set()
        while todo:
            (module, qual), via = todo.pop(0)
            if (module, qual) in seen:
                continue
            seen.add((module, qual))
            mod = _module(module)
            node = mod.defs.get(qual) if mod else None
            if mod is None or node is None:
                continue
            if isinstance(node, ast.ClassDef):  # a constructor call runs __init__
                todo.append(((module, f"{qual}.__init__"), via))
                continue
            for target, action in self._walk(mod, qual, node):
                if target is not None:
                    todo.append((target, (*via, f"{target[0]}:{target[1]}")))
                for act in (action,) if action else ():
                    for a in (act, *IMPLIED.get(act, ())):
                        found.setdefault(a, Call(a, via))
        return found

    def _walk(self, mod: _Module, qual: str, node: ast.AST) -> list[tuple[tuple[str, str] | None, str | None]]:
        out: list[tuple[tuple[str, str] | None, str | None]] = []
        cls = qual.split(".")[0] if "." in qual else None
        ports = _local_ports(node)
        instances = self._local_instances(mod, node)
        shadowed = _parameters(node)  # (a parameter named like a module's function is not that function)
        adapter = mod.name.startswith(ADAPTER_PACKAGES)
        visible = {c: (mod.name, c) for c in mod.classes}
        for alias in mod.aliases:
            hit = self._resolve(mod.name, alias)
            if hit and isinstance(_module(hit[0]).defs.get(hit[1]), ast.ClassDef):  # type: ignore[union-attr]
                visible[alias] = hit
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            out += [(hit, None) for hit in self._callbacks(mod, call, shadowed)]
            func = call.func
            if isinstance(func, ast.Name):
                if func.id in shadowed:
                    continue
                if func.id in LIBRARY_CALLS:
                    out += [(None, a) for a in LIBRARY_CALLS[func.id]]
                hit = self._resolve(mod.name, func.id)
                if hit:
                    out.append((hit, None))
                    out += [(None, a) for a in self._paginated_args(hit, call)]
                continue
            if not isinstance(func, ast.Attribute):
                continue
            value, attr = func.value, func.attr
            if isinstance(value, ast.Name) and value.id in ("self", "cls") and cls:
                out.append(((mod.name, f"{cls}.{attr}"), None))
                out += [(None, a) for a in self._paginated_args((mod.name, f"{cls}.{attr}"), call)]
                continue
            if isinstance(value, ast.Name) and value.id in mod.aliases and mod.aliases[value.id][1] is None:
                hit = self._resolve(mod.aliases[value.id][0], attr)
                if hit:
                    out.append((hit, None))
                continue
            made = self._instance_of(mod, value, instances)
            if made is not None:  # (an adapter built here: ``source = CloudWatchTrainingLogs(...)``)
                out.append(((made[0], f"{made[1]}.{attr}"), None))
                continue
            port = _port_of(value, ports)
            if port is not None:
                target_mod, target_cls = PORT_ADAPTERS[port]
                out.append(((target_mod, f"{target_cls}.{attr}"), None))
                continue
            if not adapter:
                continue
            if attr == "get_paginator" and call.args and isinstance(call.args[0], ast.Constant):
                out += [(None, a) for a in self._ops_for(mod, str(call.args[0].value))]
                continue
            out += [(None, a) for a in self._ops_for(mod, attr)]
            if mod.name.startswith("spotrelay.adapters") and attr not in _BUILTIN_METHODS:
                out += [((m, f"{c}.{attr}"), None) for m, c in visible.values()
                        if attr in _module(m).classes[c]]  # type: ignore[union-attr]
        return out

    def _instance_of(self, mod: _Module, value: ast.AST,
                     instances: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
        """(module, class) of an adapter ``value`` is: a local assigned from its constructor, or the
        constructor call itself (``S3ObjectStore().put``)."""
        if isinstance(value, ast.Name):
            return instances.get(value.id)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            return self._adapter_class(mod, value.func.id)
        return None

    def _adapter_class(self, mod: _Module, name: str) -> tuple[str, str] | None:
        hit = self._resolve(mod.name, name)
        if hit is None or not hit[0].startswith("spotrelay.adapters"):
            return None
        return hit if isinstance(_module(hit[0]).defs.get(hit[1]), ast.ClassDef) else None  # type: ignore[union-attr]

    def _local_instances(self, mod: _Module, node: ast.AST) -> dict[str, tuple[str, str]]:
        """Locals assigned from an adapter's constructor (``source = CloudWatchTrainingLogs(group)``)."""
        found: dict[str, tuple[str, str]] = {}
        for n in ast.walk(node):
            if (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                    and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)):
                made = self._adapter_class(mod, n.value.func.id)
                if made is not None:
                    found[n.targets[0].id] = made
        return found

    def _callbacks(self, mod: _Module, call: ast.Call, shadowed: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
        """First-party functions passed to ``call`` (by name or ``module.name``): it may call them."""
        out: list[tuple[str, str]] = []
        for arg in (*call.args, *(k.value for k in call.keywords)):
            hit = None
            if isinstance(arg, ast.Name) and arg.id not in shadowed:
                hit = self._resolve(mod.name, arg.id)
            elif (isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id in mod.aliases
                  and mod.aliases[arg.value.id][1] is None):
                hit = self._resolve(mod.aliases[arg.value.id][0], arg.attr)
            target = _module(hit[0]).defs.get(hit[1]) if hit else None  # type: ignore[union-attr]
            if hit and isinstance(target, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append(hit)
        return out

    def _paginated_args(self, target: tuple[str, str], call: ast.Call) -> list[str]:
        """``self._items("query", ...)`` into a method that calls ``get_paginator(<parameter>)``, or
        ``self._token_call("send_task_success", ...)`` into one that calls ``getattr(client, <parameter>)``."""
        mod = _module(target[0])
        node = mod.defs.get(target[1]) if mod else None
        if mod is None or node is None or not _dynamic_dispatch(node):
            return []
        names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        return [op for name in names for op in self._ops_for(mod, name)]


def _parameters(node: ast.AST) -> frozenset[str]:
    """The names a function's parameters bind (none for a class or a module)."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return frozenset()
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return frozenset(names) - {"self", "cls"}


def _dynamic_dispatch(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if not isinstance(n, ast.Call):
            continue
        if _name_of(n.func) == "get_paginator" and n.args and not isinstance(n.args[0], ast.Constant):
            return True
        if (isinstance(n.func, ast.Call) and _name_of(n.func.func) == "getattr" and len(n.func.args) > 1
                and not isinstance(n.func.args[1], ast.Constant)):
            return True
    return False


def _port_of(expr: ast.AST, local: dict[str, str]) -> str | None:
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _NEED:
        return _NEED[expr.func.attr]
    if isinstance(expr, ast.Attribute):
        name = expr.attr.lstrip("_")
        return name if name in PORT_ADAPTERS else None
    if isinstance(expr, ast.Name):
        return expr.id if expr.id in PORT_ADAPTERS else local.get(expr.id)
    return None


def _local_ports(node: ast.AST) -> dict[str, str]:
    """Locals assigned from a port expression (``c = ctl.need_compute()``)."""
    found: dict[str, str] = {}
    for n in ast.walk(node):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            port = _port_of(n.value, {})
            if port is not None:
                found[n.targets[0].id] = port
    return found


def _all_adapter_modules() -> list[str]:
    root = imports.ROOT / "spotrelay" / "adapters"
    return [f"spotrelay.adapters.{p.stem}" for p in sorted(root.glob("*.py")) if p.stem != "__init__"]


def handler_calls(handlers: list[str]) -> dict[str, dict[str, Call]]:
    analyzer = Analyzer()
    return {h: analyzer.calls(h) for h in handlers}
