"""inferwatch.dashboards."""
