"""The executor's task: read a range -> decode -> transform -> Parquet -> upload -> one outcome row.
Imports decode, config (targets) and uploader; never the driver, startup or kafka_source."""
