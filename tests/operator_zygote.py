"""A fork server for operator replicas (this module holds no tests): it imports what ``walras run`` imports once, then
forks one replica process per request, so a test that kills and restarts the operator many times does not pay the
imports (about 20 s each on a loaded 2-core machine) on every restart.

``python tests/operator_zygote.py`` reads one JSON object per line on stdin,
``{"argv": [...], "log": PATH, "env": {...}}``, forks, and in the child runs :func:`test_ha_support._replica` with
``argv`` (the arguments after ``replica``), stdout and stderr into ``log`` and ``env`` added to the environment; it
answers the child's pid on stdout, one per line. Children are real processes: a test ends them with ``SIGKILL`` like
any other. The zygote reaps them itself (``SIGCHLD`` ignored), so a killed child's pid is gone at once. It exits
when stdin closes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _preload() -> None:
    """What a replica imports before it serves (the cost the fork saves)."""
    import aiohttp  # noqa: F401
    import kopf  # noqa: F401
    import test_ha_support  # noqa: F401
    import walras.cli.run
    import walras.extender
    import walras.kube.decode
    import walras.manifests
    import walras.operator
    import walras.operator.leader
    import walras.planner
    from test_ha_support import MANIFESTS

    # one plan of the e2e scenario: the planner's lazy imports and its numba kernels (from the on-disk cache) are
    # loaded here, once, instead of stalling every forked replica's first plan
    snapshot = walras.manifests.load_manifests([str(MANIFESTS / n) for n in ("nodes.yaml", "pools.yaml", "jobs.yaml")],
                                               validate=False)
    walras.planner.build_plan(walras.kube.decode.cluster_from(snapshot))


def _child(request: dict[str, object]) -> None:
    import test_ha_support

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.environ.update({str(k): str(v) for k, v in dict(request.get("env") or {}).items()})  # type: ignore[call-overload]
    fd = os.open(str(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdin.close()
    code = 1
    try:
        code = test_ha_support._replica([str(a) for a in request["argv"]])  # type: ignore[union-attr]
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> int:
    _preload()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel: no zombies to wait for
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(pid, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
