"""``walras plan -f FILES_OR_DIRS [-o table|json|yaml] [--emit-pods FILE]``: plan offline from manifests (YAML, or
JSON such as ``kubectl get pods -o json``).

A dry run users can pipe: ``-o json`` (compact; ``--indent N`` to indent; ``--json`` is the same as ``-o json``) and
``-o yaml`` print the whole plan; ``--emit-pods FILE`` writes the Pod manifests the operator would create, bound to
their planned nodes (``--unbound``: left Pending, as extender mode creates them). Feeding them back
(``walras plan -f DIR -f FILE``) gives a plan with no action: re-planning an unchanged cluster is a fixed point.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from walras.cli.errors import UsageError

#: The process ends without the interpreter's teardown once the plan is written (see :mod:`walras.cli`).
EXIT_WITHOUT_TEARDOWN = True


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``walras plan`` and its options."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="plan offline from YAML manifests (nodes, pods, ResourcePools, FungibleJobs, ColocationProfiles)",
        description="Run the planner on YAML manifests and print prices, allocations and pod placements.",
    )
    parser.add_argument("-f", "--filename", dest="files", action="append", required=True, metavar="FILES_OR_DIRS",
                        help="a YAML or JSON file, or a directory searched recursively for *.yaml, *.yml and "
                             "*.json (repeatable)")
    parser.add_argument("-o", "--output", choices=("table", "json", "yaml"), default=None,
                        help="output format (default: table)")
    parser.add_argument("--json", action="store_true", help="the same as -o json")
    parser.add_argument("--indent", type=int, default=None, metavar="N", help="indent JSON output by N spaces")
    parser.add_argument("--emit-pods", metavar="FILE", default=None,
                        help="write the Pod manifests the operator would create (bound to their planned nodes)")
    parser.add_argument("--unbound", action="store_true",
                        help="with --emit-pods: leave the pods Pending and unbound (extender mode)")
    parser.add_argument("--no-validate", dest="validate", action="store_false",
                        help="do not check Walras objects against the CRDs' schemas and rules")
    return parser


def _cell(value: float) -> str:
    return f"{value:.4g}"


def render(plan: Any) -> str:
    """Tables of pools (prices), jobs (priced and placed) and pods (actions), then warnings and the solver."""
    rows = [["POOL", "RESOURCE", "POLICY", "NODES", "CAPACITY", "USED", "PRICE", "UTIL"]]
    for name, p in plan.pools.items():
        rows.append([name, p.resource or "-", p.policy or "-", str(p.node_count), _cell(p.capacity), _cell(p.used),
                     _cell(p.price), f"{p.utilisation:.0%}"])
    out = [_table(rows, right={3, 4, 5, 6, 7}), ""]
    rows = [["JOB", "PHASE", "ALLOCATION", "WANTED", "PLACED", "THROUGHPUT", "COST", "REASON"]]
    for job in plan.jobs.values():
        scheduled = next((c for c in job.conditions if c.type in ("Scheduled", "Schedulable", "Valid")
                          and c.status == "False"), None)
        rows.append([f"{job.namespace}/{job.name}", job.phase, job.allocation_text or "-",
                     str(sum(job.wanted.values())), str(sum(job.replicas.values())),
                     _cell(job.throughput), _cell(job.cost), scheduled.reason if scheduled else ""])
    out += [_table(rows, right={3, 4, 5, 6}), ""]
    rows = [["POD", "ACTION", "POOL", "NODE", "REQUESTS"]]
    for pod in plan.pods:
        requests = ",".join(f"{k}={v}" for k, v in pod.requests.items()) or "-"
        rows.append([f"{pod.namespace}/{pod.name}", pod.action, pod.pool or "-", pod.node or "-", requests])
    out.append(_table(rows))
    warnings = [e for e in plan.events if e.type == "Warning"]
    if warnings:
        out += ["", "WARNINGS"]
        for e in warnings:
            out.append(f"{e.kind}/{e.namespace + '/' if e.namespace else ''}{e.name}: {e.reason}: {e.message}")
    s = plan.solver
    out += ["", f"solver: {s.iterations} evaluations in {s.rounds} round(s), gap {s.gap:.3g}, "
                f"converged {s.converged}, {s.seconds:.3f} s; plan {plan.seconds:.3f} s"]
    return "\n".join(out)


def _table(rows: list[list[str]], right: set[int] | None = None) -> str:
    """Columns padded to their widest cell (right-aligned where numeric), two spaces apart."""
    right = right or set()
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.rjust(widths[c]) if c in right else cell.ljust(widths[c]) for c, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def emitted_pods(plan: Any, snapshot: Any, *, bound: bool) -> list[dict[str, Any]]:
    """The Pod manifests the operator would create for ``plan`` (``create`` actions), each bound to its planned
    node (status Running) or, with ``bound=False``, Pending and unbound; the jobs' own ``metadata.uid`` owns them
    (a stand-in uid derived from the name where the manifest has none)."""
    from walras.operator.translate import pod_manifest

    jobs = {((j.get("metadata") or {}).get("namespace") or "default", (j.get("metadata") or {}).get("name")): j
            for j in snapshot.jobs}
    out = []
    for pp in plan.pods:
        if pp.action != "create" or pp.node is None:
            continue
        job = dict(jobs[(pp.namespace, pp.job)])
        meta = dict(job.get("metadata") or {})
        meta.setdefault("uid", f"offline-{pp.namespace}-{pp.job}")
        job["metadata"] = meta
        pod = pod_manifest(job, pp, "walras-scheduler")
        if bound:
            pod["spec"]["nodeName"] = pp.node
        pod["status"] = {"phase": "Running" if bound else "Pending"}
        out.append(pod)
    return out


@dataclass
class ReadAhead:
    """:func:`walras.planner.manifests.load_manifests` run in a forked child process while this one imports the
    planner, the result sent back through a pipe.

    ``walras plan`` needs both the manifests (YAML decoding and CRD validation: about 3 s for 20,000 pods) and the
    planner's imports (torch: about 2.5 s); neither needs the other, so on a machine with a second idle core the
    whole process waits for the longer of the two instead of their sum. The child is forked before torch is
    imported (nothing to copy but the interpreter, PyYAML and this package's command line) and imports only the
    reader: :mod:`walras.planner.manifests` and :mod:`walras.planner.schema` (``walras.planner`` imports the planner,
    and with it torch, only on first use of ``build_plan``). It sends one message, a format byte then the body:

    ======  ===================================================================================================
    byte    body
    ======  ===================================================================================================
    ``m``   ``marshal`` of the snapshot's five lists of objects (Nodes, Pods, pools, jobs, profiles)
    ``p``   ``pickle`` of the same, when marshal cannot write a value (a YAML timestamp or binary)
    ``e``   a user error (``ValueError``: the file and object named), UTF-8, raised here as it would be in-process
    ======  ===================================================================================================

    Anything else (the child crashed or was killed, a bug in the reader) makes :meth:`result` return ``None`` and the
    caller reads the manifests itself, so a bug keeps its traceback. No read-ahead (:meth:`start` returns ``None``)
    where there is no ``os.fork``, where torch is already imported (nothing to overlap: in-process callers such as
    the tests), where other threads run (forking them is unsafe), or with ``WALRAS_READ_AHEAD=0``.
    """

    pid: int
    fd: int

    @classmethod
    def start(cls, files: list[str], *, validate: bool) -> ReadAhead | None:
        """Fork the reader of ``files``; ``None`` where no read-ahead is done (see the class)."""
        import os
        import threading

        if (not hasattr(os, "fork") or "torch" in sys.modules or threading.active_count() != 1
                or os.environ.get("WALRAS_READ_AHEAD") == "0"):
            return None
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child (covered by tests/test_cli_plan_read_ahead.py in a subprocess)
            os.close(read_end)
            status = 1
            try:
                _child(files, validate, write_end)
                status = 0
            finally:
                os._exit(status)
        os.close(write_end)
        return cls(pid, read_end)

    def result(self) -> Any:
        """The child's :class:`~walras.planner.model.Snapshot`; ``ValueError`` for a user error it found; ``None``
        where it sent nothing usable (the caller reads the manifests itself)."""
        import marshal
        import os
        import pickle

        from walras.planner.model import Snapshot

        with os.fdopen(self.fd, "rb", closefd=False) as pipe:
            data = pipe.read()
        tag, body = data[:1], memoryview(data)[1:]
        if tag == b"e":
            raise ValueError(bytes(body).decode())
        if tag not in (b"m", b"p"):
            return None
        fields = marshal.loads(body) if tag == b"m" else pickle.loads(body)
        return Snapshot(**{name: tuple(objs) for name, objs in fields.items()})

    def close(self) -> None:
        """Close the pipe and reap the child (killed first if it is still running)."""
        import contextlib
        import os
        import signal

        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)


def _child(files: list[str], validate: bool, fd: int) -> None:  # pragma: no cover - runs in the forked child
    """The read-ahead child's work (:class:`ReadAhead`): load, validate, write one message to ``fd``."""
    import gc
    import marshal
    import os
    import pickle

    gc.disable()  # the process exits right after: nothing to collect
    from walras.planner.manifests import KINDS, load_manifests  # no torch: walras.planner imports build_plan lazily

    try:
        snapshot = load_manifests(files, validate=validate)
    except ValueError as exc:
        message = b"e" + str(exc).encode()
    else:
        fields = {name: list(getattr(snapshot, name)) for name in KINDS.values()}
        try:
            message = b"m" + marshal.dumps(fields)
        except ValueError:
            message = b"p" + pickle.dumps(fields, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(message)
    while view:
        view = view[os.write(fd, view):]
    os.close(fd)


def run(args: argparse.Namespace) -> int:
    """Load the manifests, build the plan, print it (and write the pods); user errors raise :class:`UsageError`."""
    import gc
    import json

    import yaml

    # Reading and validating the manifests (seconds for 20,000 pods) overlaps importing the planner (torch: seconds
    # too) in a forked reader process where that is possible (see ReadAhead); otherwise it runs here after the imports.
    ahead = ReadAhead.start(args.files, validate=args.validate)
    try:
        from walras.planner import build_plan, load_manifests

        # This command owns its process: the manifests (hundreds of thousands of small dicts for 20,000 pods) are
        # built without the cyclic collector and then frozen with everything alive (gc.freeze), so no collection
        # during planning walks them again; what the planner allocates afterwards is collected as usual. Validated
        # here (no read-ahead), one collection first frees the validator's cyclic garbage; read ahead, the child
        # made that garbage, and a collection here would only walk torch's modules (0.3 s).
        gc.disable()
        try:
            snapshot = ahead.result() if ahead is not None else None
            if snapshot is None:
                snapshot = load_manifests(args.files, validate=args.validate)
                gc.collect()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        finally:
            gc.freeze()
            gc.enable()
    finally:
        if ahead is not None:
            ahead.close()
    plan = build_plan(snapshot)
    if args.emit_pods:
        pods = emitted_pods(plan, snapshot, bound=not args.unbound)
        try:
            with open(args.emit_pods, "w") as handle:
                yaml.dump_all(pods, handle, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)
        except OSError as exc:
            raise UsageError(f"cannot write {args.emit_pods}: {exc.strerror or exc}") from None
    # The manifests are no longer needed: freed here, their memory holds the output's objects (the process's peak
    # RSS is reached while writing the plan of 20,000 pods).
    del snapshot
    output = "json" if args.json else (args.output or "table")
    if output == "json":
        as_dict = plan.to_dict()
        text = json.dumps(as_dict, indent=args.indent, separators=None if args.indent else (",", ":"))
        del as_dict
        sys.stdout.write(text)
        sys.stdout.write("\n")
    elif output == "yaml":
        yaml.dump(plan.to_dict(), sys.stdout, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)
    else:
        print(render(plan))
    return 0
