"""Spark start-up, on the driver before the pipeline is imported: stop signals, Java, the
prepared Spark home, the session, the JVM class archive. Imports config; nothing of the pipeline."""
