"""inferwatch.bench: ``inferwatch bench`` and ``inferwatch compare``, the benchmark and regression test of
the reference notes (the ``instrumentation`` extra for torch and transformers, plus rich)."""
