"""The README's configuration reference, generated from the declarations."""

from __future__ import annotations

from sink_service.config.kafka import RESERVED_KAFKA_OPTIONS
from sink_service.config.settings import declared_fields


def reference_markdown() -> str:
    """The README's configuration reference, generated from the declarations."""
    lines: list[str] = []
    group = None
    for f in declared_fields():
        meta = f.metadata
        if meta["group"] != group:
            group = meta["group"]
            lines += ["", f"#### {group}", "", "| Variable | Default | Description |", "|---|---|---|"]
        default = f.default
        if isinstance(default, tuple):
            default = ",".join(default)
        if isinstance(default, bool):
            default = str(default).lower()
        shown = "" if default in (None, "") else f"`{default}`"
        doc = meta["doc"]
        if meta["choices"]:
            doc += " One of: " + ", ".join(f"`{c}`" for c in meta["choices"]) + "."
        if meta["secret"]:
            doc += " **Secret**: masked in logs."
        lines.append(f"| `{meta['env']}` | {shown} | {doc} |")
    lines += [
        "",
        "#### Kafka client pass-through",
        "",
        "Any other `SINK_KAFKA_<NAME>` is passed to librdkafka as `<name>` lowercased with `_` "
        "turned into `.`, e.g. `SINK_KAFKA_SECURITY_PROTOCOL=SASL_SSL`, "
        "`SINK_KAFKA_SASL_MECHANISM=SCRAM-SHA-512`, `SINK_KAFKA_SASL_USERNAME`, "
        "`SINK_KAFKA_SASL_PASSWORD`. librdkafka's sensitive properties (passwords, `ssl.key.pem`, "
        "`sasl.oauthbearer.config`, ...) and names containing PASSWORD, SECRET, TOKEN or CREDENTIAL "
        "are secret and masked in logs. The service sets "
        + ", ".join(f"`{name}`" for name in RESERVED_KAFKA_OPTIONS)
        + " itself: passing one through is a configuration error (exit 2) that says why.",
    ]
    return "\n".join(lines).lstrip("\n") + "\n"


README_START, README_END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def with_reference(readme: str) -> str:
    """The README text with its configuration reference block regenerated."""
    head, rest = readme.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    return f"{head}{README_START}\n{reference_markdown()}{README_END}{tail}"
