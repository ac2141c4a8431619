"""inferwatch.alerts: Prometheus recording and alerting rules, rendered from one configuration.

``config.yaml`` holds every threshold, selector and ``for:`` duration (:mod:`.config` merges a user's
file over it and validates it), :mod:`.rules` holds the expressions and words of every rule,
:mod:`.render` writes ``rules.yaml`` (the committed copy is the defaults rendered), ``tests/`` holds the
promtool unit tests, and :mod:`.cli` is ``inferwatch alerts export|render``.
"""
