"""inferwatch: a Prometheus exporter and live monitor for LLM inference on PyTorch / transformers.

The package's parts by role (docs/architecture.md): ``exporter`` (the GPU sidecar), ``instrumentation``
(the library inside the serving process), ``monitor`` (top, diagnose, profile), ``alerts`` and
``dashboards`` (rules and dashboards as code), ``bench``, ``cli`` and ``common``.
"""
