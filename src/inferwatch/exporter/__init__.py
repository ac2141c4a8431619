"""inferwatch.exporter: the sidecar that exports NVML, host and serving-process metrics.

Run it as ``inferwatch-exporter`` or ``python -m inferwatch.exporter`` (:func:`.__main__.main`). The parts,
for embedding or testing: :class:`.config.ExporterConfig` (what to collect), :class:`.poller.Poller`
(collects in the background into an immutable snapshot; takes the NVML binding as an argument),
:class:`.exposition.ScrapeRenderer` (renders a scrape from the poller without waiting on it) and
:class:`.server.ExporterServer` (HTTP, TLS, basic auth). Importing this package imports nothing else:
the sidecar's footprint is what ``__main__`` needs, and never torch.
"""
