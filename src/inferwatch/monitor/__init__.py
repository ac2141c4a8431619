"""inferwatch.monitor: ``inferwatch top`` and ``inferwatch diagnose``, over scraped endpoints or Prometheus.

Never imports torch: it runs wherever the exporter runs. The thresholds come from the alert
configuration (pyyaml) and the terminal views need rich, both in the ``monitor`` extra; ``--json`` output
does without rich.
"""
