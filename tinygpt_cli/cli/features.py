"""Learned readers of the model: sparse autoencoders (`tinygpt sae train|eval|feature`) and the
tuned lens (`tinygpt lens --kind tuned|--fit|--evaluate`, whose options live on `lens`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..errors import InputError
from ..render.text import examples_block
from .app import app
from .common import (
    FORCE,
    FORCE_FILE,
    JSON,
    QUIET,
    SAVE,
    TRAINING_SEED,
    TRAINING_TEXT,
    WEIGHTS,
    bar,
    check_out,
    check_save,
    engine,
    load,
    present,
    steered,
)
from .steering import keep_default_file, steerable

if TYPE_CHECKING:
    from .context import RunContext


def _sae() -> None:
    """Sparse autoencoders: train one on a site, evaluate it on held-out text, show a latent.

    Example: tinygpt sae train --site layers.2.mlp_out
    Example: tinygpt sae eval
    Example: tinygpt sae feature 300
    """


sae_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)
sae_app.callback(help=examples_block(_sae.__doc__))(_sae)
app.add_typer(sae_app, name="sae")

SAE_FILE = typer.Option(None, "--sae", help="The SAE: a tinygpt SAE file, or a SAELens folder "
                        "(cfg.json + sae_weights.safetensors; default: the weights folder's "
                        "sae/layers.1.resid_post.safetensors).", show_default=False)


@sae_app.command("train")
@steerable  # the site's values of the steered run: --steer needs --out
def sae_train(
    context: RunContext,
    site: str = typer.Option(..., "--site", help="The value: layers.N.resid_pre, resid_mid, "
                             "resid_post or mlp_out."),
    weights: Path = WEIGHTS,
    data: Path = TRAINING_TEXT,
    out: Path = typer.Option(None, "--out", help="Where to write the SAE (default: the weights "
                             "folder's sae/SITE.safetensors).", show_default=False),
    latents: int = typer.Option(1024, "--latents", min=1, help="Number of latents."),
    k: int = typer.Option(16, "--k", min=1, help="Latents active per token (TopK's k)."),
    steps: int = typer.Option(2500, "--steps", min=1, help="Adam steps."),
    batch: int = typer.Option(1024, "--batch", min=1, help="Tokens per step."),
    lr: float = typer.Option(8e-4, "--lr", min=0.0, help="Adam's learning rate."),
    windows: int = typer.Option(1000, "--windows", min=1, help="Windows of training text "
                                "whose values are the training set."),
    seed: int = TRAINING_SEED,
    force: bool = FORCE_FILE,
    as_json: bool = JSON,
):
    """Train a TopK sparse autoencoder on a site's values over the training text.

    z = TopK_k(ReLU((x - b_dec) W_enc + b_enc)), x_hat = z W_dec + b_dec; Adam on the squared
    error plus the AuxK loss for dead latents. Resumable: a checkpoint OUT.checkpoint.npz is
    written atomically every 100 steps and picked up by the same command. Steered: trained
    on the steered run's values, written only to --out FILE, whose metadata says so.

    Example: tinygpt sae train --site layers.2.mlp_out
    Example: tinygpt sae train --site layers.1.resid_post --out mine.safetensors --k 32
    Example: tinygpt sae train --site layers.1.mlp_out --steer-vector h.safetensors --out hs.sae
    """
    from ..analysis import sae as S
    from ..jobs import sae as job
    from ..jobs.corpus import data_windows, training_files
    from ..jobs.dictionaries.saes import sae_file
    from ..render import features as view
    from ..storage.files import sha256

    keep_default_file(context, out, "the weights folder's sae/SITE.safetensors")
    model = load(context, weights)
    site = S.check_site(site, model.config)
    check_out(out, force, example="--out sae.safetensors", folder_made=True,
              default=sae_file(model.weights_file, None, site))
    hooks, changes = steered(context, model)
    if k > latents:
        raise InputError(f"--k {k} is more than the {latents} latents")
    out = Path(out) if out is not None else sae_file(model.weights_file, None, site)
    x_in, _ = data_windows(training_files(data), model.tokenizer, model.config.n_positions,
                           windows, bar())
    with bar()(len(x_in), f"values of {site}") as advance, engine(context) as where:
        x = job.site_values_on(where, model.params, model.config, x_in, site,
                               progress=advance, hooks=hooks)
    settings = {"site": site, "latents": latents, "k": k, "steps": steps, "batch": batch,
                "lr": lr, "windows": windows, "seed": seed}
    state = job.train_resumably(x, out, settings, sha256(model.weights_file), bar(),
                                changes)
    doc = {**view.trained_doc(out, state, len(x)), **changes}
    present(context, as_json, lambda: doc, lambda: view.trained_view(doc))


@sae_app.command("eval")
@steerable  # every loss is the steered run's; the SAE is spliced into the steered run
def sae_eval(context: RunContext, weights: Path = WEIGHTS, sae: Path = SAE_FILE,
             data: Path = typer.Option(None, "--data", help="Held-out stories (default: the "
                                       "project's part-005.txt).", show_default=False),
             windows: int = typer.Option(64, "--windows", min=1, help="Windows of the "
                                         "held-out text to evaluate on."),
             as_json: bool = JSON):
    """Evaluate an SAE on held-out text: L0, explained variance, loss recovered, dead latents.

    Loss recovered = (L_ablated - L_sae) / (L_ablated - L_clean), against zero ablation and
    against mean ablation of the site (its mean over the same tokens); the loss increase is
    L_sae - L_clean in nats per token. Dead: latents that never fire on these tokens.
    Steered: every run is the steered one (the clean loss too; the SAE replaces its site).

    Example: tinygpt sae eval
    Example: tinygpt sae eval --sae my.safetensors --json
    Example: tinygpt sae eval --steer happy --steer-away sad --steer-layer 1
    """
    from ..jobs import sae as job
    from ..jobs.dictionaries.saes import model_sae
    from ..render import features as view

    model = load(context, weights)
    found = model_sae(model, sae)
    hooks, changes = steered(context, model)
    with bar()(4, "evaluating") as advance, engine(context) as where:
        result, names = job.evaluate_held_out(model, found, data, windows, advance, hooks,
                                              where)
    present(context, as_json, lambda: {**view.eval_doc(result, names), **changes},
            lambda: view.eval_view(result, names))


@sae_app.command("feature")
@steerable  # its data search and --text run steered, like every command that runs a text
def sae_feature(context: RunContext,
                latent: int = typer.Argument(..., metavar="LATENT", help="The latent's index."),
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
    """One latent: its top contexts, the tokens it promotes and suppresses, its histogram.

    With --text: its value at each token of that text instead. Promotes/suppresses:
    W_dec[latent] * ln_final.weight @ W_E^T, the direct path to the logits (the final norm's
    centring and per-token scale left out). The latents of the data are computed once per
    (weights, SAE, data) and cached.

    Example: tinygpt sae feature 17
    Example: tinygpt sae feature 17 --save latent17.html
    Example: tinygpt sae feature 17 --text "Lily wanted to play with her ball." --save f.svg
    """
    from ..analysis import sae as S
    from ..jobs import sae as job
    from ..jobs.corpus import given_or, training_files
    from ..jobs.dictionaries.saes import SHIPPED_SITE, load_sae, sae_file
    from ..jobs.session import check_index
    from ..render import features as view

    check_save(save, force)
    if text is not None:
        return _feature_on_text(context, weights, sae, latent, text, as_json, save, force)
    model = load(context, weights)
    path = sae_file(model.weights_file, sae)
    found = load_sae(path, model.config, model.weights_file,
                     default_site=SHIPPED_SITE if sae is None else None)
    latent = check_index(latent, found.n_latents, "latent")
    files = given_or(data, training_files)
    hooks, changes = steered(context, model)
    with engine(context) as where:
        codes = job.data_codes(model, found, path, files, windows, bar(), hooks, where)
    result = S.feature_report(found, model.params, codes["ids"], codes["idx"], codes["val"],
                              latent, top)
    present(context, as_json, lambda: {**view.feature_doc(result, model.tokenizer), **changes},
            lambda: view.feature_view(result, model.tokenizer),
            figure=lambda: view.feature_figure(result, model.tokenizer), save=save, force=force)


def _feature_on_text(context: RunContext, weights, sae, latent: int, text: str, as_json: bool,
                     save, force) -> None:
    """`sae feature N --text TEXT`: the latent at each token of the text."""
    from ..analysis import sae as S
    from ..jobs.dictionaries.saes import model_sae
    from ..render import features as view
    from ..render.documents import session_document
    from .common import run

    r = run(context, weights, text)
    found, tok = model_sae(r.model, sae), r.model.tokenizer
    result = S.latent_on_text(found, r.model.params, r.trace.get(found.site), latent)
    path = f"sae.{found.site}.{result.latent}"  # as `trace TEXT sae.SITE.N` names it
    present(context, as_json, lambda: session_document(r, path, result.acts,
                                              **view.text_fields(result, tok)),
            lambda: view.text_view(result, r.tokens, tok),
            figure=lambda: view.text_figure(result, r.tokens, tok), save=save, force=force)


@sae_app.command("export")
def sae_export(context: RunContext, weights: Path = WEIGHTS, sae: Path = SAE_FILE,
               out: Path = typer.Option(..., "--out", help="The folder to write: cfg.json and "
                                        "sae_weights.safetensors."),
               fmt: str = typer.Option("saelens", "--format", help="saelens: the folder "
                                       "SAELens' SAE.load_from_disk reads (the only format)."),
               force: bool = FORCE_FILE, as_json: bool = JSON):
    """Write an SAE in another library's format: a SAELens folder.

    It holds cfg.json and sae_weights.safetensors, hook_name in TransformerLens' spelling.
    The folder also names the weights the SAE was made for (metadata.weights_sha256), so
    tinygpt's --sae DIR checks it as it checks its own files.

    Example: tinygpt sae export --out sae-saelens
    Example: tinygpt sae export --sae mine.safetensors --out mine-saelens --force
    """
    from ..jobs.dictionaries.saelens import CFG, export_saelens, hook_name
    from ..jobs.dictionaries.saes import model_sae
    from ..render import features as view
    from ..storage.madefor import made_for

    if fmt != "saelens":
        raise InputError(f"--format {fmt!r}: the one format sae export writes is saelens")
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: that is a file; give a folder for the SAELens files")
    if (out / CFG).exists() and not force:
        raise InputError(f"--out {out}: it holds an SAE already ({CFG}); add --force to "
                         "overwrite it")
    model = load(context, weights)
    found = model_sae(model, sae)
    files = export_saelens(found, out, model.config, made_for(model.weights_file),
                           model.folder.name)
    doc = {"format": "saelens", "path": str(out), "files": [str(f) for f in files],
           "site": found.site, "hook_name": hook_name(found.site, model.config), "k": found.k,
           "latents": found.n_latents}
    present(context, as_json, lambda: doc, lambda: view.exported_view(doc))


# ------------------------------------------------------------------ the tuned lens (`lens`)

def tuned_lens_work(context: RunContext, weights: Path | None, fit: bool, evaluate: bool,
                    lens_file: Path | None, data: Path | None, as_json: bool,
                    force: bool = False) -> None:
    """`lens --fit` (then --evaluate, when both are given) or `lens --evaluate`."""
    from ..analysis import tuned_lens as tl
    from ..jobs import tuned_lens as job
    from ..jobs.dictionaries.lens import lens_file as lens_path
    from ..jobs.dictionaries.lens import load_translators
    from ..render import features as view

    if fit:
        keep_default_file(context, lens_file, "the weights folder's lens/tuned.safetensors",
                          "--lens")
    model = load(context, weights)
    cfg, path = model.config, lens_path(model.weights_file, lens_file)
    hooks, changes = steered(context, model)
    if fit:
        check_out(lens_file, force, example="--lens tuned.safetensors", folder_made=True,
                  option="--lens", default=path)
        with engine(context) as where:
            tokens = job.fit_on_training_text(model, data, path, bar(), hooks, changes,
                                              where)
        if not evaluate:
            doc = {"path": str(path), "stages": tl.stage_paths(cfg), "tokens": tokens, **changes}
            present(context, as_json, lambda: doc, lambda: view.lens_fit_view(doc))
            return
    translators = load_translators(path, cfg, model.weights_file)
    with engine(context) as where:
        result, names = job.evaluate_held_out(model, data, translators, bar(), hooks,
                                              where)
    present(context, as_json, lambda: {**view.lens_eval_doc(result, names), **changes},
            lambda: view.lens_eval_view(result, names))


# ------------------------------------------------------------------ latents in trace and --ablate


def trace_latents(context: RunContext, weights, text, path: str, ablate, as_json: bool) -> None:
    """`trace TEXT sae.SITE`: the SAE's active latents at each token (after any --ablate)."""
    from ..analysis import sae as S
    from ..jobs.dictionaries.saes import finder
    from ..render import features as view
    from ..render.documents import session_document
    from .common import run

    r = run(context, weights, text, ablate)
    site, sae, z, active = S.latents_of(r.trace, path, finder(r.model, context.saes))
    present(context, as_json,
            lambda: session_document(r, path, z, site=site, k=sae.k, active=active),
            lambda: view.latents_view(path, r.tokens, z, active))


for _command in sae_app.registered_commands:  # each Example: line on a line of its own
    _command.help = examples_block(_command.callback.__doc__)
