"""``python -m walras_testbed.emulator``: serve the emulated Kubernetes API (not a real cluster) on loopback until
killed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from walras_testbed.emulator.server import Emulator
from walras_testbed.emulator.store import Store


async def _serve(args: argparse.Namespace) -> None:
    emulator = Emulator(Store(in_place_resize=not args.no_in_place_resize), host=args.host, port=args.port)
    url = await emulator.start()
    if args.kubeconfig:
        emulator.write_kubeconfig(args.kubeconfig)
    print(url, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await emulator.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m walras_testbed.emulator",
                                     description="Emulated Kubernetes API for the Walras demo and tests.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    parser.add_argument("--kubeconfig", help="write a kubeconfig pointing at the emulator here")
    parser.add_argument("--no-in-place-resize", action="store_true",
                        help="emulate a cluster without in-place pod resize (no pods/resize sub-resource)")
    asyncio.run(_serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
