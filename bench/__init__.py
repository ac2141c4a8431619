"""inferwatch.bench."""
