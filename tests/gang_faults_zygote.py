"""``tests/operator_zygote.py`` (this module holds no tests) with every plan its replicas make checked.

Before the fork server starts, ``walras.planner.build_plan`` is wrapped: each plan a forked replica makes (``walras
run`` imports the planner from ``walras.planner`` when it builds its controller) is checked with
:func:`walras.planner.invariants.check_plan` against the cluster it was made from, and one JSON line
``{"pid": ..., "broken": [...]}`` is appended to the file named by the replica's ``WALRAS_PLAN_CHECK_LOG``
(``O_APPEND``: one write per line, so a replica killed with SIGKILL leaves whole lines). Used by
``tests/test_gang_faults.py``; the protocol on stdin/stdout is the zygote's.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import operator_zygote


def checked(build_plan: Callable[..., Any]) -> Callable[..., Any]:
    """``build_plan`` whose every plan is checked (``check_plan``) and recorded in ``$WALRAS_PLAN_CHECK_LOG``."""
    from walras.planner.invariants import check_plan

    def planner(cluster: Any, *args: Any, **kwargs: Any) -> Any:
        plan = build_plan(cluster, *args, **kwargs)
        path = os.environ.get("WALRAS_PLAN_CHECK_LOG")
        if path:
            broken = [str(v) for v in check_plan(cluster, plan)]
            line = json.dumps({"pid": os.getpid(), "broken": broken}) + "\n"
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        return plan

    return planner


def main() -> int:
    import walras.planner

    walras.planner.build_plan = checked(walras.planner.build_plan)  # type: ignore[assignment]
    return operator_zygote.main()


if __name__ == "__main__":
    sys.exit(main())
