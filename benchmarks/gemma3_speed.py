"""A Gemma 3 folder shaped like Gemma-3-270M against transformers: logits, whole-process greedy
generation, the generate process's peak memory and a traced pass at T = 512 (issue 48).

The folder is made here by transformers: 18 blocks of 640 numbers, 4 query heads of 256 on one
key/value head, a GeGLU of 2,048, a tied 262,144-token head, sliding windows of 512 keys with
every sixth block full (rotary bases 10,000 and 1,000,000), seeded random weights saved as
bfloat16, with the shipped tokenizer (its ids stay below 4,096). One thread each, as run.py.
Run from the repository root:

    python benchmarks/gemma3_speed.py            # prints the rows, --markdown for results.md
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402, I001  (first: it sets one thread before NumPy loads)

import numpy as np  # noqa: E402

GEMMA = dict(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
             num_attention_heads=4, num_key_value_heads=1, head_dim=256,
             query_pre_attn_scalar=256, sliding_window=512, max_position_embeddings=32768,
             tie_word_embeddings=True, rms_norm_eps=1e-6, bos_token_id=2, eos_token_id=1,
             pad_token_id=0, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
             layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                          for i in range(18)])
TOKENS = 64


def gemma_folder(folder: Path):
    """Save the random bfloat16 model; transformers' float32 copy of it, eager attention
    (the one that returns the patterns, as the traced pass does)."""
    import torch
    from transformers import AutoModelForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

    from tinygpt_cli.storage.locations import SHIPPED

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**GEMMA)).eval()
    model.to(torch.bfloat16).save_pretrained(folder)
    del model
    shutil.copyfile(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    # the file's bfloat16 model scales its embeddings by sqrt(640) rounded to bfloat16
    # (25.25); the float32 copy would use 25.298: given the file's number, as tinygpt reads it
    emb = hf.model.embed_tokens
    emb.embed_scale.fill_(torch.tensor(emb.scalar_embed_scale).to(torch.bfloat16).float())
    return hf


def rows(runs: int, folder: Path, hf) -> list:
    import torch

    from tinygpt_cli.transformer.folder import load_model
    from tinygpt_cli.transformer.model import forward

    Row = bench.Row
    os.environ["TINYGPT_FLOAT32_COPY"] = "0"  # this process's own load keeps none, so that
    try:  # the first command below is a user's first, with none yet
        ours = load_model(folder)
    finally:
        del os.environ["TINYGPT_FLOAT32_COPY"]
    f32_mb = sum(a.size for a in ours.params.values()) * 4 / 2**20
    ids = bench.text_ids(ours, 512)
    with torch.inference_mode():
        want = hf(torch.from_numpy(ids[None, :64])).logits[0].numpy()
    got = forward(ours.params, ours.config, ids[:64])
    gap = float(np.abs(got - want).max() / np.abs(want).max())
    out = [Row("Gemma-3-270M shape: logits of 64 tokens, largest |difference| over largest "
               "|logit|", f"{gap:.1e}", goal="<= 1e-4", passed=gap <= 1e-4)]
    del got, want
    prompt = ours.tokenizer.encode(bench.PROMPT)
    x = torch.tensor([prompt])
    cmd = bench.tinygpt_cmd() + ["generate", bench.PROMPT, "-t", "0", "-n", str(TOKENS),
                                 "--no-stop", "--weights", str(folder)]
    measured, walls, theirs, cpus, their_cpus = [], [], [], [], []

    def reference():
        with torch.inference_mode():
            hf.generate(x, max_new_tokens=TOKENS, eos_token_id=None, do_sample=False,
                        use_cache=True, pad_token_id=0)

    # warm-up: the file's pages into the page cache, and the model's float32 copy kept in
    # tinygpt's cache (float32_copy.py), which later runs map: a user's first command
    measured.append(bench.run_measured(cmd))
    reference()
    for _ in range(runs):
        measured.append(bench.run_measured(cmd))
        walls.append(measured[-1][0])
        cpus.append(measured[-1][1])
        t, c = time.perf_counter(), time.process_time()
        reference()
        theirs.append(time.perf_counter() - t)
        their_cpus.append(time.process_time() - c)
    assert all(m[3] == 0 for m in measured), measured
    t, tr = statistics.median(walls), statistics.median(theirs)
    out.append(Row(f"Gemma-3-270M shape: greedy generation of {TOKENS} tokens, the whole "
                   "tinygpt process against transformers' generate alone",
                   f"{TOKENS / t:,.1f} tokens/s", f"{TOKENS / tr:,.1f} tokens/s", tr / t,
                   ">= 1.2x", tr / t >= 1.2))
    # on a busy machine the wall clock waits for the other processes: the CPU time too
    c, cr = statistics.median(cpus), statistics.median(their_cpus)
    out.append(Row("Gemma-3-270M shape: the same, CPU seconds (tinygpt: the whole process)",
                   f"{c:.2f} s", f"{cr:.2f} s", cr / c, ">= 1.2x", cr / c >= 1.2))
    out.append(Row("Gemma-3-270M shape: the same, the first run (no float32 copy yet: the "
                   "weights widened, then the copy written)", f"{measured[0][0]:.2f} s",
                   f"{tr:.2f} s", tr / measured[0][0]))
    peak = max(m[2] for m in measured)
    most = f32_mb + 150
    out.append(Row(f"Gemma-3-270M shape: peak memory of that generate (float32 weights "
                   f"{f32_mb:.0f} MB)", f"{peak} MB", goal=f"<= {most:.0f} MB (+ 150)",
                   passed=peak <= most))
    out.append(bench.traced_row("Gemma-3-270M shape", ours, hf, ids, runs))
    return out


def main(argv: list[str] | None = None) -> int:
    return bench.on_made_folder(argv, __doc__, "gemma", gemma_folder, rows)


if __name__ == "__main__":
    sys.exit(main())
