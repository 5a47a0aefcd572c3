"""The notebook API in a plain script: load, run_with_cache, run_with_hooks, a command as a
function. Run from the repository root: python examples/from_python.py"""

import tinygpt_cli as tg

model = tg.load()  # the shipped model
text = "Lily wanted to play with her"

logits, cache = model.run_with_cache(text)
print(logits.shape, cache["blocks.0.attn.hook_pattern"].shape)  # TransformerLens's name
print(cache["pattern", 0][0, -1].round(3))  # what the last token looks at (head 0)
print(model.cfg.n_layers, model.W_Q.shape, round(model(text, return_type="loss"), 3))

toys = model.to_tokens(" toys")[0]
zeroed = model.run_with_hooks(text, fwd_hooks=[("blocks.0.hook_mlp_out", lambda x, hook: 0 * x)])
print(f"logit of ' toys': {logits[-1, toys]:.3f}, without block 0's MLP: {zeroed[-1, toys]:.3f}")

lens = model.lens(text, target=" toys")  # `tinygpt lens ... --json`, as a read-only mapping
print(lens)
print([round(p, 3) for p in lens["target_chances"]])
