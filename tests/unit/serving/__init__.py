"""Tests of serving the instrumentation's metrics: exposition, the launcher, the demo."""
