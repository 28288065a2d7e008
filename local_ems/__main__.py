"""Run the local EMS-compatible endpoint as its own process.

    python -m local_ems --host 127.0.0.1 --port 18080 --data-dir DIR --authorization 'AppKey demo-key'

Prints one line with the items URL once it accepts connections, then one log line per request on
stderr; the Authorization value is never printed. SIGTERM or SIGINT stops it cleanly (exit code 0).
The authorization can come from LOCAL_EMS_AUTHORIZATION instead of the command line, which keeps it
out of `ps` output.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from types import FrameType

from local_ems.server import DEFAULT_MAX_BODY_BYTES, DEFAULT_POOL_ID, LocalEmsServer
from local_ems.store import ORDER_MODE, UPSERT_MODES

AUTHORIZATION_ENV = "LOCAL_EMS_AUTHORIZATION"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m local_ems", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=18080, help="port to bind; 0 picks a free one (default 18080)")
    parser.add_argument("--data-dir", required=True, help="directory for ems.sqlite and uploaded files")
    parser.add_argument("--authorization", default=os.environ.get(AUTHORIZATION_ENV),
                        help=f"exact Authorization header value clients must send, e.g. 'AppKey <key>' "
                             f"(default: ${AUTHORIZATION_ENV})")
    parser.add_argument("--pool-id", default=DEFAULT_POOL_ID, help="pool id shown in the printed items URL")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="larger request bodies get 413 (default 1 GiB)")
    parser.add_argument("--upsert-mode", choices=UPSERT_MODES, default=ORDER_MODE,
                        help="across files, keep the highest order value per key (order, the default) or let "
                             "the last upload win (last-upload)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    args = parser.parse_args(argv)
    if not args.authorization:
        parser.error(f"--authorization (or ${AUTHORIZATION_ENV}) is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        logging.getLogger("local_ems").info("received %s; stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    server = LocalEmsServer(args.data_dir, args.authorization, args.host, args.port,
                            max_body_bytes=args.max_body_bytes, pool_id=args.pool_id,
                            upsert_mode=args.upsert_mode).start()
    print(server.items_url(), flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    logging.getLogger("local_ems").info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
