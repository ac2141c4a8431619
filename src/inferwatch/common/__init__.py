"""inferwatch.common: the vocabulary every other inferwatch package shares.

:mod:`.durations` is the one duration syntax of command-line options and the alert configuration, and
:mod:`.names` the metric names that alerts, dashboards and the monitor read; :mod:`.files` writes what the
commands export; :mod:`.clock` is the clock that rate limits and budgets read, which a test moves. The
package imports only the
standard library, never another inferwatch package, so any package may import it without breaking the
dependency rules: the exporter stays free of torch and of the instrumentation, the monitor of torch.
"""
