"""Run inside an SGLang environment (stdlib and SGLang only): SGLang's own metrics collectors, driven through their
own methods with known figures, write a /metrics text exactly as a serving SGLang would (prometheus_client's
exposition of SGLang's counters, labels and all). The suite then reads that text with kvbench's normaliser and holds
it to the figures put in.

Usage: python sglang_exporter.py MODEL_DIR OUT.txt
(MODEL_DIR: a directory holding the model's config.json; the collectors read SGLang's published server settings)
"""

from __future__ import annotations

import sys

# what the collectors are given: one finished request of 8,000 prompt tokens, 5,000 of them cached (3,000 on the GPU,
# 2,000 from HiCache's host pool), and HiCache moving tokens between the tiers
FIGURES = {
    "prompt_tokens": 8000,
    "cached_device": 3000,
    "cached_host": 2000,
    "load_back_kv": 2000,
    "backup_kv": 4000,
    "evicted": 3000,
    "prefetched": 500,
    "stored_to_storage": 700,
}


def main() -> None:
    from prometheus_client import REGISTRY, generate_latest
    from sglang.srt.observability.metrics_collector import (
        RadixCacheMetricsCollector,
        StorageMetricsCollector,
        TokenizerMetricsCollector,
    )
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", sys.argv[1], "--device", "cpu", "--enable-metrics"])
    try:  # from 0.5.20 the collectors read the process's published settings, as a serving SGLang publishes them
        from sglang.srt.runtime_context import publish
    except ImportError:
        pass
    else:
        publish(args, role="scheduler")
    labels = {"model_name": "m"}
    tokenizer = TokenizerMetricsCollector(server_args=args, labels=labels)
    f = FIGURES
    tokenizer.observe_one_finished_request(
        labels,
        prompt_tokens=f["prompt_tokens"],
        generation_tokens=16,
        cached_tokens=f["cached_device"] + f["cached_host"],
        e2e_latency=1.0,
        has_grammar=False,
        cached_tokens_details={"device": f["cached_device"], "host": f["cached_host"]},
    )
    radix = RadixCacheMetricsCollector(labels=labels)
    radix.increment_load_back_num_tokens(f["load_back_kv"], "kv")
    radix.increment_backup_num_tokens(f["backup_kv"], "kv")
    radix.increment_eviction_num_tokens(f["evicted"])
    storage = StorageMetricsCollector(labels=labels)
    storage.log_prefetched_tokens(f["prefetched"])
    storage.log_backuped_tokens(f["stored_to_storage"])
    with open(sys.argv[2], "wb") as out:
        out.write(generate_latest(REGISTRY))


if __name__ == "__main__":
    main()
