"""The bundled engine: llama.cpp's own HTTP server, run through the xllamacpp wheel in a child
process, with the same API as a native ``llama-server`` (/health, /v1/embeddings, /tokenize,
/detokenize, /v1/rerank). The supervisor starts it exactly like the native binary:

    python -m ragd.engines.bundled --model M.gguf --host /path/engine.sock --role embedding \
        --pooling mean --ctx-size 512 --threads 2

It serves until SIGTERM/SIGINT, or until its parent dies (PR_SET_PDEATHSIG, set by the
supervisor before exec).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

POOLING = {"none": "LLAMA_POOLING_TYPE_NONE", "mean": "LLAMA_POOLING_TYPE_MEAN",
           "cls": "LLAMA_POOLING_TYPE_CLS", "last": "LLAMA_POOLING_TYPE_LAST",
           "rank": "LLAMA_POOLING_TYPE_RANK"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ragd.engines.bundled")
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", required=True, help="a Unix socket path ending in .sock")
    ap.add_argument("--role", choices=["embedding", "reranker"], required=True)
    ap.add_argument("--pooling", choices=sorted(POOLING), required=True)
    ap.add_argument("--ctx-size", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import xllamacpp as xlc

    p = xlc.CommonParams()
    p.model.path = args.model
    # This build has no `reranking` field: embedding mode with RANK pooling serves /v1/rerank.
    p.embedding = True
    p.pooling_type = getattr(xlc.llama_pooling_type, POOLING[args.pooling])
    p.n_ctx = args.ctx_size
    p.n_batch = args.ctx_size
    p.n_ubatch = args.ctx_size
    p.n_parallel = 1
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    p.hostnames = [args.host]
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    server = xlc.Server(p)  # starts the HTTP server; /health answers once the model is loaded
    print(f"bundled engine ({args.role}) listening on {server.listening_address}", flush=True)
    done.wait()
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
