"""The remedies ``inferwatch diagnose`` points to: the optimization checklist, fault procedures and
bottleneck matrix of the reference notes (``reference/000``: "8.4 推理性能分析与优化 Checklist";
``reference/002``: sections 4.1 and 6), restated in English with where each comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.common import names


@dataclass(frozen=True)
class ChecklistItem:
    """One thing to do about a finding."""

    action: str
    rationale: str
    source: str  # where in the reference notes the item comes from

    def to_dict(self) -> dict[str, str]:
        return {"action": self.action, "rationale": self.rationale, "source": self.source}


_CHECKLIST_000 = "reference/000 §系统化优化 Checklist"

COMPILE = ChecklistItem(
    'torch.compile(model, mode="reduce-overhead")',
    "captures the decode step in CUDA graphs and removes per-step Python and launch overhead "
    "(10-30 % expected)",
    f"{_CHECKLIST_000}, priority 1",
)
KV_CACHE = ChecklistItem(
    "enable the KV cache (generate(use_cache=True) or a static cache)",
    "without it every decode step recomputes attention over the whole sequence",
    f"{_CHECKLIST_000}, priority 1; reference/002 §4.1 bottleneck matrix",
)
SDPA = ChecklistItem(
    "use SDPA / FlashAttention(-2) instead of hand-written attention",
    "20-40 % faster attention; the fix when prefill time grows faster than linearly in the prompt",
    f"{_CHECKLIST_000}, priorities 1-2",
)
CUDA_GRAPHS = ChecklistItem(
    "keep the serving engine's CUDA graphs on (vLLM: no --enforce-eager; SGLang: no "
    "--disable-cuda-graph), or capture a hand-written decode step with torch.cuda.graph over a static "
    "KV cache",
    "one graph launch replays the step's hundreds of kernels: the per-kernel launch latency that leaves "
    "the SMs idle between tiny kernels is paid once",
    "reference/002 §4.1 (CUDA kernel launch latency; SM utilization as a key metric); "
    f"{_CHECKLIST_000}, priority 1 (torch.compile reduce-overhead)",
)
BF16 = ChecklistItem(
    "run in BF16 instead of FP32",
    "about 2x on Ampere and later: tensor cores, and half the bytes to read",
    f"{_CHECKLIST_000}, priority 1",
)
INT4 = ChecklistItem(
    "INT4 weight quantization (GPTQ, AWQ, torchao)",
    "memory-bound decode reads 4x fewer weight bytes: 20-50 % faster, quality loss usually < 2 %",
    f"{_CHECKLIST_000}, priority 2",
)
BATCHING = ChecklistItem(
    "batch requests (continuous batching)",
    "one read of the weights serves many sequences: 3-10x throughput when decode is bandwidth-bound",
    f"{_CHECKLIST_000}, priority 2",
)
SPECULATIVE = ChecklistItem(
    "speculative decoding with a small draft model",
    "verifies several drafted tokens per read of the weights: 2-3x faster decode",
    f"{_CHECKLIST_000}, priority 3",
)
OVERLAP = ChecklistItem(
    "find the idle gaps in a timeline (nsys profile, torch.profiler) and move host work off the "
    "decode loop: preprocessing and detokenization in another thread, no per-step .item()/.cpu()",
    "the GPU waits for the Python loop between steps",
    "reference/002 §4.1 bottleneck matrix (GPU utilization fluctuates: look for idle gaps); "
    "§6.1 (move data loading to its own thread)",
)
CLOCKS = ChecklistItem(
    "check the GPU's power state and clocks: cooling, power limit (nvidia-smi -q -d PERFORMANCE), "
    "and enable persistence mode",
    "a throttled GPU runs every kernel slower, and unevenly",
    "reference/002 §6.1 (check whether the GPU is frequently downclocked; enable persistence mode)",
)
ISOLATION = ChecklistItem(
    "look for other processes competing for the GPU or CPU, isolate the server (cgroups, CPU "
    "pinning), and check the preprocessing pipeline for CPU stalls",
    "the same request should take the same time; contention and throttling make it vary",
    "reference/002 §6.1 (latency of identical requests differs by more than 30 %)",
)
MEMORY = ChecklistItem(
    "read torch.cuda.memory_summary(), then lower the batch size or sequence length, or use a "
    "paged KV cache (vLLM PagedAttention) or a more efficient allocator",
    "device memory is nearly full: the next long request or larger batch runs out",
    "reference/002 §6.2 (CUDA OOM); reference/000 priority 3 (PagedAttention)",
)
LEAK = ChecklistItem(
    "look for memory that grows with each request (caches kept across requests, tensors held in "
    "lists, growing KV caches that are never freed): torch.cuda.memory_summary() between requests",
    "memory rising while the load does not is a leak, and ends in an OOM",
    "reference/002 §6.2 (check for leaks: caches that grow with each iteration)",
)
SCALE_OUT = ChecklistItem(
    "add replicas of the model behind the load balancer (or an autoscaler on the number of requests "
    f"waiting, {names.LLM_REQUESTS_WAITING})",
    "the model is at capacity: requests wait for it while its device is busy, and only more devices "
    "serve more of them at once",
    "docs/runbooks.md, InferwatchQueueTimeHigh (capacity: the queue vs prefill split of TTFT)",
)
MAX_TOKENS = ChecklistItem(
    "cap the generated tokens per request (max_tokens / max_new_tokens)",
    "a request holds the model for its whole decode: long generations make every request behind them wait",
    "docs/runbooks.md, InferwatchQueueTimeHigh",
)

_CONTINUOUS_BATCHING = "transformers continuous batching (ContinuousBatchingConfig)"
KV_BLOCKS = ChecklistItem(
    "give the paged KV cache more blocks: a larger share of free device memory for it "
    "(max_memory_percent) or more num_blocks, where the device has memory to spare",
    "each block holds the KV cache of a few tokens of one request: more blocks hold more requests at once, "
    "so fewer wait and none is preempted",
    f"{_CONTINUOUS_BATCHING}; docs/runbooks.md, InferwatchKvCacheNearlyFull",
)
MAX_BATCH_TOKENS = ChecklistItem(
    "lower max_batch_tokens (tokens per continuous-batching step)",
    "when num_blocks is inferred, a step's activations and the cache share one memory budget: fewer tokens "
    "per step leave more blocks, and fewer prompt tokens are admitted at once",
    f"{_CONTINUOUS_BATCHING}; docs/runbooks.md, InferwatchKvCacheNearlyFull",
)
KV_MAX_NEW_TOKENS = ChecklistItem(
    "cap the generated tokens per request (max_new_tokens / max_tokens): it bounds the blocks one request "
    "holds",
    "every generated token holds KV cache until its request ends: long generations hold most of the blocks",
    "docs/runbooks.md, InferwatchKvCacheNearlyFull",
)
CPU_OFFLOAD = ChecklistItem(
    "let preempted requests keep their cache in host memory (cpu_offload_space, where the transformers "
    "version has it)",
    "a preempted request then copies its cache back instead of computing its prompt and tokens again",
    f"{_CONTINUOUS_BATCHING}; docs/runbooks.md, InferwatchKvCachePreemptions",
)
