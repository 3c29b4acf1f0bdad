"""Benchmark of the scheduler extender: ``filter`` and ``prioritize`` on a 5,000-node ``nodenames`` request.

Issue 7's target: p99 <= 10 ms per request for ``filter`` and for ``prioritize`` with 5,000 node names. The plan
behind the extender has 20,000 pods (1,000 jobs x 20) on 5,000 nodes, the planner benchmark's size. Requests are
``ExtenderArgs`` as kube-scheduler sends them (Go field names ``Pod``, ``Nodes: null``, ``NodeNames``). Each request
is a real HTTP POST on loopback (aiohttp client -> the extender's aiohttp app: body read under the size and time
limits, JSON decode, validation, plan lookup, JSON encode); the in-process column times ``Extender.respond`` (the
handler without HTTP). With ``--baseline REV`` the extender module of git revision ``REV`` is loaded too and timed
in-process on the same requests, interleaved run by run (its answer path: decode + verb + encode). Every figure is the
median over ``--runs`` (>= 5) runs of the per-run percentile over ``--requests`` requests.

Usage: ``python -m bench.extender [--quick] [--runs 5] [--requests 200] [--baseline REV]``; writes
``docs/bench/extender.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import ClientSession, web
from walras.extender import Extender
from walras.planner.model import Plan, PodPlan

from bench._machine import cpu_model

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "bench" / "extender.md"


def synthetic_plan(nodes: int, jobs: int, pods_per_job: int, seed: int = 0) -> tuple[Plan, list[str]]:
    rng = np.random.default_rng(seed)
    names = [f"node-{i:05d}" for i in range(nodes)]
    placement = rng.integers(0, nodes, size=jobs * pods_per_job)
    plan = Plan()
    k = 0
    for j in range(jobs):
        for r in range(pods_per_job):
            plan.pods.append(PodPlan("bench", f"job-{j:04d}-{r}", f"job-{j:04d}", f"pool-{j % 10}",
                                     names[int(placement[k])], {"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "1"}))
            k += 1
    return plan, names


def request_body(names: list[str], pod: str) -> dict[str, object]:
    return {"Pod": {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod, "namespace": "bench", "uid": "u",
                                 "labels": {"walras.dev/managed": "true", "walras.dev/job": pod.rsplit("-", 1)[0]}},
                    "spec": {"schedulerName": "walras-scheduler", "containers": [{"name": "c", "image": "x"}]}},
            "Nodes": None, "NodeNames": names}


def baseline_extender(rev: str, plan: Plan) -> Any:
    """The ``Extender`` of ``operator/walras/extender/server.py`` at git revision ``rev``, over ``plan``."""
    source = subprocess.run(["git", "show", f"{rev}:operator/walras/extender/server.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"walras_extender_{rev}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"walras_extender_{rev}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Extender(lambda: plan)


def baseline_answer(extender: Any, verb: str, body: bytes) -> bytes:
    parsed = json.loads(body)
    if verb == "filter":
        return json.dumps(extender.filter(parsed), separators=(",", ":")).encode()
    return bytes(extender.prioritize_json(parsed))


async def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    plan, names = synthetic_plan(args.nodes, args.jobs, args.pods_per_job)
    extender = Extender(lambda: plan)
    runner = web.AppRunner(extender.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    bodies = [json.dumps(request_body(names, plan.pods[i * 7 % len(plan.pods)].name)).encode()
              for i in range(args.requests)]
    extender.index()  # the index is built once per plan, not per request
    baseline = baseline_extender(args.baseline, plan) if args.baseline else None
    if baseline is not None:
        baseline.index()
    results: dict[str, dict[str, list[float]]] = {}
    async with ClientSession() as session:
        for verb in ("filter", "prioritize"):
            url = f"http://127.0.0.1:{port}/scheduler/{verb}"
            per_run: dict[str, list[float]] = {"http_p50": [], "http_p99": [], "inproc_p50": [], "inproc_p99": []}
            if baseline is not None:
                per_run.update(base_p50=[], base_p99=[])
            for _ in range(args.runs):
                http, inproc, base = [], [], []
                for body in bodies:
                    t0 = time.perf_counter()
                    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                        payload = await resp.read()
                    http.append(time.perf_counter() - t0)
                    if resp.status != 200:
                        raise RuntimeError(f"{verb}: HTTP {resp.status}: {payload[:200]!r}")
                    t0 = time.perf_counter()
                    status, _ = await extender.respond(verb, body)
                    inproc.append(time.perf_counter() - t0)
                    if status != 200:
                        raise RuntimeError(f"{verb}: in-process answer {status}")
                    if baseline is not None:
                        t0 = time.perf_counter()
                        baseline_answer(baseline, verb, body)
                        base.append(time.perf_counter() - t0)
                per_run["http_p50"].append(float(np.percentile(http, 50)) * 1e3)
                per_run["http_p99"].append(float(np.percentile(http, 99)) * 1e3)
                per_run["inproc_p50"].append(float(np.percentile(inproc, 50)) * 1e3)
                per_run["inproc_p99"].append(float(np.percentile(inproc, 99)) * 1e3)
                if base:
                    per_run["base_p50"].append(float(np.percentile(base, 50)) * 1e3)
                    per_run["base_p99"].append(float(np.percentile(base, 99)) * 1e3)
            results[verb] = per_run
    await runner.cleanup()
    return {verb: {k: statistics.median(v) for k, v in runs.items()} for verb, runs in results.items()}


def write(args: argparse.Namespace, med: dict[str, dict[str, float]], seconds: float) -> str:
    import torch

    command = "python -m bench.extender" + (" --quick" if args.quick else "") + (
        f" --baseline {args.baseline}" if args.baseline else "")
    load = os.getloadavg()
    lines = [
        "## Scheduler extender (`bench/extender.py`)",
        "",
        f"Command: `{command}` (runs={args.runs}, requests per run={args.requests}, nodes={args.nodes}, "
        f"plan pods={args.jobs * args.pods_per_job}). Machine: {os.cpu_count()} CPUs, {cpu_model()}; "
        f"Python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}; "
        f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; took {seconds:.1f} s; load average at the end "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min; the machine is shared).",
        "",
        "Each request is an `ExtenderArgs` as kube-scheduler sends it (`Pod`, `Nodes: null`, `NodeNames`) for a "
        "Walras-managed pod. HTTP is a POST on loopback (aiohttp client and server in one process); in-process is "
        "`Extender.respond` (decode, validation, verb, encode) without HTTP"
        + (f"; baseline is the extender of revision `{args.baseline}` on the same requests in the same process, "
           "interleaved with the current one" if args.baseline else "")
        + ". Figures are medians over runs of the per-run percentile, in milliseconds.",
        "",
        "| verb | nodes | HTTP p50 (ms) | HTTP p99 (ms) | in-process p50 (ms) | in-process p99 (ms) |"
        + (" baseline p50 (ms) | baseline p99 (ms) |" if args.baseline else "") + " target p99 |",
        "|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if args.baseline else "") + "---|",
    ]
    for verb, m in med.items():
        ok = "met" if m["http_p99"] <= 10.0 else "NOT met"
        base = f" {m['base_p50']:.2f} | {m['base_p99']:.2f} |" if args.baseline else ""
        lines.append(f"| {verb} | {args.nodes} | {m['http_p50']:.2f} | {m['http_p99']:.2f} | {m['inproc_p50']:.2f} "
                     f"| {m['inproc_p99']:.2f} |{base} <= 10 ms ({ok}) |")
    lines += ["", "The target comes from issue 7 (no paper reports extender latency)."]
    text = "\n".join(lines) + "\n"
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.extender", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--pods-per-job", type=int, default=20)
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also time the extender of this git revision in-process (e.g. c2d9107)")
    args = parser.parse_args(argv)
    if args.runs < 5:
        parser.error("--runs must be at least 5 (every timing is a median of >= 5 runs)")
    if args.requests is None:
        args.requests = 40 if args.quick else 300
    started = time.perf_counter()
    med = asyncio.run(measure(args))
    print(write(args, med, time.perf_counter() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
