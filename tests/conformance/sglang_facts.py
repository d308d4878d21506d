#!/usr/bin/env python3
"""Read the facts pdctl and sglang-sim rely on from a released SGLang wheel, as JSON on stdout.

The wheel is neither installed nor imported (it needs GPUs and torch): its Python sources are read
from the zip and parsed with `ast`. Usage: sglang_facts.py WHEEL. Each fact names where it is read
(paths inside the wheel, under sglang/srt/):

- routes: `@app.get/post/put/delete/head(PATH)` and `@app.api_route(PATH, methods=[...])` in
  entrypoints/http_server.py, `@router.get(PATH)` in entrypoints/v1_loads.py (included by the
  app), and the `Mount("/metrics", ...)` of utils/common.py;
- metrics: every `Gauge/Counter/Histogram/Summary(name="sglang:...")` in
  observability/metrics_collector.py (a counter's `_total` is dropped, as prometheus_client does);
- series: for the families pdctl's service gate reads (SERIES), the label names a call adds to
  the collector's own labels (`[*labels.keys(), "is_streaming"]`) and a histogram's default
  buckets (the `bucket_... = [...]` its `buckets=` names);
- lines: the ready line (entrypoints/http_server.py) and the shutdown lines
  (managers/tokenizer_manager.py) as templates, `{}` where the f-string has a value;
- api_key_exempt: the `path.startswith(...)` prefixes of `decide_request_auth` (utils/auth.py);
- env: the `SGLANG_DISAGGREGATION_*` defaults of environ.py;
- server_args: the dataclass defaults in arg_groups/fields/*.py.
"""
import ast
import json
import sys
import zipfile

SRT = "sglang/srt/"
ROLE_SWITCH = "disaggregation/role_switch.py"
LINES = {
    "ready": ("entrypoints/http_server.py", "fired up and ready to roll"),
    "sigterm": ("managers/tokenizer_manager.py", "Draining requests and shutting down"),
    "draining": ("managers/tokenizer_manager.py", "Gracefully exiting... Remaining number of requests"),
    # The runtime role switch's answers (the first from the tokenizer, the rest from the scheduler).
    "role_switch_not_enabled": ("managers/tokenizer_control_mixin.py", "--enable-pd-role-switch is not set on this server"),
    "role_switch_unhealthy": (ROLE_SWITCH, "instance is unhealthy after a failed role switch"),
    "role_switch_in_progress": (ROLE_SWITCH, "another role switch is already in progress"),
    "role_switch_invalid_role": (ROLE_SWITCH, "invalid new_role="),
    "role_switch_not_pd": (ROLE_SWITCH, "not running in PD disaggregation mode"),
    "role_switch_backend": (ROLE_SWITCH, "does not support runtime role switch"),
    "role_switch_already": (ROLE_SWITCH, "already in target role"),
    "role_switch_not_idle": (ROLE_SWITCH, "instance is not idle"),
    "role_switch_graph_memory_required": (ROLE_SWITCH, "is required before capturing decode graphs"),
    "role_switch_graph_memory_negative": (ROLE_SWITCH, "must be non-negative"),
    "role_switch_graph_headroom": (ROLE_SWITCH, "insufficient decode CUDA graph headroom"),
    "role_switch_rebuild_failed": (ROLE_SWITCH, "role switch failed; instance unhealthy"),
}
SERVER_ARGS = ["disaggregation_bootstrap_port", "page_size", "kv_cache_dtype", "dtype", "api_key"]
SERIES = [
    "sglang:time_to_first_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds",
    "sglang:num_requests",
    "sglang:num_aborted_requests",
]
HTTP_VERBS = {"get", "post", "put", "delete", "head", "patch"}


def parse(z, path):
    return ast.parse(z.read(SRT + path).decode(), filename=path)


def constant(node):
    """A literal, or `os.environ.get(NAME, DEFAULT)`'s default; None for anything else."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Call) and len(node.args) == 2 and isinstance(node.args[1], ast.Constant):
        return node.args[1].value
    return None


def template(node):
    """A string literal or f-string as text, `{}` for each value (`{x=}` keeps its `x=`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def routes(z):
    found = {}

    def add(path, methods):
        found.setdefault(path, set()).update(m.upper() for m in methods)

    for file, owners in [("entrypoints/http_server.py", {"app"}), ("entrypoints/v1_loads.py", {"router"})]:
        for fn in ast.walk(parse(z, file)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for d in fn.decorator_list:
                if not (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)):
                    continue
                owner = d.func.value
                if not (isinstance(owner, ast.Name) and owner.id in owners) or not d.args:
                    continue
                path = constant(d.args[0])
                if not isinstance(path, str):
                    continue
                verb = d.func.attr
                if verb in HTTP_VERBS:
                    add(path, [verb])
                elif verb == "api_route":
                    for kw in d.keywords:
                        if kw.arg == "methods" and isinstance(kw.value, (ast.List, ast.Tuple)):
                            add(path, [e.value for e in kw.value.elts if isinstance(e, ast.Constant)])
    for node in ast.walk(parse(z, "utils/common.py")):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Mount" and node.args:
            path = constant(node.args[0])
            if isinstance(path, str):
                add(path, ["GET"])
    return {p: sorted(m) for p, m in sorted(found.items())}


def metrics(z):
    found = {}
    for node in ast.walk(parse(z, "observability/metrics_collector.py")):
        if not isinstance(node, ast.Call):
            continue
        kind = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if kind not in ("Gauge", "Counter", "Histogram", "Summary"):
            continue
        for kw in node.keywords:
            if kw.arg == "name" and isinstance(kw.value, ast.Constant) and str(kw.value.value).startswith("sglang:"):
                name = kw.value.value
                if kind == "Counter" and name.endswith("_total"):
                    name = name[: -len("_total")]
                found[name] = kind.lower()
    return dict(sorted(found.items()))


def series(z):
    tree = parse(z, "observability/metrics_collector.py")
    # Default bucket lists by variable name (`bucket_x = [0.1, ...]`).
    lists = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple)):
            values = [constant(e) for e in node.value.elts]
            if values and all(isinstance(v, (int, float)) for v in values):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        lists[t.id] = [float(v) for v in values]
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        name = constant(kw.get("name")) if "name" in kw else None
        if not isinstance(name, str):
            continue
        key = name[: -len("_total")] if name.endswith("_total") else name
        if key not in SERIES:
            continue
        extra = sorted(
            n.value for n in ast.walk(kw["labelnames"]) if isinstance(n, ast.Constant) and isinstance(n.value, str)
        ) if "labelnames" in kw else []
        entry = {"labels": extra}
        b = kw.get("buckets")
        if isinstance(b, ast.Name) and b.id in lists:
            entry["buckets"] = lists[b.id]
        elif isinstance(b, (ast.List, ast.Tuple)):
            entry["buckets"] = [float(constant(e)) for e in b.elts]
        found[key] = entry
    return dict(sorted(found.items()))


def lines(z):
    out = {}
    for key, (file, marker) in LINES.items():
        for node in ast.walk(parse(z, file)):
            t = template(node)
            if t and marker in t:
                out[key] = t
                break
    return out


def api_key_exempt(z):
    for fn in ast.walk(parse(z, "utils/auth.py")):
        if isinstance(fn, ast.FunctionDef) and fn.name == "decide_request_auth":
            return [
                n.args[0].value
                for n in ast.walk(fn)
                if isinstance(n, ast.Call)
                and getattr(n.func, "attr", None) == "startswith"
                and n.args
                and isinstance(n.args[0], ast.Constant)
            ]
    return []


def env(z):
    out = {}
    for node in ast.walk(parse(z, "environ.py")):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.startswith("SGLANG_DISAGGREGATION_")
            and isinstance(node.value, ast.Call)
            and node.value.args
            and isinstance(node.value.args[0], ast.Constant)
        ):
            out[node.targets[0].id] = node.value.args[0].value
    return dict(sorted(out.items()))


def server_args(z):
    out = {}
    for name in z.namelist():
        if not (name.startswith(SRT + "arg_groups/fields/") and name.endswith(".py")):
            continue
        for node in ast.walk(parse(z, name[len(SRT):])):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id in SERVER_ARGS
                and isinstance(node.value, ast.Constant)
            ):
                out[node.target.id] = node.value.value
    return dict(sorted(out.items()))


def sleeps_in(fn):
    """The constant arguments of every `*.sleep(N)` call in a function, in source order."""
    calls = [
        n for n in ast.walk(fn)
        if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "sleep" and n.args and isinstance(n.args[0], ast.Constant)
    ]
    return [c.args[0].value for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset))]


def shutdown(z):
    """How a SIGTERM stop and `/health` behave: whether `TokenizerManager.generate_request`
    looks at `gracefully_exit` (it does not: a draining server takes new requests), the
    watchdog's period (`sigterm_watchdog`'s first sleep) and `health_generate`'s poll (its sleep
    before it looks for the health request's answer)."""
    out = {}
    for fn in ast.walk(parse(z, "managers/tokenizer_manager.py")):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name == "generate_request":
            out["serves_while_draining"] = not any(isinstance(n, ast.Attribute) and n.attr == "gracefully_exit" for n in ast.walk(fn))
        if isinstance(fn, ast.AsyncFunctionDef) and fn.name == "sigterm_watchdog":
            out["watchdog_secs"] = next(iter(sleeps_in(fn)), None)
    for fn in ast.walk(parse(z, "entrypoints/http_server.py")):
        if isinstance(fn, ast.AsyncFunctionDef) and fn.name == "health_generate":
            out["health_generate_poll_secs"] = next(iter(sleeps_in(fn)), None)
    return dict(sorted(out.items()))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: sglang_facts.py WHEEL")
    with zipfile.ZipFile(sys.argv[1]) as z:
        version = next(
            (n.split("/")[0][: -len(".dist-info")].split("-", 1)[1] for n in z.namelist() if n.endswith(".dist-info/METADATA")),
            None,
        )
        facts = {
            "version": version,
            "routes": routes(z),
            "metrics": metrics(z),
            "series": series(z),
            "lines": lines(z),
            "api_key_exempt": api_key_exempt(z),
            "env": env(z),
            "server_args": server_args(z),
            "shutdown": shutdown(z),
        }
    json.dump(facts, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
