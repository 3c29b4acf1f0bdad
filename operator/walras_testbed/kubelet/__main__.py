"""``python -m walras_testbed.kubelet --kubeconfig K -f nodes.yaml``: play the kubelet of the Nodes in the files until
interrupted (SIGINT/SIGTERM)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from pathlib import Path

import yaml

from walras_testbed.kubelet.client import ApiClient, ApiConfig
from walras_testbed.kubelet.standin import KubeletStandIn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m walras_testbed.kubelet", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("-f", "--file", action="append", required=True, help="Node manifests (repeatable)")
    parser.add_argument("--lease-interval", type=float, default=10.0)
    parser.add_argument("--stop-seconds", type=float, default=0.0,
                        help="seconds a pod's containers take to exit after SIGTERM (pods may override it with the "
                             "annotation kubelet.walras.dev/stop-seconds)")
    parser.add_argument("--grace-cap", type=float, default=None,
                        help="a pod being deleted stays Terminating at most this long (default: its grace period)")
    parser.add_argument("--delete-nodes", action="store_true", help="delete the Nodes when stopping")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    nodes = [d for f in args.file for d in yaml.safe_load_all(Path(f).read_text()) if d and d.get("kind") == "Node"]

    async def serve() -> None:
        kubelet = KubeletStandIn(ApiClient(ApiConfig.from_kubeconfig(args.kubeconfig)), nodes,
                                 lease_interval=args.lease_interval, stop_seconds=args.stop_seconds,
                                 grace_cap=args.grace_cap)
        await kubelet.start()
        print(f"kubelet stand-in: {len(nodes)} nodes", flush=True)
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, done.set)
        await done.wait()
        await kubelet.stop(delete_nodes=args.delete_nodes)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
