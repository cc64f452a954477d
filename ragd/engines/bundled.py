"""The bundled engine: llama.cpp's own HTTP server, run through the xllamacpp wheel in a child
process, with the same API as a native ``llama-server`` (/health, /v1/embeddings, /tokenize,
/detokenize, /v1/rerank, /v1/chat/completions). The supervisor starts it exactly like the
native binary:

    python -m ragd.engines.bundled --model M.gguf --host /path/engine.sock --role embedding \
        --pooling mean --ctx-size 512 --threads 2
    python -m ragd.engines.bundled --model CHAT.gguf --host /path/generator.sock \
        --role generator --ctx-size 4096 --threads 2

It serves until SIGTERM/SIGINT, or until its parent dies (PR_SET_PDEATHSIG, set by the
supervisor before exec).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

POOLING = {"none": "LLAMA_POOLING_TYPE_NONE", "mean": "LLAMA_POOLING_TYPE_MEAN",
           "cls": "LLAMA_POOLING_TYPE_CLS", "last": "LLAMA_POOLING_TYPE_LAST",
           "rank": "LLAMA_POOLING_TYPE_RANK"}
# RAM the generator's server may use to keep earlier prompts' state (llama.cpp's default is 8 GiB)
PROMPT_CACHE_MIB = 256


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ragd.engines.bundled")
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", required=True, help="a Unix socket path ending in .sock")
    ap.add_argument("--role", choices=["embedding", "reranker", "generator"], required=True)
    ap.add_argument("--pooling", choices=sorted(POOLING), default="none")
    ap.add_argument("--ctx-size", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    # Warnings and errors only (llama.cpp's -lv 2): at info (3) the server logs three lines
    # for every text it embeds, and the reason an engine failed (supervisor.TELLING) is an
    # error or a warning.
    ap.add_argument("--verbosity", type=int, default=2)
    args = ap.parse_args(argv)

    import xllamacpp as xlc

    p = xlc.CommonParams()
    p.model.path = args.model
    p.n_ctx = args.ctx_size
    p.n_parallel = 1
    if args.role == "generator":
        # Chat completions (/v1/chat/completions, streamed as SSE): no embedding mode; the
        # chat template is the GGUF's own (tokenizer.chat_template), applied by the server's
        # Jinja engine. Batches of the server's defaults (2048 / 512): a prompt is split into
        # micro-batches as it is read.
        p.embedding = False
        p.use_jinja = True
        p.chat_template = ""
        p.n_batch = min(args.ctx_size, 2048)
        p.n_ubatch = min(args.ctx_size, 512)
        p.cache_ram_mib = PROMPT_CACHE_MIB
    else:
        # This build has no `reranking` field: embedding mode with RANK pooling serves
        # /v1/rerank.
        p.embedding = True
        p.pooling_type = getattr(xlc.llama_pooling_type, POOLING[args.pooling])
        p.n_batch = args.ctx_size
        p.n_ubatch = args.ctx_size
    p.cpuparams.n_threads = args.threads
    p.verbosity = args.verbosity
    p.cpuparams_batch.n_threads = args.threads
    p.hostnames = [args.host]
    # SIGTERM/SIGINT are blocked here, before the server's threads start (they inherit the
    # mask), and taken by sigwait below: no Python handler, so none that could deadlock the
    # main thread on a lock it holds (as an Event's set() in a handler could).
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    server = xlc.Server(p)  # starts the HTTP server; /health answers once the model is loaded
    print(f"bundled engine ({args.role}) listening on {server.listening_address}", flush=True)
    signal.sigwait(stop)
    # Out at once, without the server's destructor: it waits for the request in flight (a
    # bulk batch takes seconds), past the supervisor's grace, which then sent SIGKILL. The
    # engine keeps nothing to save, and its client is told by the connection closing.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
