"""Run the local schema registry as its own process.

    python -m local_registry --host 127.0.0.1 --port 18081 [--basic-auth user:password]

Prints its URL once it accepts connections; SIGTERM or SIGINT stops it (exit code 0). The basic
auth can come from LOCAL_REGISTRY_BASIC_AUTH instead, which keeps it out of `ps` output.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading

from local_registry.server import LocalRegistry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m local_registry", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=18081, help="port to bind; 0 picks a free one (default 18081)")
    parser.add_argument("--basic-auth", default=os.environ.get("LOCAL_REGISTRY_BASIC_AUTH"),
                        help="`user:password` clients must send (default: $LOCAL_REGISTRY_BASIC_AUTH; none)")
    args = parser.parse_args(argv)
    registry = LocalRegistry(args.host, args.port, args.basic_auth).start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"local schema registry at {registry.url}", flush=True)
    stop.wait()
    registry.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
