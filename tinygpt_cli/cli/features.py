"""Learned readers of the model: sparse autoencoders (`tinygpt sae train|eval|feature`) and the
tuned lens (`tinygpt lens --kind tuned|--fit|--evaluate`, whose options live on `lens`)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import InputError
from ..render.text import examples_block
from .app import app
from .common import (
    FORCE,
    JSON,
    QUIET,
    SAVE,
    WEIGHTS,
    check_save,
    load,
    progress,
    save_figure,
    stdout,
)


def _sae() -> None:
    """Sparse autoencoders: train one on a site, evaluate it on held-out text, show a latent.

    Example: tinygpt sae train --site layers.1.resid_post
    Example: tinygpt sae eval
    Example: tinygpt sae feature 300
    """


sae_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)
sae_app.callback(help=examples_block(_sae.__doc__))(_sae)
app.add_typer(sae_app, name="sae")

SHIPPED_SITE = "layers.1.resid_post"
SAE_FILE = typer.Option(None, "--sae", help="The SAE file (default: the weights folder's "
                        f"sae/{SHIPPED_SITE}.safetensors).", show_default=False)


def show(doc: dict, view, as_json: bool) -> None:
    """One JSON document on stdout, or the Rich view (made only when it is shown)."""
    if as_json:
        from ..render import jsonout

        jsonout.emit(doc)
    else:
        stdout().print(view())


def training_files(data: Path | None) -> list[Path]:
    """Every part of the data but the last (the held-out part-005)."""
    return _split(data, "no training data found: give --data DIR (a folder of part-*.txt)")[0]


def held_out_file(data: Path | None) -> list[Path]:
    train, val = _split(data, "no held-out data found: give --data FILE (e.g. part-005.txt)")
    return val or train


def _split(data: Path | None, missing: str) -> tuple[list[Path], list[Path]]:
    from ..train.data import split_data
    from .texts import find_data

    found = data if data is not None else find_data()
    if found is None:
        raise InputError(missing)
    try:
        return split_data([found])
    except ValueError as e:
        raise InputError(str(e)) from None


def windows_of(files: list[Path], model, count: int | None):
    """(inputs, targets) [W, T]: `count` windows spread evenly over the files' token stream."""
    import numpy as np

    from ..train.data import encode_stories, eval_windows, read_stories

    stream = encode_stories(read_stories(files), model.tokenizer)
    x, y = eval_windows(stream.ids, model.config.n_positions)
    if len(x) == 0:
        raise InputError(f"the data has {len(stream.ids)} tokens, less than one window of "
                         f"{model.config.n_positions}")
    if count is not None and count < len(x):
        pick = np.linspace(0, len(x) - 1, count).round().astype(int)
        x, y = x[pick], y[pick]
    return x, y


def sae_path(model, sae: Path | None, site: str = SHIPPED_SITE) -> Path:
    return sae if sae is not None else model.weights_file.parent / "sae" / f"{site}.safetensors"


@sae_app.command("train")
def sae_train(
    site: str = typer.Option(..., "--site", help="The value: layers.N.resid_pre, resid_mid, "
                             "resid_post or mlp_out."),
    weights: Path = WEIGHTS,
    data: Path = typer.Option(None, "--data", help="Stories: a folder of part-*.txt, all but "
                              "the last used (default: the project's data).", show_default=False),
    out: Path = typer.Option(None, "--out", help="Where to write the SAE (default: the weights "
                             "folder's sae/SITE.safetensors).", show_default=False),
    latents: int = typer.Option(1024, "--latents", "-m", min=1, help="Number of latents."),
    k: int = typer.Option(16, "-k", min=1, help="Latents active per token."),
    steps: int = typer.Option(2500, "--steps", min=1, help="Adam steps."),
    batch: int = typer.Option(1024, "--batch", min=1, help="Tokens per step."),
    lr: float = typer.Option(8e-4, "--lr", min=0.0, help="Adam's learning rate."),
    windows: int = typer.Option(1000, "--windows", min=1, help="Windows of training text "
                                "whose values are the training set."),
    seed: int = typer.Option(0, "--seed", help="Seed of the initialisation and the batches."),
    as_json: bool = JSON,
):
    """Train a TopK sparse autoencoder on a site's values over the training text.

    z = TopK_k(ReLU((x - b_dec) W_enc + b_enc)), x_hat = z W_dec + b_dec; Adam on the squared
    error plus the AuxK loss for dead latents. Resumable: a checkpoint OUT.checkpoint.npz is
    written atomically every 100 steps and picked up by the same command.

    Example: tinygpt sae train --site layers.1.resid_post
    Example: tinygpt sae train --site layers.2.mlp_out --latents 2048 -k 32
    """
    from ..analysis import sae as S
    from ..files import sha256
    from ..render import features as view

    model = load(weights)
    site = S.check_site(site, model.config)
    if k > latents:
        raise InputError(f"-k {k} is more than the {latents} latents")
    out = sae_path(model, out, site)
    x_in, _ = windows_of(training_files(data), model, windows)
    with progress(len(x_in), f"values of {site}", enabled=not as_json, pipe_every=5) as advance:
        x = S.site_values(model.params, model.config, x_in, site, progress=advance)
    ckpt = out.with_name(out.name + ".checkpoint.npz")
    settings = {"site": site, "latents": latents, "k": k, "steps": steps, "batch": batch,
                "lr": lr, "windows": windows, "seed": seed}
    state = _resume(ckpt, settings) or S.new_state(x, latents, k, site, seed, lr)
    with progress(steps, "training", enabled=not as_json, pipe_every=5) as advance:
        advance(state.step)

        def each(st):
            advance(1)
            if st.step % 100 == 0 or st.step == steps:
                _checkpoint(ckpt, st, settings)

        S.train_steps(state, x, steps, batch=batch, seed=seed, progress=each)
    S.save_sae(out, state.sae, {"steps": str(steps), "tokens": str(len(x)),
                                "weights_sha256": sha256(model.weights_file)})
    ckpt.unlink(missing_ok=True)
    doc = view.trained_doc(out, state, len(x))
    show(doc, lambda: view.trained_view(doc), as_json)


def _checkpoint(path: Path, state, settings: dict) -> None:
    import io
    import json

    import numpy as np

    from ..files import write_atomically

    arrays = {f"p/{n}": a for n, a in state.sae.params().items()}
    arrays.update({f"m/{n}": a for n, a in state.adam.m.items()})
    arrays.update({f"v/{n}": a for n, a in state.adam.v.items()})
    buf = io.BytesIO()
    np.savez(buf, since_fired=state.since_fired, losses=np.asarray(state.losses),
             step=state.step, t=state.adam.t, settings=json.dumps(settings), **arrays)
    write_atomically(path, buf.getvalue())


def _resume(path: Path, settings: dict):
    """The run's state from its checkpoint, or None when there is none for these settings."""
    import json

    import numpy as np

    from ..analysis import sae as S

    if not path.is_file():
        return None
    try:
        with np.load(path) as z:
            if json.loads(str(z["settings"])) != settings:
                raise InputError(f"{path} is a checkpoint of a run with other settings: "
                                 "delete it or give the same options")
            p = {n: z[f"p/{n}"].copy() for n in ("W_enc", "b_enc", "W_dec", "b_dec")}
            adam = S.Adam(settings["lr"], t=int(z["t"]), m={n: z[f"m/{n}"].copy() for n in p},
                          v={n: z[f"v/{n}"].copy() for n in p})
            sae = S.SAE(**p, site=settings["site"], k=settings["k"])
            return S.TrainState(sae, adam, int(z["step"]), z["since_fired"].copy(),
                                list(z["losses"]))
    except (OSError, ValueError, KeyError) as e:
        from ..errors import WeightsError

        raise WeightsError(f"{path} is not a readable checkpoint ({e}): delete it to start "
                           "over") from None


@sae_app.command("eval")
def sae_eval(weights: Path = WEIGHTS, sae: Path = SAE_FILE,
             data: Path = typer.Option(None, "--data", help="Held-out stories (default: the "
                                       "project's part-005.txt).", show_default=False),
             windows: int = typer.Option(64, "--windows", min=1, help="Windows of the "
                                         "held-out text to evaluate on."),
             as_json: bool = JSON):
    """Evaluate an SAE on held-out text: L0, explained variance, loss recovered, dead latents.

    Loss recovered = (L_ablated - L_sae) / (L_ablated - L_clean), against zero ablation and
    against mean ablation of the site (its mean over the same tokens); the loss increase is
    L_sae - L_clean in nats per token. Dead: latents that never fire on these tokens.

    Example: tinygpt sae eval
    Example: tinygpt sae eval --sae my.safetensors --json
    """
    from ..analysis import sae as S
    from ..render import features as view

    model = load(weights)
    found = S.load_sae(sae_path(model, sae), model.config)
    files = held_out_file(data)
    x, y = windows_of(files, model, windows)
    with progress(4, "evaluating", enabled=not as_json, pipe_every=5) as advance:
        result = S.evaluate(model.params, model.config, found, x, y, progress=advance)
    names = [f.name for f in files]
    show(view.eval_doc(result, names), lambda: view.eval_view(result, names), as_json)


@sae_app.command("feature")
def sae_feature(latent: int = typer.Argument(..., help="The latent's index."),
                weights: Path = WEIGHTS, sae: Path = SAE_FILE,
                data: Path = typer.Option(None, "--data", help="Stories to search (default: "
                                          "the project's training parts).", show_default=False),
                windows: int = typer.Option(1000, "--windows", min=1, help="Windows of the "
                                            "data to search (spread evenly; cached)."),
                top: int = typer.Option(8, "--top", "-n", min=1, help="How many contexts."),
                text: str = typer.Option(None, "--text", show_default=False, help="Show the "
                                         "latent at each token of this text instead ('-': stdin)."),
                as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE,
                quiet: bool = QUIET):
    """One latent: its top activating contexts, the tokens it promotes and suppresses, its
    activation histogram; or, with --text, its value at each token of a text.

    Promotes/suppresses: W_dec[latent] * ln_final.weight @ W_E^T, the direct path to the
    logits (the final norm's centring and per-token scale left out). The latents of the data
    are computed once per (weights, SAE, data) and cached.

    Example: tinygpt sae feature 17
    Example: tinygpt sae feature 17 --save latent17.html
    Example: tinygpt sae feature 17 --text "Lily wanted to play with her ball." --save f.svg
    """
    from ..analysis import sae as S
    from ..render import features as view
    from ..session import check_index

    check_save(save, force)
    if text is not None:
        return _feature_on_text(weights, sae, latent, text, as_json, save, force)
    model = load(weights)
    path = sae_path(model, sae)
    found = S.load_sae(path, model.config)
    latent = check_index(latent, found.n_latents, "latent")
    files = training_files(data) if data is None or Path(data).is_dir() else [Path(data)]
    codes = _codes_cache(model, found, path, files, windows, enabled=not as_json)
    result = S.feature_report(found, model.params, codes["ids"], codes["idx"], codes["val"],
                              latent, top)
    save_figure(view.feature_figure(result, model.tokenizer), save, force)
    show(view.feature_doc(result, model.tokenizer),
         lambda: view.feature_view(result, model.tokenizer), as_json)


def _feature_on_text(weights, sae, latent: int, text: str, as_json: bool, save, force) -> None:
    """`sae feature N --text TEXT`: the latent at each token of the text."""
    from ..analysis import sae as S
    from ..render import features as view
    from .common import run

    r = run(weights, text)
    found, tok = S.load_sae(sae_path(r.model, sae), r.model.config), r.model.tokenizer
    result = S.latent_on_text(found, r.model.params, r.trace.get(found.site), latent)
    save_figure(view.text_figure(result, r.tokens, tok), save, force)
    path = f"sae.{found.site}.{result.latent}"  # as `trace TEXT sae.SITE.N` names it
    show(r.document(path, result.acts, **view.text_fields(result, tok)),
         lambda: view.text_view(result, r.tokens, tok), as_json)


def _codes_cache(model, found, path: Path, files: list[Path], windows: int, enabled: bool):
    """The SAE's sparse codes (indices, values) at every token of the data windows."""
    import io

    import numpy as np

    from .. import cache
    from ..analysis import sae as S
    from ..files import sha256, write_atomically

    key = cache.key_of("sae-codes-v1", sha256(model.weights_file), sha256(path),
                       *(sha256(f) for f in files), str(windows))
    entry = cache.entry("sae", key)
    if entry.is_file():
        try:
            with np.load(entry) as z:
                return dict(z)
        except (OSError, ValueError):
            pass  # a damaged entry is computed again
    x_in, _ = windows_of(files, model, windows)
    with progress(len(x_in), "latents of the data", enabled=enabled, pipe_every=5) as advance:
        x = S.site_values(model.params, model.config, x_in, found.site, progress=advance)
    idx, val = S.sparse_codes(found, x)
    codes = {"ids": x_in.astype(np.uint16), "idx": idx, "val": val}
    buf = io.BytesIO()
    np.savez(buf, **codes)
    write_atomically(entry, buf.getvalue())
    return codes


# ------------------------------------------------------------------ the tuned lens (`lens`)

LENS_KINDS = ("logit", "tuned")
LENS_FIT_WINDOWS = 200  # 25,600 training tokens
LENS_EVAL_WINDOWS = 40  # 5,120 held-out tokens
LENS_FIT_STEPS = 300  # Adam steps per stage, 512 tokens each


def check_lens_kind(kind: str) -> str:
    if kind not in LENS_KINDS:
        raise InputError(f"--kind must be logit or tuned, not {kind!r}")
    return kind


def lens_path(model, lens_file: Path | None) -> Path:
    return lens_file if lens_file is not None else \
        model.weights_file.parent / "lens" / "tuned.safetensors"


def tuned_lens(session, trace, lens_file: Path | None):
    """The tuned lens of a session's text as a Lens (stages, logits), the model's logits last."""
    from ..analysis import tuned_lens as tl
    from ..analysis.lens import Lens

    translators = tl.load_translators(lens_path(session.model, lens_file), session.config)
    names, logits = tl.tuned_stage_logits(trace, translators, session.params, session.config)
    return Lens(names, logits)


def tuned_lens_work(weights: Path | None, fit: bool, evaluate: bool, lens_file: Path | None,
                    data: Path | None, as_json: bool) -> None:
    """`lens --fit` (then --evaluate, when both are given) or `lens --evaluate`."""
    from ..analysis import tuned_lens as tl
    from ..files import sha256
    from ..render import features as view

    model = load(weights)
    cfg, path = model.config, lens_path(model, lens_file)
    if fit:
        x, _ = windows_of(training_files(data), model, LENS_FIT_WINDOWS)
        with progress(len(x), "values of the stages", enabled=not as_json, pipe_every=5) as adv:
            stages, last = tl.stage_values(model.params, cfg, x, progress=adv)
        steps = LENS_FIT_STEPS
        with progress(steps * cfg.n_layer, "fitting the tuned lens", enabled=not as_json,
                      pipe_every=5) as adv:
            translators, _ = tl.fit(stages, last, model.params, cfg, steps=steps, progress=adv)
        tl.save_translators(path, translators, {"weights_sha256": sha256(model.weights_file),
                                                "tokens": str(len(last)), "steps": str(steps)})
        if not evaluate:
            doc = {"path": str(path), "stages": tl.stage_paths(cfg), "tokens": len(last)}
            show(doc, lambda: view.lens_fit_view(doc), as_json)
            return
    translators = tl.load_translators(path, cfg)
    files = held_out_file(data) if data is None or Path(data).is_dir() else [Path(data)]
    x, _ = windows_of(files, model, LENS_EVAL_WINDOWS)
    with progress(2 * x.size, "evaluating both lenses", enabled=not as_json, pipe_every=5) as adv:
        result = tl.evaluate_windows(model.params, cfg, x, translators, progress=adv)
    names = [f.name for f in files]
    show(view.lens_eval_doc(result, names), lambda: view.lens_eval_view(result, names), as_json)


# ------------------------------------------------------------------ latents in trace and --ablate


def latent_ablation(model, paths: list[str]):
    """A Replace hook zeroing each `sae.SITE.N` latent, its SAE read from the weights folder's
    sae/SITE.safetensors; the reconstruction error stays in the stream."""
    from ..analysis import sae as S
    from ..hooks import Replace
    from ..session import check_index

    by_site: dict[str, list[int]] = {}
    for p in paths:
        site, latent = S.parse_latent_path(p, model.config)
        if latent is None:
            raise InputError(f"--ablate takes one latent, e.g. {p}.17, not the whole SAE {p!r}")
        by_site.setdefault(site, []).append(latent)
    fns = {}
    for site, latents in by_site.items():
        sae = S.load_sae(sae_path(model, None, site), model.config)
        fns[site] = S.without_latents(sae, [check_index(j, sae.n_latents, "latent")
                                            for j in latents])
    return Replace(fns)


def trace_latents(weights, text, path: str, ablate, as_json: bool) -> None:
    """`trace TEXT sae.SITE`: the SAE's active latents at each token (after any --ablate)."""
    from ..analysis import sae as S
    from ..render import features as view
    from ..session import check_index
    from .common import run

    r = run(weights, text, ablate)
    site, latent = S.parse_latent_path(path, r.model.config)
    sae = S.load_sae(sae_path(r.model, None, site), r.model.config)
    z = S.encode(sae, r.trace.get(site))  # [T, m]
    if latent is not None:
        latent = check_index(latent, sae.n_latents, "latent")
        z = z[:, latent]
    active = S.active_latents(z) if latent is None else None
    show(r.document(path, z, site=site, k=sae.k, active=active),
         lambda: view.latents_view(path, r.tokens, z, active), as_json)


for _command in sae_app.registered_commands:  # each Example: line on a line of its own
    _command.help = examples_block(_command.callback.__doc__)
