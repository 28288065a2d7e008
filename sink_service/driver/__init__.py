"""The driver: the service's lifecycle, the streaming query and its after-batch step (commits),
health, metrics, logs. Imports every package below it; nothing imports it."""
