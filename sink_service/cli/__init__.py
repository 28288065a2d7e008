"""The `sink-service` command: `run` (the default) starts the service, the others are operator tools."""
