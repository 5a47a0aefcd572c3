"""tinygpt's numbers on a GGUF file against llama.cpp's own numbers on the same file (issue 49).

llama.cpp runs through `llama-cpp-python`, built from source in an environment of its own
(never a dependency of tinygpt or of its tests); this script runs that side in a subprocess
of that environment's Python, which only imports llama_cpp and NumPy:

    python3 -m venv .venv-llama && .venv-llama/bin/pip install llama-cpp-python
    python benchmarks/gguf_llama_cpp.py --llama-python .venv-llama/bin/python

The files: the shipped Llama (weights/llama) as F32, Q8_0 and Q4_0 GGUFs written by
examples/make_gguf.py (the gguf package's quantizer), and as Q4_K_M made by llama.cpp's own
quantizer (llama_model_quantize) from the F32 file: its 128-wide rows are not whole blocks
of 256, so llama.cpp falls back to another type for those tensors; the file's types are
printed. The text: the first --chunks chunks of --ctx tokens of part-005 (the validation
stories), tokenized by tinygpt, the same ids fed to both; each chunk from a fresh start, its
second half scored as llama-perplexity --kl-divergence scores it (positions n_ctx/2 ...
n_ctx - 2). One thread each (llama.cpp's n_threads = 1; OMP/BLAS threads 1), llama.cpp
with its default context settings otherwise (float16 KV cache).

Figures per file: (1) the gap: KL(P_llama.cpp || P_tinygpt) on the same file, mean and
max, top-1 agreement and the largest logit difference over the largest logit, tinygpt
plain and with --act-quant's rounding; (2) what quantization changed, KL(P_F32 || P_Q)
each side computes with its own F32 run, and their ratio; (3) speed: the load and the
forward pass over a chunk (all logits), tinygpt's time over llama.cpp's; (4) --act-quant's
roundings (Q8_0, Q8_K, bfloat16) against ggml's own row quantizers, called through its C
library on 409,600 random values.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402, I001  (first: it sets one thread before NumPy loads)

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TYPES = ["F32", "Q8_0", "Q4_0"]
LLAMA_FTYPES = {"Q4_K_M": 15}  # llama.h's LLAMA_FTYPE_MOSTLY_Q4_K_M

# the llama.cpp side, run by the other environment's Python: argv[1] a JSON job
LLAMA_SIDE = r'''
import ctypes, json, sys, time
import numpy as np
import llama_cpp
job = json.loads(sys.argv[1])
for src, dst, ftype in job.get("quantize", []):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"llama_model_quantize {dst}: {rc}")
chunks = np.load(job["chunks"])
out = {}
for path in job["files"]:
    t = time.perf_counter()
    llm = llama_cpp.Llama(model_path=path, n_ctx=job["ctx"], n_batch=job["ctx"],
                          n_ubatch=job["ctx"], n_threads=1, n_threads_batch=1,
                          logits_all=True, verbose=False, **job.get("llama_args", {}))
    load = time.perf_counter() - t
    logits, times = [], []
    for ids in chunks:
        llm.reset()
        t = time.perf_counter()
        llm.eval([int(i) for i in ids])
        times.append(time.perf_counter() - t)
        logits.append(np.array(llm.scores[:len(ids)], np.float32))
    name = path + ".llama.npy"
    np.save(name, np.stack(logits))
    out[path] = {"load": load, "eval": times, "logits": name}
    del llm
# ggml's own roundings of the activations, through its C library (the CPU backend's row
# quantizers, as the matrix products call them)
libdir = llama_cpp.llama_cpp._base_path
cpu = ctypes.CDLL(str(libdir / "libggml-cpu.so"))
base = ctypes.CDLL(str(libdir / "libggml-base.so"))
x = np.load(job["rows"])
ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)
rounded = {}
for name, block, size in (("Q8_0", 32, 34), ("Q8_K", 256, 292)):
    raw = np.zeros(x.size // block * size, np.uint8)
    back = np.zeros(x.size, np.float32)
    quant = cpu.quantize_row_q8_0 if name == "Q8_0" else cpu.quantize_row_q8_K
    deq = base.dequantize_row_q8_0 if name == "Q8_0" else base.dequantize_row_q8_K
    quant(ptr(x), ptr(raw), ctypes.c_int64(x.size))
    deq(ptr(raw), ptr(back), ctypes.c_int64(x.size))
    rounded[name] = back
halves = np.zeros(x.size, np.uint16)
base.ggml_fp32_to_bf16_row(ptr(x), ptr(halves), ctypes.c_int64(x.size))
rounded["BF16"] = (halves.astype(np.uint32) << 16).view(np.float32)
np.savez(job["rows"] + ".ggml.npz", **rounded)
print(json.dumps({"version": llama_cpp.__version__, "files": out,
                  "rounded": job["rows"] + ".ggml.npz"}))
'''


def llama_side(python: str, job: dict) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    done = subprocess.run([python, "-c", LLAMA_SIDE, json.dumps(job)], capture_output=True,
                          text=True, env=env, check=False)
    if done.returncode != 0:
        sys.exit(f"the llama.cpp side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def kl_rows(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(P || Q) per row, in float64."""
    a = p_logits.astype(np.float64)
    b = q_logits.astype(np.float64)
    la = a - a.max(-1, keepdims=True)
    la -= np.log(np.exp(la).sum(-1, keepdims=True))
    lb = b - b.max(-1, keepdims=True)
    lb -= np.log(np.exp(lb).sum(-1, keepdims=True))
    return (np.exp(la) * (la - lb)).sum(-1)


def tinygpt_side(path: Path, chunks: np.ndarray, act_quant: bool, f16_cache: bool = True
                 ) -> tuple[np.ndarray, float, list[float]]:
    from tinygpt_cli.analysis import quant as qa
    from tinygpt_cli.transformer.folder import load_model
    from tinygpt_cli.transformer.model import forward

    t = time.perf_counter()
    model = load_model(path)
    load = time.perf_counter() - t
    hook = qa.act_quant_hook(model)[0] if act_quant else None
    if hook is not None and not f16_cache:  # llama.cpp told to keep its cache in float32
        hook = qa.ActQuant({p: k for p, k in hook.kinds.items()
                            if p not in qa.attention_types(model.config)})
    logits, times = [], []
    for ids in chunks:
        t = time.perf_counter()
        logits.append(forward(model.params, model.config, ids, hooks=hook))
        times.append(time.perf_counter() - t)
    return np.stack(logits).astype(np.float32), load, times


def file_types(path: Path) -> str:
    from tinygpt_cli.transformer.folder import open_folder

    counts = open_folder(path).about["types"]
    return ", ".join(f"{k} ×{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def smol_folder(folder: Path) -> Path:
    """A random Llama of SmolLM2-135M's shape (576 wide, 30 blocks of 9 heads on 3 key/value
    heads, SwiGLU 1,536, 49,152 tied rows), float32, with the shipped tokenizer."""
    import shutil

    from tinygpt_cli.storage.locations import SHIPPED
    from tinygpt_cli.transformer.config import Config
    from tinygpt_cli.transformer.families import save_config
    from tinygpt_cli.transformer.folder import save_params
    from tinygpt_cli.transformer.model import init_params

    cfg = Config(n_embd=576, n_layer=30, n_head=9, n_inner=1536, vocab_size=49152,
                 n_positions=2048, model_type="llama", norm="rms", positions="rotary",
                 mlp="gated", act="silu", n_kv_head=3, qkv_bias=False, out_bias=False,
                 mlp_bias=False, rotary_base=100000.0, layer_norm_epsilon=1e-5)
    folder.mkdir(parents=True)
    save_params(init_params(cfg, np.random.default_rng(0)), folder / "model.safetensors", cfg)
    save_config(cfg, folder / "config.json")
    shutil.copy(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-python", required=True,
                   help="the Python of an environment with llama-cpp-python installed")
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--json", type=Path, help="also write every figure here")
    p.add_argument("--smol", action="store_true",
                   help="a random Llama of SmolLM2-135M's shape (made by tinygpt, the shipped "
                        "tokenizer) instead of the shipped one: for the speed; its KL means "
                        "little")
    p.add_argument("--f32-cache", action="store_true",
                   help="llama.cpp's KV cache in float32 (type_k = type_v = F32), not float16")
    a = p.parse_args()

    import importlib.util

    from tinygpt_cli.storage.locations import SHIPPED
    from tinygpt_cli.transformer.folder import load_model

    spec = importlib.util.spec_from_file_location("make_gguf", ROOT / "examples" / "make_gguf.py")
    make_gguf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_gguf)

    tmp = Path(tempfile.mkdtemp(prefix="gguf-llama-"))
    source = smol_folder(tmp / "smol") if a.smol else SHIPPED / "llama"
    files = {}
    for kind in TYPES:
        files[kind] = tmp / f"llama-{kind}.gguf"
        make_gguf.write(source, files[kind], kind)
    quantize = []
    for kind, ftype in LLAMA_FTYPES.items():
        files[kind] = tmp / f"llama-{kind}.gguf"
        quantize.append([str(files["F32"]), str(files[kind]), ftype])

    folder = load_model(source)
    text = (bench.DATA / "part-005.txt").read_text(encoding="utf-8")
    stream = np.array(folder.tokenizer.encode(text[:400_000]))
    n = a.chunks * a.ctx
    if len(stream) < n:
        sys.exit(f"part-005 gives {len(stream)} tokens, fewer than {n}")
    chunks = stream[:n].reshape(a.chunks, a.ctx)
    np.save(tmp / "chunks.npy", chunks)
    keep = np.arange(a.ctx // 2, a.ctx - 1)

    rng = np.random.default_rng(0)  # rows of many scales, a quarter of them on quarter steps
    rows = (rng.normal(size=(400, 1024)) * rng.uniform(0.01, 100, (400, 1))).astype(np.float32)
    rows[::4] = np.round(rows[::4] * 4) / 4
    np.save(tmp / "rows.npy", rows.reshape(-1))
    job = {"quantize": quantize, "chunks": str(tmp / "chunks.npy"), "ctx": a.ctx,
           "rows": str(tmp / "rows.npy"),
           "files": [str(f) for f in files.values()],
           "llama_args": {"type_k": 0, "type_v": 0} if a.f32_cache else {}}  # GGML_TYPE_F32
    theirs = llama_side(a.llama_python, job)
    print(f"llama-cpp-python {theirs['version']}; {a.chunks} chunks of {a.ctx} tokens, "
          f"{a.chunks * len(keep)} positions scored; files in {tmp}")

    from tinygpt_cli.analysis import quant as qa

    ggml = np.load(theirs["rounded"])
    same = {k: int((qa.rounded_rows(rows.reshape(-1), k) == ggml[k]).sum()) for k in ggml.files}
    print(f"activation roundings equal to ggml's ({rows.size:,} values): "
          + ", ".join(f"{k} {v:,}" for k, v in same.items()))
    results = {"roundings_equal": same, "rounded_values": int(rows.size)}
    base = {}
    for kind, path in files.items():
        info = theirs["files"][str(path)]
        ll = np.load(info["logits"])[:, keep]
        mine, load, times = tinygpt_side(path, chunks, act_quant=False)
        mine = mine[:, keep]
        row = {"types": file_types(path), "load_s": [load, info["load"]],
               "chunk_s": [float(np.median(times)), float(np.median(info["eval"]))]}
        variants = {"plain": mine}  # --act-quant on the F32 file: the float16 attention alone
        variants["act_quant"] = tinygpt_side(path, chunks, act_quant=True,
                                             f16_cache=not a.f32_cache)[0][:, keep]
        for name, lg in variants.items():
            kl = kl_rows(ll.reshape(-1, ll.shape[-1]), lg.reshape(-1, lg.shape[-1]))
            same = (ll.argmax(-1) == lg.argmax(-1)).mean()
            row[f"gap_{name}"] = {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
                                  "same_top": float(same),
                                  "max_dlogit_rel": float(np.abs(ll - lg).max()
                                                          / np.abs(ll).max())}
        if kind == "F32":
            base = {"llama": ll, "tinygpt": mine}
        else:
            flat = (-1, ll.shape[-1])
            row["quant_kl"] = {
                "llama.cpp": float(kl_rows(base["llama"].reshape(flat), ll.reshape(flat)).mean()),
                "tinygpt": float(kl_rows(base["tinygpt"].reshape(flat),
                                         mine.reshape(flat)).mean()),
                "tinygpt_act_quant": float(kl_rows(base["tinygpt"].reshape(flat),
                                                   variants["act_quant"].reshape(flat)).mean())}
        results[kind] = row
        print(kind, json.dumps(row, indent=None))
    if a.json:
        a.json.write_text(json.dumps({"llama_cpp_python": theirs["version"], "chunks": a.chunks,
                                      "ctx": a.ctx, "files": results}, indent=2))


if __name__ == "__main__":
    main()
