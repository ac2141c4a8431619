"""inferwatch.exporter."""
