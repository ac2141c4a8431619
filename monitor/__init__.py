"""inferwatch.monitor."""
