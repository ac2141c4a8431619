"""inferwatch.alerts."""
