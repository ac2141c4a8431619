"""inferwatch.dashboards: Grafana dashboards generated with grafana-foundation-sdk, committed as JSON.

:mod:`.panels` defines every panel (one module per dashboard section), :mod:`.layouts` the three
dashboards, :mod:`.generate` renders them, :mod:`.schema` checks the JSON against the SDK's model,
:mod:`.cli` is ``inferwatch dashboards``.
"""
