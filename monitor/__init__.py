"""inferwatch.monitor: ``inferwatch top`` and ``inferwatch diagnose``, over scraped endpoints or Prometheus.

Never imports torch: it runs wherever the exporter runs. The terminal views need rich (the ``monitor``
extra); ``--json`` output needs nothing beyond prometheus-client.
"""
