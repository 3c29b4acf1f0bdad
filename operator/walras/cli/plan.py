"""``walras plan -f FILES_OR_DIRS [-o table|json|yaml] [--emit-pods FILE]``: plan offline from manifests (YAML, or
JSON such as ``kubectl get pods -o json``).

A dry run users can pipe: ``-o json`` (compact; ``--indent N`` to indent; ``--json`` is the same as ``-o json``) and
``-o yaml`` print the whole plan; ``--emit-pods FILE`` writes the Pod manifests the operator would create, bound to
their planned nodes (``--unbound``: left Pending, as extender mode creates them). Feeding them back
(``walras plan -f DIR -f FILE``) gives a plan with no action: re-planning an unchanged cluster is a fixed point.

Progress (issue 29: nothing was printed for 34 s on a 5,000-job file): with ``--progress``, or by default when stderr
is a terminal and the manifests add up to at least :data:`PROGRESS_BYTES`, each step that may take seconds (reading
and validating the manifests with the planner's imports, planning, writing ``--emit-pods``) is reported on stderr by
:func:`walras.cli.progress.step`; stdout carries only the plan.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from walras.cli.errors import UsageError

#: The process ends without the interpreter's teardown once the plan is written (see :mod:`walras.cli`).
EXIT_WITHOUT_TEARDOWN = True

#: Manifests of at least this many bytes in all show progress on a terminal by default (1 MiB: about 2,000 pods, a
#: plan of a second or more on a laptop; smaller inputs plan faster than a spinner is worth).
PROGRESS_BYTES = 1 << 20


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
    parser.add_argument("--tenants", action=argparse.BooleanOptionalAction, default=True,
                        help="plan tenants' budgets as a Fisher market, as `walras run` does (docs/budgets.md; "
                             "default: on; --no-tenants: every job its own buyer, the papers' per-job utilities)")
    parser.add_argument("--default-share", type=float, default=1.0, metavar="SHARE",
                        help="with --tenants: the share of a namespace no Budget selects (default 1)")
    parser.add_argument("--no-validate", dest="validate", action="store_false",
                        help="do not check Walras objects against the CRDs' schemas and rules")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="report each step (reading, planning, writing pods) on stderr (default: when stderr "
                             "is a terminal and the manifests add up to 1 MiB or more)")
    return parser


def input_bytes(paths: list[str]) -> int:
    """Total size of the manifest files ``paths`` names (directories searched as :func:`load_manifests` searches
    them: *.yaml, *.yml, *.json); a path that cannot be read counts 0 (the loader reports it)."""
    total = 0
    for path in paths:
        if os.path.isdir(path):
            for root, _, names in os.walk(path):
                total += sum(_size(os.path.join(root, n)) for n in names if n.endswith((".yaml", ".yml", ".json")))
        else:
            total += _size(path)
    return total


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def show_progress(choice: bool | None, paths: list[str], terminal: bool) -> bool:
    """Whether ``walras plan`` reports its steps: ``--progress``/``--no-progress`` decide; by default only on a
    terminal, for manifests of at least :data:`PROGRESS_BYTES`."""
    if choice is not None:
        return choice
    return terminal and input_bytes(paths) >= PROGRESS_BYTES


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
    tenants = getattr(plan, "tenants", {})
    if tenants:
        rows = [["TENANT", "BUDGET", "SHARE", "SPEND/H", "PRICED", "UNITS", "CAPS", "NAMESPACES"]]
        for t in tenants.values():
            rows.append([t.name, t.budget or "-", _cell(t.share), _cell(t.spend_rate), _cell(t.priced_spend),
                         ",".join(f"{k}={v:.4g}" for k, v in t.units.items()) or "-",
                         ",".join(f"{k}={v:.4g}" for k, v in t.caps.items()) or "-", ",".join(t.namespaces)])
        out += [_table(rows, right={2, 3, 4}), ""]
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
    reused = " (the previous plan's result: its inputs were equal, no solve ran)" if s.reused else ""
    out += ["", f"solver: {s.iterations} evaluations in {s.rounds} round(s), gap {s.gap:.3g}, "
                f"converged {s.converged}, {s.seconds:.3f} s{reused}; plan {plan.seconds:.3f} s"]
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
    from walras.kube.encode import pod_manifest

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
    """:func:`walras.manifests.loader.load_manifests` shared between this process and a forked child while this one
    imports the planner.

    ``walras plan`` needs both the manifests (YAML decoding and CRD validation: about 2.5 s of CPU for 20,000 pods)
    and the planner's imports; neither needs the other. The files are cut into pieces of whole documents
    (:func:`~walras.manifests.loader.split_manifests`). The child is forked before the planner is imported (nothing
    to copy but the interpreter, PyYAML, the pieces and this package's command line) and imports only the reader
    (:mod:`walras.manifests.loader`, :mod:`walras.manifests.schema`; ``walras.planner`` imports the planner only on
    first use of ``build_plan``). It takes pieces from the front of a shared queue; this process, once its imports
    are done, takes pieces from the back (:meth:`result`), so on two cores the reading is split between both in
    whatever proportion the imports leave, with no tuning. Pieces that may hold Walras objects (their bytes name
    ``walras.dev/v1``) come first in the queue, so the child, which validates first, is the one that pays for the
    validator's start-up (the CEL grammar). The queue is two indices in shared memory, taken under a lock (one byte
    passed through a pipe). The child sends one message, a format byte then the body:

    ======  ===================================================================================================
    byte    body
    ======  ===================================================================================================
    ``m``   ``marshal`` of ``[[piece index, {snapshot field: objects}], ...]`` for the pieces it decoded
    ``p``   ``pickle`` of the same, when marshal cannot write a value (a YAML timestamp or binary)
    ``e``   it met a user error (it stops, and so does this process)
    ======  ===================================================================================================

    Route table of :meth:`result`: every piece decoded, by either process -> the snapshot; a user error on either side
    (``e``, or a ``ValueError`` here), a child that crashed or was killed, or a bug in the reader (a piece missing)
    -> ``None``, and the caller reads the manifests itself with
    :func:`~walras.manifests.loader.load_manifests`, which gives the error message of a sequential read (a
    piece's YAML line numbers count from its start) and a bug its traceback. No read-ahead (:meth:`start` returns
    ``None``) where there is no ``os.fork``, where the planner is already imported (an in-process caller such as
    the tests: nothing to overlap), where other threads run (forking them is unsafe), for a path that does not exist
    (the caller's read reports it), or with ``WALRAS_READ_AHEAD=0``.
    """

    pid: int
    fd: int
    #: the paths given (files or directories) and the manifest files found under them
    paths: list[str]
    files: list[Any]
    pieces: list[tuple[int, bytes]]
    #: the order pieces are taken in (indices into ``pieces``): the child from the front, this process from the back
    order: list[int]
    #: shared memory: front, back (positions in ``order``), failed (a user error was met), each an int64
    board: Any
    #: the lock: a pipe holding one byte while nobody holds it
    lock: tuple[int, int]
    validate: bool

    @classmethod
    def prepare(cls, files: list[str], *, validate: bool) -> ReadAhead | None:
        """The shared queue of ``files``' pieces, before any process takes one (``pid`` -1, ``fd`` -1; :meth:`start`
        forks the child); ``None`` for a path that does not exist or holds no manifest file."""
        import mmap

        from walras.manifests.loader import split_manifests

        try:
            found, pieces = split_manifests(files)
        except (ValueError, OSError):
            return None
        order = sorted(range(len(pieces)), key=lambda k: (b"walras.dev/v1" not in pieces[k][1], k))
        board = mmap.mmap(-1, 24)  # anonymous and shared with the forked child
        _BOARD.pack_into(board, 0, 0, len(order), 0)
        read_end, write_end = os.pipe()
        os.write(write_end, b"\0")
        return cls(-1, -1, list(files), found, pieces, order, board, (read_end, write_end), validate)

    @classmethod
    def start(cls, files: list[str], *, validate: bool) -> ReadAhead | None:
        """Fork the reader of ``files``; ``None`` where no read-ahead is done (see the class)."""
        import threading

        if (not hasattr(os, "fork") or "walras.planner.plan" in sys.modules or threading.active_count() != 1
                or os.environ.get("WALRAS_READ_AHEAD") == "0"):
            return None
        ahead = cls.prepare(files, validate=validate)
        if ahead is None:
            return None
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child (covered by tests/test_cli_plan_read_ahead.py in a subprocess)
            import gc

            gc.disable()  # the child exits right after its message: nothing to collect
            os.close(read_end)
            status = 1
            try:
                _child(ahead, write_end)
                status = 0
            finally:
                os._exit(status)
        os.close(write_end)
        ahead.pid, ahead.fd = pid, read_end
        return ahead

    @contextlib.contextmanager
    def _board(self) -> Iterator[tuple[int, int, int]]:
        """The queue's ``(front, back, failed)`` read under the lock, which is held until the block ends."""
        os.read(self.lock[0], 1)
        try:
            yield _BOARD.unpack_from(self.board)
        finally:
            os.write(self.lock[1], b"\0")

    def take(self, front: bool) -> int | None:
        """The index of the next piece to decode (from the front of the queue or its back), or ``None`` when none
        is left or a user error was met."""
        with self._board() as (lo, hi, failed):
            if failed or lo >= hi:
                return None
            if front:
                _BOARD.pack_into(self.board, 0, lo + 1, hi, failed)
                return self.order[lo]
            _BOARD.pack_into(self.board, 0, lo, hi - 1, failed)
            return self.order[hi - 1]

    def fail(self) -> None:
        """Stop both processes taking pieces (a user error was met: the caller's sequential read reports it)."""
        with self._board() as (lo, hi, _):
            _BOARD.pack_into(self.board, 0, lo, hi, 1)

    def decode(self, index: int) -> Any:
        """The snapshot of piece ``index`` (``ValueError`` for a user error)."""
        from walras.manifests.loader import load_piece

        k, data = self.pieces[index]
        return load_piece(self.files[k], data, validate=self.validate)

    def result(self) -> Any:
        """Decode pieces from the back of the queue until none is left, then join them with the child's: the
        :class:`~walras.planner.model.Snapshot` of every file; ``None`` where the caller must read the manifests
        itself (route table in the class)."""
        import marshal
        import pickle

        from walras.manifests.loader import KINDS, join_snapshots
        from walras.planner.model import Snapshot

        done: dict[int, Any] = {}
        failed = False
        while (index := self.take(front=False)) is not None:
            try:
                done[index] = self.decode(index)
            except ValueError:
                self.fail()
                failed = True
                break
        with os.fdopen(self.fd, "rb", closefd=False) as pipe:
            data = pipe.read()
        tag, body = data[:1], memoryview(data)[1:]
        if failed or tag not in (b"m", b"p"):
            return None
        for index, fields in marshal.loads(body) if tag == b"m" else pickle.loads(body):
            done[index] = Snapshot(**{name: tuple(fields[name]) for name in KINDS.values()})
        if sorted(done) != list(range(len(self.pieces))):
            return None
        return join_snapshots([done[k] for k in range(len(self.pieces))], self.paths, len(self.files))

    def close(self) -> None:
        """Close the pipes and the shared memory, reap the child (killed first if it is still running)."""
        import signal

        for fd in (self.fd, *self.lock):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.board.close()
        if self.pid > 0:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)


_BOARD = struct.Struct("qqq")


def _child(ahead: ReadAhead, fd: int) -> None:
    """The read-ahead child's work (:class:`ReadAhead`): decode pieces from the front of the queue until none is
    left, write one message to ``fd`` and close it."""
    import marshal
    import pickle

    from walras.manifests.loader import KINDS

    results: list[list[Any]] = []
    message = b""
    while (index := ahead.take(front=True)) is not None:
        try:
            snap = ahead.decode(index)
        except ValueError:
            ahead.fail()
            message = b"e"
            break
        results.append([index, {name: list(getattr(snap, name)) for name in KINDS.values()}])
    if not message:
        try:
            message = b"m" + marshal.dumps(results)
        except ValueError:
            message = b"p" + pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(message)
    while view:
        view = view[os.write(fd, view):]
    os.close(fd)


def plan_json(plan: Any, indent: int | None = None) -> bytes:
    """The plan as JSON (UTF-8): compact by ``orjson`` (ten times faster than ``json.dumps`` on a 20,000-pod plan;
    the same values, numbers in their shortest form), indented by ``json.dumps`` with ``indent`` spaces (orjson
    indents by two only)."""
    import json

    from walras.kube.encode import plan_document

    as_dict = plan_document(plan)
    if indent:
        return json.dumps(as_dict, indent=indent, ensure_ascii=False).encode()
    import orjson

    return orjson.dumps(as_dict)


def run(args: argparse.Namespace) -> int:
    """Load the manifests, build the plan, print it (and write the pods); user errors raise :class:`UsageError`.

    The cyclic garbage collector is paused for the whole command and restored at its end: the manifests (hundreds of
    thousands of small dicts for 20,000 pods) and the plan allocate millions of objects that live until the command
    ends, and each full collection walks them all again. On the 5,000-node bench cluster the collector took 0.6-1.0 s
    of a 2.4-2.6 s plan and 0.2 s of ``plan_document`` (load ~2), while the peak RSS was the same without it (290 MiB:
    a plan makes little cyclic garbage; :func:`walras.collector.paused`)."""
    from walras.collector import paused

    with paused():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import yaml

    from walras.cli.progress import step

    show = show_progress(getattr(args, "progress", None), args.files, sys.stderr.isatty())
    # Reading and validating the manifests (seconds of CPU for 20,000 pods) is shared with a forked reader process
    # that starts while this one imports the planner, where that is possible (see ReadAhead); otherwise it runs here
    # after the imports.
    with step("walras plan", f"reading {len(args.files)} manifest path(s) and loading the planner", enabled=show):
        ahead = ReadAhead.start(args.files, validate=args.validate)
        try:
            from walras.manifests import load_manifests
            from walras.planner import build_plan

            try:
                snapshot = ahead.result() if ahead is not None else None
                if snapshot is None:
                    snapshot = load_manifests(args.files, validate=args.validate)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        finally:
            if ahead is not None:
                ahead.close()
    from walras.kube.decode import cluster_from
    from walras.planner.cluster import TenantOptions
    from walras.planner.results import PlanOptions

    tenants = TenantOptions(default_share=args.default_share) if getattr(args, "tenants", True) else None
    with step("walras plan", f"planning {len(snapshot.nodes)} node(s), {len(snapshot.jobs)} FungibleJob(s), "
              f"{len(snapshot.pods)} pod(s)", enabled=show):
        plan = build_plan(cluster_from(snapshot), options=PlanOptions(tenants=tenants))
    if args.emit_pods:
        with step("walras plan", f"writing the pods to {args.emit_pods}", enabled=show):
            pods = emitted_pods(plan, snapshot, bound=not args.unbound)
            try:
                with open(args.emit_pods, "w") as handle:
                    yaml.dump_all(pods, handle, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                                  sort_keys=False)
            except OSError as exc:
                raise UsageError(f"cannot write {args.emit_pods}: {exc.strerror or exc}") from None
    # The manifests are no longer needed: freed here, their memory holds the output's objects (the process's peak
    # RSS is reached while writing the plan of 20,000 pods).
    del snapshot
    output = "json" if args.json else (args.output or "table")
    if output == "json":
        data = plan_json(plan, args.indent) + b"\n"
        binary = getattr(sys.stdout, "buffer", None)
        if binary is None:  # a text-only stream (an in-process caller's StringIO)
            sys.stdout.write(data.decode())
        else:
            sys.stdout.flush()
            binary.write(data)
    elif output == "yaml":
        from walras.kube.encode import plan_document

        yaml.dump(plan_document(plan), sys.stdout, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                  sort_keys=False)
    else:
        print(render(plan))
    return 0
