"""The query parameters of an items POST, validated up front so a bad request fails with a clear 400."""

from __future__ import annotations

from dataclasses import dataclass

from local_ems.responses import HttpError

KNOWN = ("targetName", "connectionId", "clientId", "fallbackVarcharLength", "primaryKeys",
         "duplicateRemovalOrderColumn")
RESERVED_PREFIXES = ("_ems_", "sqlite_")  # our upload log and SQLite's own tables


@dataclass(frozen=True)
class PushParams:
    target_name: str
    primary_keys: tuple[str, ...] = ()
    order_column: str | None = None  # only used together with primary_keys, as in EMS
    connection_id: str | None = None
    client_id: str | None = None
    fallback_varchar_length: int | None = None
    raw: tuple[tuple[str, str], ...] = ()  # every query parameter as sent, for the upload log

    @classmethod
    def from_query(cls, query: dict[str, list[str]]) -> PushParams:
        """Build from `parse_qs` output; the first value of a repeated parameter wins."""
        first = {name: values[0] for name, values in query.items() if values}
        target = first.get("targetName", "").strip()
        if not target:
            raise HttpError(400, "query parameter `targetName` is required (the name of the target table)")
        if target.casefold().startswith(RESERVED_PREFIXES) or "\x00" in target:
            raise HttpError(400, f"targetName {target!r} is reserved or invalid; choose another table name")
        keys = tuple(dict.fromkeys(k.strip() for k in first.get("primaryKeys", "").split(",") if k.strip()))
        order = first.get("duplicateRemovalOrderColumn", "").strip() or None
        return cls(
            target_name=target,
            primary_keys=keys,
            order_column=order if keys else None,
            connection_id=first.get("connectionId") or None,
            client_id=first.get("clientId") or None,
            fallback_varchar_length=_positive_int(first.get("fallbackVarcharLength")),
            raw=tuple(sorted(first.items())),
        )


def _positive_int(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise HttpError(400, f"fallbackVarcharLength must be a positive integer, got {value!r}")
    return number
