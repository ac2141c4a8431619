"""Tests of serving the instrumentation's metrics in-process: the endpoint, mounted apps, the demo's options
(the launcher, the demo and multiprocess workers as real processes: tests/integration/serving)."""
