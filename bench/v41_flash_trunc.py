#!/usr/bin/env python3
"""Writes a V4.1-Flash config cut to one layer per layer role, for dummy
real-shape runs on one GPU (bench/bench_cuda_model.c, the CLI's --config).

Every dimension is the real model's (../shared/golden/v41-flash-config.json);
only the layer list is shorter and the Engram table smaller (the real ones
are about 98 GB each; engram_vocab_size 250,000 instead of 16,000,000 gives
6 M rows, 1.5 GB; the table size changes which rows a token reads, not the
work per step). Layers of the cut model and the real layer each plays:

  0  window only (real 0)          3  ratio-2 reuse (real 3)
  1  window only + Engram (real 1) 4  ratio-1 source with candidate pool (real 20)
  2  ratio-2 source (real 2)       5  ratio-1 reindex (real 24)

No DSpark stages (num_nextn_predict_layers 0).

  v41_flash_trunc.py SRC_CONFIG OUT_CONFIG [ENGRAM_VOCAB]"""
import json
import sys


def is_prime(n):
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def engram_rows(t, layer_index):
    """Rows of one Engram table as the engine's prime search gives them
    (src/model/engram.c, di_engram_primes): per n-gram order, the next
    engram_n_heads primes above engram_vocab_size - 1 not handed out to an
    earlier layer or order."""
    seen, rows = [], []
    for _layer in range(layer_index + 1):
        total = 0
        for _order in range(t["engram_max_ngram_size"] - 1):
            cur = t["engram_vocab_size"] - 1
            for _head in range(t["engram_n_heads"]):
                while True:
                    cur += 1
                    if is_prime(cur) and cur not in seen:
                        break
                seen.append(cur)
                total += cur
        rows.append(total)
    return rows[layer_index]


def main():
    src, out = sys.argv[1], sys.argv[2]
    vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 250_000
    cfg = json.load(open(src))
    t = cfg["text_config"]
    t["num_hidden_layers"] = 6
    t["num_nextn_predict_layers"] = 0
    t["compress_ratios"] = [0, 0, 2, 2, 1, 1]
    t["kv_source_layer_ids"] = [2, 4]
    t["index_source_layer_ids"] = [2, 4, 5]
    t["candidate_source_layer_id"] = 4
    t["engram_layer_ids"] = [1]
    t["engram_vocab_size"] = vocab
    t["engram_num_embeddings"] = [engram_rows(t, 0)]
    for k in ("dspark_target_layer_ids",):
        t.pop(k, None)
    json.dump(cfg, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
