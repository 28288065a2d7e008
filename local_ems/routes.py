"""Which part of the endpoint answers a request: health, the control API, or the items endpoint."""

from __future__ import annotations

import ipaddress

from local_ems.control import Control
from local_ems.items import ItemsEndpoint, items_pool
from local_ems.request import Request
from local_ems.responses import HttpError, Response, text


class Router:
    def __init__(self, items: ItemsEndpoint, control: Control) -> None:
        self.items = items
        self.control = control

    def handle(self, request: Request) -> Response:
        """May raise HttpError; the HTTP layer turns it into a plain-text response."""
        segments = request.segments
        if segments == ("healthz",):
            return text(200, "ok")
        if segments and segments[0] == "_control":
            if not is_loopback(request.client_host):
                raise HttpError(403, "the control API only answers loopback clients")
            return self.control.handle(request)
        pool_id = items_pool(segments)
        if pool_id is not None:
            if request.method != "POST":
                return text(405, "use POST to push a Parquet file to this endpoint", Allow="POST")
            return self.items.handle(request, pool_id)
        raise HttpError(404, "not found; the items endpoint is "
                             "POST /continuous-batch-processing/api/v1/<pool-id>/items?targetName=<table>")


def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback
