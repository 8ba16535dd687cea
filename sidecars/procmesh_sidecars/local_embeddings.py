"""A local OpenAI-compatible embeddings server on a real model whose weights ship in a PyPI wheel.

``python -m procmesh_sidecars.local_embeddings [--host 127.0.0.1] [--port 0]`` serves
``POST /v1/embeddings`` (``{model, input: str | [str]}`` -> ``{data: [{index, embedding}], usage}``)
and ``GET /v1/models``, and prints ``listening on http://HOST:PORT/v1`` once it accepts requests.
Semantic recall's tests, ``make bench`` and the demo point an ``openai``-kind provider at it, so
recall runs on real embeddings with no network and no key.

The model is WordLlama ``l2_supercat`` at 256 dimensions (the ``wordllama`` wheel carries its
weights and tokenizer): token embeddings distilled from a large language model, averaged and
normalized, fast on a CPU (no torch). It is loaded from the wheel's own files: the library's loader
looks for the tokenizer in another folder and would go to the network for it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "wordllama-l2-supercat-256"
MAX_INPUTS = 2048
MAX_BODY_BYTES = 16 * 1024 * 1024


class Model:
    """WordLlama l2_supercat (256 dimensions) from the wheel's files; `embed` is thread-safe."""

    def __init__(self) -> None:
        import wordllama  # type: ignore[import-untyped]
        from safetensors import safe_open
        from wordllama import WordLlama
        from wordllama.inference import WordLlamaInference  # type: ignore[import-untyped]

        package = Path(wordllama.__file__).parent
        tokenizer = WordLlama.load_tokenizer(package / "tokenizers" / "l2_supercat_tokenizer_config.json")
        with safe_open(str(package / "weights" / "l2_supercat_256.safetensors"), framework="np") as f:
            weights = f.get_tensor("embedding.weight")
        self._model = WordLlamaInference(weights, tokenizer)
        self._tokenizer = tokenizer
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """Unit vectors of `texts`, and the tokens they took."""
        with self._lock:
            vectors = self._model.embed(texts, norm=True)
            tokens = sum(len(e.ids) for e in self._tokenizer.encode_batch(texts))
        return [[float(x) for x in row] for row in vectors], tokens


class Handler(BaseHTTPRequestHandler):
    model: Model
    protocol_version = "HTTP/1.1"
    # Headers and body are two writes: without TCP_NODELAY a kept-alive client waits for the
    # delayed ACK (about 40 ms) before the body comes.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._answer(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/embeddings":
            self._error(404, f"no route {self.path}")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._error(413, f"the body is over {MAX_BODY_BYTES} bytes")
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            self._error(400, f"the body is not JSON: {exc}")
            return
        texts = body.get("input") if isinstance(body, dict) else None
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            self._error(400, "input must be a string or a non-empty list of strings")
            return
        if len(texts) > MAX_INPUTS:
            self._error(400, f"at most {MAX_INPUTS} inputs per request")
            return
        if body.get("model", MODEL) != MODEL:
            self._error(
                404, f"unknown model {body.get('model')!r}: this server has {MODEL!r}", "model_not_found"
            )
            return
        vectors, tokens = self.model.embed(texts)
        self._answer(
            200,
            {
                "object": "list",
                "model": MODEL,
                "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    def _error(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        self._answer(status, {"error": {"message": message, "type": code}})

    def _answer(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise
        pass


def serve(host: str, port: int) -> ThreadingHTTPServer:
    """A server with the model loaded (not yet serving: call `serve_forever`)."""
    handler = type("BoundHandler", (Handler,), {"model": Model()})
    return ThreadingHTTPServer((host, port), handler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m procmesh_sidecars.local_embeddings", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    args = parser.parse_args(argv)
    server = serve(args.host, args.port)
    print(f"listening on http://{args.host}:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
