"""Write examples/tour.ipynb, the notebook tour (its cells only, no outputs: run it, or let
tests/test_notebook.py run it; it checks the file is this script's). Run from the repository
root: python examples/make_tour.py
"""

import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = []


def md(text: str) -> None:  # ids by place: the same cells, the same file
    cells.append(new_markdown_cell(text.strip(), id=f"cell-{len(cells)}"))


def code(text: str) -> None:
    cells.append(new_code_cell(text.strip(), id=f"cell-{len(cells)}"))


md("""
# A tour of tinygpt, in a notebook

The "Quick review" page follows the sentence *"Lily wanted to play with her"* through the
model, card by card. Here each card is one call, and three analyses follow. Every command of
`tinygpt --help` is a method of the model, named as the command (`final-norm` is `final_norm`),
its options by their words (`--all-heads` is `all_heads=True`). Each returns a result whose
`.document` is what the command's `--json` prints and which the notebook shows as the picture
its `--save` writes: no network, no JavaScript library to fetch.

Install the extras this notebook needs to run it yourself: `pip install "tinygpt-cli[notebook]"`.
""")
code("""
import json

import tinygpt_cli as tg

model = tg.load()  # the shipped model; tg.load("a weights folder") for any other
text = "Lily wanted to play with her"
model
""")
md("""
## 1. Inputs

Your text, split into tokens. Each token is an id number from the vocabulary.
""")
code("""
encoded = model.encode(text)
print(json.dumps({"ids": encoded["ids"], "tokens": encoded["tokens"]}))
""")
md("""
## 2. Embedding

Each id picks one row from a table of learned numbers, W_E: 6 rows of 128 numbers.
""")
code("""
model.embed(text)
""")
md("""
## 3. Position

Each position also gets a row of numbers, W_P, added to the token's row (`sum=True` shows
the sum, `trace.embeddings`).
""")
code("""
model.pos(text, sum=True)
""")
md("""
## 4. Add and norm

The norm rescales each token's 128 numbers to a steady range, before attention and before the
feed-forward layer.
""")
code("""
model.norm(text, layer=0, which="ln1")
""")
md("""
## 5. Masked attention

Each token looks at itself and the tokens before it: one 6 by 6 grid per head, each row
summing to 1. The same grid is in the run's cache, under tinygpt's path and under
TransformerLens's hook name.
""")
code("""
attn = model.attn(text, layer=0, head=0)
print(json.dumps(attn["data"][-1]))  # what the last token looks at
attn
""")
code("""
logits, cache = model.run_with_cache(text)
print(cache["layers.0.heads.0.weights"].shape, cache["blocks.0.attn.hook_pattern"].shape)
cache.picture("blocks.0.attn.hook_pattern")  # every head of block 0
""")
md("""
## 6. Feed forward

Each token's numbers go through a small network on their own: 128 numbers grow to 512, pass
through GELU, and shrink back to 128.
""")
code("""
model.mlp(text, layer=0)
""")
md("""
## 7. Repeated blocks

The model repeats the block four times; each refines the numbers further.
""")
code("""
model.blocks(text)
""")
md("""
## 8–10. Final norm, linear, softmax

One last norm, then one score per vocabulary token, then chances that add up to 1.
""")
code("""
model.final_norm(text)
""")
code("""
model.logits(text, top=5)
""")
code("""
probs = model.probs(text, top=5)
print(json.dumps(probs["top"]))
probs
""")
md("""
## 11. Output

Pick one next token from the chances with a seeded generator: the same seed, the same pick.
""")
code("""
sample = model.sample(text, seed=1)
print(json.dumps({"token": sample["token"], "chance": sample["chance"]}))
""")
md("""
## Change a value, then look

A hook function sees the value it names (any spelling: here the first MLP's output by its
TransformerLens name) and returns what is used instead.
""")
code("""
def without_mlp(x, hook):  # hook.name: the name as given
    return 0 * x

changed = model.run_with_hooks(text, fwd_hooks=[("blocks.0.hook_mlp_out", without_mlp)])
print(float(logits[-1, 652]), float(changed[-1, 652]))  # the logit of " toys", before and after
""")
md("""
## Three analyses

**Logit lens**: the stream after every stage read through the final norm and the head: where
" toys" becomes the answer.
""")
code("""
lens = model.lens(text, target=" toys")
print(json.dumps(lens["target_chances"]))
lens
""")
md("""
**Direct logit attribution**: each part of the final stream's share of logit(" toys") −
logit(" mom"); the rows add up to the difference.
""")
code("""
dla = model.dla(text, target=" toys", vs=" mom")
print(json.dumps({"score": dla["score"], "total": dla["total"]}))
dla
""")
md("""
**Ablation**: take out each head and each MLP in turn; the change in log p(" toys").
""")
code("""
ablate = model.ablate(text, all=True)
print(json.dumps(ablate["components"][:3]))
ablate
""")
nb = new_notebook(cells=cells, metadata={
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"}})
nbformat.write(nb, sys.argv[1] if len(sys.argv) > 1 else "examples/tour.ipynb")
