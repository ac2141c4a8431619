"""Evaluation texts bundled with inferwatch: the prompts of ``inferwatch bench`` and the perplexity corpus
of ``inferwatch compare``.

They are deliberately varied (narrative prose, technical prose, source code, tabular numbers, and
non-Latin script) so that a candidate model which has only learned to be good on one kind of input still
shows its losses. They live in a module rather than a data file so that no package-data is needed.
"""

from __future__ import annotations

# (name, text). Names are short and stable: they label rows of the compare report and keys of its JSON.
EVALUATION_TEXTS: tuple[tuple[str, str], ...] = (
    (
        "prose",
        "The ferry left the harbour an hour late, which nobody minded. The fog had not lifted since "
        "dawn, and the captain, a patient woman who had crossed this strait more times than she could "
        "count, preferred to wait for the lighthouse on the far headland to show itself before she let "
        "the engines take the boat past the breakwater. Passengers drank tea in the saloon, children "
        "pressed their faces against the salt-streaked windows, and a dog asleep under one of the "
        "benches twitched as if it were already running along the beach on the other side.",
    ),
    (
        "technical",
        "Autoregressive decoding produces one token per forward pass. Each step reads every weight of "
        "the model from device memory but performs only a few floating-point operations per byte read, "
        "so the step time is set by memory bandwidth rather than arithmetic throughput. The prompt, by "
        "contrast, is processed in a single pass over all of its positions: that prefill phase performs "
        "many operations per byte and is limited by compute. A key-value cache keeps the attention keys "
        "and values of earlier positions so that a decode step costs time linear, not quadratic, in the "
        "length of the sequence.",
    ),
    (
        "code",
        "def moving_average(values, window):\n"
        '    """Mean of each run of `window` consecutive values."""\n'
        "    if window <= 0:\n"
        '        raise ValueError("window must be positive")\n'
        "    total = sum(values[:window])\n"
        "    out = [total / window]\n"
        "    for i in range(window, len(values)):\n"
        "        total += values[i] - values[i - window]\n"
        "        out.append(total / window)\n"
        "    return out\n\n"
        "print(moving_average([3, 1, 4, 1, 5, 9, 2, 6], 3))\n",
    ),
    (
        "table",
        "station,date,min_c,max_c,rain_mm\n"
        "north_ridge,2026-03-01,-4.5,6.2,0.0\n"
        "north_ridge,2026-03-02,-2.1,8.9,1.4\n"
        "harbour,2026-03-01,3.8,11.0,12.6\n"
        "harbour,2026-03-02,4.4,12.3,7.9\n"
        "valley_floor,2026-03-01,0.2,14.7,0.0\n"
        "valley_floor,2026-03-02,1.9,16.1,0.3\n"
        "Totals: 22.2 mm of rain over six station-days; the widest daily range was 14.5 degrees.\n",
    ),
    (
        "chinese",
        "清晨的集市总是最热闹的。卖菜的老人把刚从地里摘下的青菜整齐地摆在竹筐里，"
        "旁边的面包店飘出一阵阵麦香。孩子们背着书包从人群中穿过，一边走一边讨论昨天的数学作业。"
        "到了九点，太阳升高，摊主们开始收拾剩下的货物，街道慢慢安静下来。",
    ),
)
