"""A Llama folder shaped like SmolLM2-135M against transformers: logits, whole-process greedy
generation, a traced pass at T = 512 and the generate process's peak memory (from the
bfloat16 file, and from the same model saved in float32).

The folder is made here by transformers (30 blocks of 576 numbers, 9 query heads on 3
key/value heads, a SwiGLU of 1,536, a tied 49,152-token head, seeded random weights saved as
bfloat16) with the shipped tokenizer, so its ids stay below 4,096. One thread each, as
run.py. Run from the repository root:

    python benchmarks/families_speed.py            # prints the rows, --markdown for results.md
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402, I001  (first: it sets one thread before NumPy loads)

import numpy as np  # noqa: E402

SMOL = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
            tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5)
TOKENS = 64


def smol_folder(folder: Path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tinygpt_cli.storage.locations import SHIPPED

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = LlamaForCausalLM(LlamaConfig(**SMOL, attn_implementation="eager")).eval()
    model.to(torch.bfloat16).save_pretrained(folder)
    shutil.copyfile(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def rows(runs: int, folder: Path, hf) -> list:
    import torch

    from tinygpt_cli.transformer.folder import load_model
    from tinygpt_cli.transformer.model import forward

    Row = bench.Row
    ours = load_model(folder)
    f32_mb = sum(a.size for a in ours.params.values()) * 4 / 2**20
    ids = bench.text_ids(ours, 512)
    with torch.inference_mode():
        want = hf(torch.from_numpy(ids[None, :64])).logits[0].numpy()
    got = forward(ours.params, ours.config, ids[:64])
    gap = float(np.abs(got - want).max() / np.abs(want).max())
    out = [Row("SmolLM2-135M shape: logits of 64 tokens, largest |difference| over largest "
               "|logit|", f"{gap:.1e}", goal="<= 1e-4", passed=gap <= 1e-4)]
    prompt = ours.tokenizer.encode(bench.PROMPT)
    x = torch.tensor([prompt])
    cmd = bench.tinygpt_cmd() + ["generate", bench.PROMPT, "-t", "0", "-n", str(TOKENS),
                                 "--no-stop", "--weights", str(folder)]
    measured, walls, theirs = [], [], []

    def reference():
        with torch.inference_mode():
            hf.generate(x, max_new_tokens=TOKENS, eos_token_id=None, do_sample=False,
                        use_cache=True, pad_token_id=0)

    # two warm-up processes: the first runs after this process has built, saved and loaded
    # two copies of the model, and were 2-3 s of CPU slower than the runs after them
    measured += [bench.run_measured(cmd) for _ in range(2)]
    reference()  # warm-up
    for _ in range(runs):
        measured.append(bench.run_measured(cmd))
        walls.append(measured[-1][0])
        t = time.perf_counter()
        reference()
        theirs.append(time.perf_counter() - t)
    t, tr = statistics.median(walls), statistics.median(theirs)
    out.append(Row(f"SmolLM2-135M shape: greedy generation of {TOKENS} tokens, the whole "
                   "tinygpt process against transformers' generate alone",
                   f"{TOKENS / t:,.1f} tokens/s", f"{TOKENS / tr:,.1f} tokens/s", tr / t,
                   ">= 1.2x", tr / t >= 1.2))
    peak = max(m[2] for m in measured)
    most = f32_mb + 150
    out.append(Row(f"SmolLM2-135M shape: peak memory of that generate (float32 weights "
                   f"{f32_mb:.0f} MB)", f"{peak} MB", goal=f"<= {most:.0f} MB (+ 150)",
                   passed=peak <= most))
    # the same model saved in float32, as a folder converted from a checkpoint often is
    wide = folder.parent / "smol-float32"
    hf.save_pretrained(wide)
    shutil.copyfile(folder / "tokenizer.json", wide / "tokenizer.json")
    peak = max(bench.run_measured([*cmd[:-1], str(wide)])[2] for _ in range(runs))
    out.append(Row("SmolLM2-135M shape: peak memory of that generate from a float32 file",
                   f"{peak} MB", goal=f"<= {most:.0f} MB (+ 150)", passed=peak <= most))
    out.append(bench.traced_row("SmolLM2-135M shape", ours, hf, ids, runs))
    return out


def main(argv: list[str] | None = None) -> int:
    return bench.on_made_folder(argv, __doc__, "smol", smol_folder, rows)


if __name__ == "__main__":
    sys.exit(main())
