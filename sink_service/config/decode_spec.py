"""The decoding a configuration asks for, as the tasks carry it: the tasks' and `sink-service verify`'s one source.

Not re-exported by `sink_service.config`: it imports the decode package, which the driver's start
leaves to load while the JVM starts.
"""

from __future__ import annotations

from sink_service.config.decode import STRUCTURED_KEY_FORMATS, csv_character
from sink_service.config.settings import SinkConfig
from sink_service.decode import DecodeSpec
from sink_service.decode.csv_values import CsvFormat
from sink_service.decode.registry import RegistrySettings
from sink_service.shared.ddl import parse_ddl


def decode_spec(config: SinkConfig) -> DecodeSpec:
    """How records become rows under `config`: the tasks' and `sink-service verify`'s one source."""
    value_schema = parse_ddl(config.value_schema) if config.value_schema else None
    return DecodeSpec(
        value_schema, config.primary_keys, config.order_field, key_format=config.key_format,
        key_fields_prefix=config.key_fields_prefix, tombstones=config.tombstones,
        metadata_columns=config.selected_metadata_columns(),
        primary_keys_from_key=not config.primary_keys and config.key_format in STRUCTURED_KEY_FORMATS,
        value_format=config.value_format,
        registry=RegistrySettings(config.schema_registry_url, config.schema_registry_basic_auth or "",
                                 config.tls_ca_bundle)
        if config.schema_registry_url else None,
        csv=CsvFormat(parse_ddl(config.csv_columns) if config.csv_columns else None, config.csv_header,
                      csv_character(config.csv_delimiter, ","), csv_character(config.csv_quote, '"'))
        if config.value_format == "csv" else None,
        flatten=config.flatten, flatten_discard_collections=config.flatten_discard_collections,
        lowercase_fields=config.lowercase_fields, decimals_as_double=config.decimals_as_double,
        obfuscate_fields=config.obfuscate_fields, obfuscation_method=config.obfuscation_method,
        obfuscation_salt=(config.obfuscation_salt or "").encode(),
    )
