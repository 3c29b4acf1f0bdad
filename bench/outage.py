"""Long API outages on the real control plane (issue 30 item 4): 60 s and 180 s outages of etcd and of
kube-apiserver, with the operator talking to the API server directly and behind a proxy that answers 503 while its
upstream is down (as a load balancer whose health check fails does). Not part of ``make test`` (each run takes over
90 s); the 25 s variants are in ``tests/test_hostile_outage.py``.

Usage::

    python -m bench.outage                                  # 60 s and 180 s, the four outages, writes the page
    python -m bench.outage --seconds 60 --outages etcd-stopped --no-write

Each run is :func:`tests.test_hostile_outage.outage_scenario` (kubelet stand-in, the operator in this process in
direct mode, 5 pods of two jobs running before, a third job of 3 pods created right after the outage; asserted:
the process alive, ``/healthz`` degraded during the outage and ok after, the new job served, no running pod lost,
replaced or duplicated, the e2e invariants) in a fresh namespace of one control plane started here from
``$KUBEBUILDER_ASSETS``. A failed assertion is reported in the table and makes the command exit 1.

Writes ``docs/bench/outages.md``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench._machine import machine_line, now_utc

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "bench" / "outages.md"
OUTAGES = ("etcd-stopped", "etcd-stopped-proxy", "apiserver-stopped", "apiserver-stopped-proxy")
COLUMNS = ("outage", "seconds", "result", "degraded after s", "healthz ok after s", "new job served after s",
           "refused by the proxy", "kopf restarts", "pods", "pods lost or replaced", "duplicated", "process alive",
           "wall s")


def run(seconds: list[float], outages: list[str]) -> list[dict[str, Any]]:
    """Every (outage, seconds) on one control plane, each in a namespace of its own."""
    sys.path.insert(0, str(ROOT / "tests"))
    from controlplane import ControlPlane, assets_folder, missing_message
    from test_hostile_outage import outage_scenario

    folder, missing = assets_folder()
    kubectl = shutil.which("kubectl") or str(ROOT / ".tools" / "bin" / "kubectl")
    if folder is None or missing:
        raise SystemExit(missing_message(missing))
    cp = ControlPlane.start(kubectl, binaries=folder)
    rows: list[dict[str, Any]] = []
    try:
        for length in seconds:
            for outage in outages:
                ns = f"o-{secrets.token_hex(4)}"
                cp.kubectl("create", "namespace", ns)
                started = time.monotonic()
                try:
                    row = {**outage_scenario(cp, ns, outage, length), "result": "ok"}
                except Exception as exc:  # reported in the table, the command exits 1
                    traceback.print_exc()
                    row = {"outage": outage, "seconds": length, "result": f"FAILED: {str(exc).splitlines()[0]}"}
                row["wall s"] = round(time.monotonic() - started, 1)
                print(row, flush=True)
                rows.append(row)
                cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    finally:
        cp.stop()
    return rows


def page(rows: list[dict[str, Any]], command: str) -> str:
    """The markdown page of ``rows``."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        "# API outages of 60 s and 180 s on the real control plane (issue 30 item 4)",
        "",
        "What `bench/outage.py` measured: etcd or kube-apiserver stopped for the given time and started again, the",
        "operator (in the benchmark's process, direct mode, kubelet stand-in) talking to the API server directly or",
        "behind a proxy that answers 503 to everything while its upstream is down and cuts every watch (a load",
        "balancer whose health check fails). Asserted in every run (`tests.test_hostile_outage.outage_scenario`):",
        "the process stays alive, `/healthz` is degraded during the outage and ok after, a job created right after",
        "the outage is served, none of the 5 pods running before is lost or replaced, none is duplicated, and the e2e",
        "invariants hold (no over-commit, no pod rejected by a node, every pod a status plans Running on its node).",
        "With etcd stopped kube-apiserver still answers `/version`; the operator's probe also asks `/readyz`, which",
        "answers 500 `[-]etcd failed`, so `/healthz` is degraded there too.",
        "",
        "Columns: *degraded after s*, seconds from the start of the outage until `/healthz` said degraded (probe every",
        "1 s in the benchmark, 5 s in `walras run`); *healthz ok after s* and *new job served after s*, seconds from",
        "the end of the outage (the component started again, or the proxy passing again) until `/healthz` is ok and",
        "until the 3 pods of the job created then run; *refused by the proxy*, requests it answered 503; *kopf",
        "restarts*, orchestrations `walras run` restarted (0: kopf's own unlimited retries sufficed).",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine_line('kopf')}; load average {load} at the end (2 cores shared with other jobs).",
        f"Run: {now_utc()}. One run per row (a robustness check, not a timing: the times include the restart of the",
        "stopped component and of kube-controller-manager).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "| " + " | ".join("---" for _ in COLUMNS) + " |",
    ]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, nargs="+", default=[60.0, 180.0])
    parser.add_argument("--outages", nargs="+", default=list(OUTAGES))
    parser.add_argument("--no-write", action="store_true", help="print the table, do not write the page")
    args = parser.parse_args(argv)
    rows = run(args.seconds, args.outages)
    command = "python -m bench.outage" + ("" if argv is None else " " + " ".join(argv))
    text = page(rows, command if argv is not None else "python -m bench.outage " + " ".join(sys.argv[1:]))
    print(text)
    if not args.no_write:
        PAGE.write_text(text)
    return 0 if all(r.get("result") == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
