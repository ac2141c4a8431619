"""Every panel of inferwatch's dashboards, defined once; a dashboard is a choice and order of these.

One module per dashboard section: :mod:`.latency`, :mod:`.throughput`, :mod:`.prefill_decode`,
:mod:`.memory` and :mod:`.efficiency` (the inference overview and the diagnosis), :mod:`.gpu_load`,
:mod:`.gpu_clocks` and :mod:`.gpu_faults` (the GPU hardware dashboard), :mod:`.monitoring` (the
diagnosis's health row). :mod:`.queries` is how each of them writes its queries and where their
thresholds come from.
"""
