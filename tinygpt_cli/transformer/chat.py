"""A chat model's prompt: one user message in the folder's chat template, rendered as
transformers' apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
renders it, so that the text ends with the opening of the assistant's turn.

The template is the folder's chat_template.jinja, else tokenizer_config.json's chat_template
(a string, or a list of named templates whose "default" is taken), as transformers reads
them; a GGUF file's is its tokenizer.chat_template, with the bos and eos tokens its ids
name, as llama.cpp reads it. It runs in jinja2's ImmutableSandboxedEnvironment (a template
is code from the hub) with transformers' settings: trim_blocks and lstrip_blocks, the loop
controls, a `tojson` that keeps non-ASCII characters, and the globals templates call
(raise_exception, strftime_now, dict, namespace); the tokenizer's named special tokens
(bos_token, eos_token, ...) are variables. jinja2 is the optional extra `chat`.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from ..errors import InputError, WeightsError, check_utf8
from .folder import open_folder, read_side_json
from .gguf_vocab import chat_settings
from .tokenizer import special_name

INSTALL = 'pip install "tinygpt-cli[chat]"'
TEMPLATE_FILE = "chat_template.jinja"
MAX_TEMPLATE_BYTES = 1 << 20  # the longest hub templates (tool use, reasoning) are ~20 kB
# the special tokens transformers hands every template, by these names
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token")


def prompt(weights, message: str, opened: dict | None = None) -> str:
    """The text --chat MESSAGE stands for: the message in the chat template of the weights
    folder (as --weights names it; None: $TINYGPT_WEIGHTS, then the shipped model)."""

    message = check_utf8(message, "the --chat message")
    if not message:
        raise InputError("the --chat message is empty: give the user's message")
    opened_folder = open_folder(weights, opened)
    if opened_folder.file is not None:  # a GGUF holds its own template (llama.cpp's reading)
        template, specials = chat_settings(opened_folder.gguf[0].meta)
        if template is None:
            raise InputError(f"--chat needs the model's chat template, and "
                             f"{opened_folder.file} has none (no tokenizer.chat_template): "
                             "give the text itself instead")
        return render(template, message, specials)
    root = opened_folder.folder
    settings = read_side_json(root / "tokenizer_config.json")
    template = chat_template(root, settings)
    return render(template, message,
                  special_tokens(settings, read_side_json(root / "special_tokens_map.json")))


def chat_template(folder: Path, settings: dict | None) -> str:
    """The folder's chat template; InputError when it has none (the model is not a chat
    model, or its files lack one)."""
    path = folder / TEMPLATE_FILE
    if path.exists() or path.is_symlink():
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_TEMPLATE_BYTES + 1)
            if len(raw) > MAX_TEMPLATE_BYTES:
                raise WeightsError(f"{path} is larger than {MAX_TEMPLATE_BYTES:,} bytes")
            return raw.decode("utf-8")
        except OSError as e:
            raise WeightsError(f"cannot read {path}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise WeightsError(f"{path} is not UTF-8 text") from None
    found = (settings or {}).get("chat_template")
    if isinstance(found, list):  # named templates: transformers takes "default"
        found = next((t.get("template") for t in found
                      if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(found, str) or not found:
        raise InputError(f"--chat needs the model's chat template, and {folder} has none (no "
                         f"{TEMPLATE_FILE}, no chat_template in tokenizer_config.json): "
                         "give the text itself instead")
    return found


def special_tokens(settings: dict | None, names_map: dict | None) -> dict[str, str]:
    """The named special tokens as the template sees them: tokenizer_config.json's, then
    special_tokens_map.json's for the names it leaves out; each a string or an AddedToken's
    {"content": ...}."""

    out = {}
    for name in SPECIAL_NAMES:
        for source in (settings or {}, names_map or {}):
            value = special_name(source.get(name))
            if value is not None:
                out[name] = value
                break
    return out


def render(template: str, message: str, specials: dict[str, str]) -> str:
    """The template applied to one user message, with the assistant's turn opened."""
    try:
        import jinja2  # noqa: F401 - the extra's presence
    except ImportError:
        raise InputError(f"--chat renders the model's chat template with jinja2, which is not "
                         f"installed: {INSTALL}") from None
    import jinja2.exceptions as failed

    try:
        compiled = _environment().from_string(template)
    except failed.TemplateSyntaxError as e:
        raise WeightsError(f"the model's chat template is not a jinja2 template ({e.message}, "
                           f"line {e.lineno})") from None
    try:
        return compiled.render(messages=[{"role": "user", "content": message}], tools=None,
                               documents=None, add_generation_prompt=True, **specials)
    except failed.SecurityError as e:
        raise WeightsError(f"the model's chat template did something the sandbox forbids "
                           f"({e})") from None
    except failed.TemplateError as e:  # raise_exception: the template's own refusal
        raise InputError(f"the model's chat template refused the message: {e}") from None


def _environment():
    """transformers' environment for chat templates (utils/chat_template_utils.py): the
    same settings, filters and globals, written here."""

    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """{% generation %}...{% endgeneration %} marks the assistant's part for training
        masks; rendering keeps its body as it is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body) \
                .set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja2's own escapes HTML characters; templates expect plain JSON
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):  # noqa: A002 - the name templates pass it by
        return datetime.now().strftime(format)

    class TemplateDict:  # dict() and dict.fromkeys, without the type itself
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class Namespace(jinja2.utils.Namespace):
        """A namespace that refuses names starting with _ (no way to CPython's internals)."""

        def __init__(*args, **kwargs):  # noqa: N805 - jinja2's own signature trick
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a namespace attribute may not start with _: {name!r}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                       dict=TemplateDict(), namespace=Namespace)
    return env
