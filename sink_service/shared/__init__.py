"""Used on both sides and by the startup checks, so light: the written columns' names, the DDL of
SINK_VALUE_SCHEMA, and how a Kafka client tells a refused login from an outage. Imports nothing of
the service."""
