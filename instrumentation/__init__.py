"""inferwatch.instrumentation."""
