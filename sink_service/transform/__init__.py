"""SINK_TRANSFORM_SQL: `rows` applies it in tasks, `dialect` writes it for DuckDB, `check`
checks it at startup. rows -> dialect <- check; nothing imports check at run time."""
