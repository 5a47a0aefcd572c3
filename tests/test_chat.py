"""--chat MESSAGE: the message in the folder's chat template, rendered as transformers'
apply_chat_template(tokenize=False, add_generation_prompt=True) renders it, byte for byte
(SmolLM2's ChatML template from chat_template.jinja, Gemma's from tokenizer_config.json), and
the ids the model is fed equal apply_chat_template's (special tokens whole, one <bos>)."""

from __future__ import annotations

import json
import sys

import pytest
from cli_helpers import assert_one_error_line
from shipped_tokenizers import GEMMA_TEMPLATE, SMOLLM2_TEMPLATE, model_folder, tokenizer_files

MESSAGES = ["What is the capital of France?", "  spaces around  ", "two\nlines\n\n",
            "Café 🙂 東京", "a <|im_end|> and <end_of_turn> inside", "{{ not jinja }} {% x %}"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    tokenizer_json, settings = tokenizer_files("smollm2")
    smol = model_folder(root / "smollm2", tokenizer_json, settings)
    (smol / "chat_template.jinja").write_text(SMOLLM2_TEMPLATE, encoding="utf-8")
    tokenizer_json, settings = tokenizer_files("gemma")
    gemma = model_folder(root / "gemma", tokenizer_json,
                         {**settings, "chat_template": GEMMA_TEMPLATE})
    plain = model_folder(root / "plain", *tokenizer_files("llama2"))
    return {"smollm2": smol, "gemma": gemma, "plain": plain}


@pytest.mark.parametrize("kind", ["smollm2", "gemma"])
def test_the_template_renders_as_transformers_renders_it(folders, kind):
    pytest.importorskip("jinja2")
    transformers = pytest.importorskip("transformers")
    from tinygpt_cli.transformer.chat import prompt

    hf = transformers.AutoTokenizer.from_pretrained(str(folders[kind]))
    for message in MESSAGES:
        theirs = hf.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                        add_generation_prompt=True)
        assert prompt(folders[kind], message) == theirs, (kind, message)


@pytest.mark.parametrize("kind", ["smollm2", "gemma"])
def test_the_ids_chat_feeds_the_model_are_apply_chat_templates(folders, kind, cli):
    pytest.importorskip("jinja2")
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(folders[kind]))
    for message in MESSAGES[:4]:
        r = cli("encode", "--chat", message, "--json", "--weights", folders[kind])
        assert r.code == 0, r.err
        ids = json.loads(r.out)["ids"]
        theirs = hf.apply_chat_template([{"role": "user", "content": message}],
                                        add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
        assert ids == list(theirs), (kind, message)
    tokens = json.loads(r.out)["tokens"]
    if kind == "gemma":  # the template writes <bos>; it is not added again
        assert tokens[:2] == ["<bos>", "<start_of_turn>"] and tokens.count("<bos>") == 1
        last = len(tokens) - 1 - tokens[::-1].index("<start_of_turn>")
        assert "".join(tokens[last + 1:]) == "model\n"  # the assistant's turn, opened
    else:  # the turn markers are one token each, never split
        assert tokens[0] == "<|im_start|>" and tokens.count("<|im_end|>") == 2


def test_every_command_that_reads_a_text_takes_chat(folders, cli):
    pytest.importorskip("jinja2")
    from tinygpt_cli.transformer.chat import prompt

    text = prompt(folders["gemma"], "Hi")
    for argv in (["probs", "--json"], ["attn", "--json"], ["trace", "logits", "--json"]):
        chat = cli(*argv[:1], "--chat", "Hi", *argv[1:], "--weights", folders["gemma"])
        assert chat.code == 0, chat.err
        doc = json.loads(chat.out)
        assert doc["tokens"][0] == "<bos>" and doc["tokens"].count("<bos>") == 1, argv
        # the same as the rendered text given as it is, bar the <bos> the folder adds to one
        plain = json.loads(cli(argv[0], text, *argv[1:], "--weights", folders["gemma"]).out)
        assert plain["ids"] == [2, *doc["ids"]], argv


def test_chat_is_refused_in_one_line_without_a_template_or_a_message(folders, cli):
    pytest.importorskip("jinja2")
    r = cli("generate", "--chat", "Hi", "--weights", folders["plain"])
    assert_one_error_line(r, 2, "--chat needs the model's chat template", "has none")
    r = cli("generate", "Hello", "--chat", "Hi", "--weights", folders["gemma"])
    assert_one_error_line(r, 2, "give the text once")
    r = cli("decode", "--chat", "Hi", "--weights", folders["gemma"])
    assert_one_error_line(r, 2, "decode does not read one")
    r = cli("generate", "--chat", "--weights", folders["gemma"])
    assert_one_error_line(r, 2, "--chat needs the user's message, not --weights")


def test_without_jinja2_chat_names_the_extra(folders, cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "jinja2", None)  # import jinja2 fails
    r = cli("generate", "--chat", "Hi", "--weights", folders["gemma"])
    assert_one_error_line(r, 2, "jinja2", 'pip install "tinygpt-cli[chat]"')


@pytest.mark.parametrize(("template", "code", "needle"), [
    ('{{ raise_exception("only user turns") }}', 2, "refused the message: only user turns"),
    ("{{ ''.__class__.__mro__ }}", 1, "the sandbox forbids"),
    ("{% for m in messages %}", 1, "not a jinja2 template"),
])
def test_a_template_that_refuses_escapes_or_breaks_is_one_line(folders, cli, tmp_path,
                                                                template, code, needle):
    pytest.importorskip("jinja2")
    folder = model_folder(tmp_path / "f", *tokenizer_files("smollm2"))
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    r = cli("encode", "--chat", "Hi", "--weights", folder)
    assert_one_error_line(r, code, needle)


def test_the_python_api_takes_chat_as_the_command_line_does(folders, cli):
    pytest.importorskip("jinja2")
    import tinygpt_cli as tg

    r = cli("encode", "--chat", "Hi", "--json", "--weights", folders["gemma"])
    assert tg.load(folders["gemma"]).encode(chat="Hi")["ids"] == json.loads(r.out)["ids"]


def test_last_keeps_the_folders_bos_and_cuts_the_texts_own_tokens(folders, cli):
    from tokenizers import Tokenizer as HFTokenizer

    text = "Lily wanted to play with her ball in the park today"
    own = HFTokenizer.from_file(str(folders["gemma"] / "tokenizer.json")).encode(
        text, add_special_tokens=False).ids
    r = cli("probs", text, "--last", 4, "--json", "--weights", folders["gemma"])
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["ids"] == [2, *own[-3:]]  # <bos> first, counted among the 4
    assert doc["cut"] == {"last": 4, "dropped": len(own) - 3}
    r = cli("probs", text, "--last", 1, "--weights", folders["gemma"])
    assert_one_error_line(r, 2, "--last 1", "<bos>", "at least 2")


def test_last_does_not_cut_a_chat_text(folders, cli):
    pytest.importorskip("jinja2")
    r = cli("probs", "--chat", "Hi", "--last", 4, "--weights", folders["gemma"])
    assert_one_error_line(r, 2, "--last cannot cut a --chat text")


def test_diff_refuses_two_folders_that_put_different_tokens_around_a_text(folders, cli,
                                                                           tmp_path):
    tokenizer_json, settings = tokenizer_files("gemma")
    bare = json.loads(tokenizer_json)
    bare["post_processor"] = None  # the same vocabulary, no <bos> put before a text
    other = model_folder(tmp_path / "bare", json.dumps(bare), settings)
    r = cli("diff", "Hello there", "--weights", folders["gemma"], "--weights-b", other)
    assert_one_error_line(r, 2, "tokens put around a text")


def test_chat_reads_the_folder_once(folders, cli, monkeypatch):
    """The template's folder and the command's are one: its tokenizer.json was read twice
    (0.7 s each for Gemma 3's 33 MB file)."""
    pytest.importorskip("jinja2")
    from tinygpt_cli.transformer.tokenizer import Tokenizer

    reads = []
    parse = Tokenizer.from_bytes.__func__
    monkeypatch.setattr(Tokenizer, "from_bytes",
                        classmethod(lambda cls, raw: reads.append(1) or parse(cls, raw)))
    r = cli("probs", "--chat", "Hi", "--json", "--weights", folders["gemma"])
    assert r.code == 0, r.err
    assert len(reads) == 1
