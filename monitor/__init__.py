"""inferwatch.monitor: ``inferwatch top`` and ``inferwatch diagnose``, over scraped endpoints or Prometheus.

Never imports torch: it runs wherever the exporter runs (the ``monitor`` extra: rich, requests).
"""
