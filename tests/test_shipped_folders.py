"""Folders laid out as the hub ships Gemma 3 270M(-it) and SmolLM2-135M(-Instruct)
(shipped_folders.py: every key of their configs, the tokenizer's structure, bfloat16
weights), run as a user runs them, against transformers on the same folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import assert_one_error_line, example
from shipped_tokenizers import HARD

from tinygpt_cli.transformer.folder import load_model
from tinygpt_cli.transformer.model import forward

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = ["Once upon a time, Lily wanted to play with her ball.", "Tom's dog ran 1234 metres."]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    from shipped_folders import gemma3_folder

    root = tmp_path_factory.mktemp("gemma3")
    return {"jinja": gemma3_folder(root / "jinja"),
            "inside": gemma3_folder(root / "inside", template_inside=True)}


def test_gemma3s_tokenizer_past_the_models_rows_is_read_as_transformers_reads_it(gemma3):
    """The real tokenizer has <image_soft_token> at id 262,144 on a model of 262,144 rows:
    the folder was refused ("does not belong to these weights")."""
    hf = transformers.AutoTokenizer.from_pretrained(str(gemma3["jinja"]))
    model = load_model(gemma3["jinja"])
    tok = model.tokenizer
    assert tok.vocab_size == model.config.vocab_size + 1 and tok.n_rows == model.config.vocab_size
    for text in HARD:
        assert tok.text_ids(text) == hf(text)["input_ids"], text
    assert tok.stop_ids == (1, 106)  # generation_config.json's [1, 106]: <eos>, <end_of_turn>


def test_a_text_naming_a_token_past_the_rows_is_refused_in_one_line(gemma3, cli):
    r = cli("encode", "a <image_soft_token> b", "--weights", gemma3["jinja"])
    assert_one_error_line(r, 2, "'<image_soft_token>'", "no row for")
    r = cli("probs", "a <start_of_image> b", "--json", "--weights", gemma3["jinja"])
    assert r.code == 0, r.err  # a special token with a row is read


def test_gemma3s_logits_equal_transformers_on_the_shipped_folder(gemma3):
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(gemma3["jinja"]))
    hf = transformers.AutoModelForCausalLM.from_pretrained(gemma3["jinja"],
                                                           dtype=torch.float32).eval()
    model = load_model(gemma3["jinja"])
    for text in TEXTS:
        ids = hf_tok(text)["input_ids"]
        assert ids == model.tokenizer.text_ids(text) and ids[0] == 2
        with torch.no_grad():
            want = hf(torch.tensor([ids])).logits[0].numpy().astype(np.float64)
        got = forward(model.params, model.config, np.array(ids))
        assert np.abs(got - want).max() / np.abs(want).max() <= 1e-5, text


@pytest.mark.parametrize("where", ["jinja", "inside"])
def test_gemma3s_chat_is_apply_chat_templates_byte_for_byte(gemma3, where, cli):
    pytest.importorskip("jinja2")
    hf = transformers.AutoTokenizer.from_pretrained(str(gemma3[where]))
    for message in ["What is the capital of France?", "  spaces around  ", "Café 🙂\n"]:
        turn = [{"role": "user", "content": message}]
        text = hf.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
        ids = hf.apply_chat_template(turn, tokenize=True, add_generation_prompt=True,
                                     return_dict=False)
        r = cli("encode", "--chat", message, "--json", "--weights", gemma3[where])
        assert r.code == 0, r.err
        doc = json.loads(r.out)
        assert doc["ids"] == list(ids) and "".join(doc["tokens"]) == text, message


def test_target_naming_a_token_past_the_rows_is_refused_in_one_line(gemma3, cli):
    rows = load_model(gemma3["jinja"]).config.vocab_size
    for target, said in (("<image_soft_token>", "no row for"),
                         (f"#{rows}", f"ids run from 0 to {rows - 1}")):
        r = cli("dla", "Once upon a", "--target", target, "--weights", gemma3["jinja"])
        assert_one_error_line(r, 2, said)  # was an IndexError (exit 1)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from shipped_folders import smollm2_folder

    root = tmp_path_factory.mktemp("smollm2")
    return {"instruct": smollm2_folder(root / "instruct"),
            "base": smollm2_folder(root / "base", instruct=False)}


@pytest.mark.parametrize("kind", ["instruct", "base"])
def test_smollm2_as_shipped_reads_as_transformers_reads_it(smollm2, kind):
    folder = smollm2[kind]
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model = load_model(folder)
    assert model.tokenizer.affix == ([], [])  # no BOS: none put before a text
    assert model.tokenizer.stop_ids == ((2,) if kind == "instruct" else (0,))
    for text in HARD:
        assert model.tokenizer.text_ids(text) == hf_tok(text)["input_ids"], text
    ids = hf_tok(TEXTS[0])["input_ids"]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy().astype(np.float64)
    got = forward(model.params, model.config, np.array(ids))
    assert np.abs(got - want).max() / np.abs(want).max() <= 1e-5


def test_smollm2_instructs_chat_is_apply_chat_templates(smollm2, cli):
    pytest.importorskip("jinja2")
    hf = transformers.AutoTokenizer.from_pretrained(str(smollm2["instruct"]))
    turn = [{"role": "user", "content": "What is the capital of France?"}]
    ids = hf.apply_chat_template(turn, tokenize=True, add_generation_prompt=True,
                                 return_dict=False)
    r = cli("encode", "--chat", turn[0]["content"], "--json", "--weights", smollm2["instruct"])
    assert r.code == 0, r.err
    assert json.loads(r.out)["ids"] == list(ids)
    r = cli("generate", "--chat", "Hi", "--weights", smollm2["base"])
    assert_one_error_line(r, 2, "--chat needs the model's chat template")


@pytest.fixture(scope="module")
def gemma3_gguf(gemma3, tmp_path_factory):
    """The jinja folder as llama.cpp's converter writes it, alone in a folder (no
    tokenizer_config.json or chat template beside it: everything is in the file)."""
    pytest.importorskip("gguf")
    from shipped_folders import gemma3_gguf as written

    return written(gemma3["jinja"], tmp_path_factory.mktemp("gguf") / "gemma-3-270m-it-F32.gguf")


def test_a_gemma3_gguf_ends_at_end_of_turn_as_llama_cpp_does(gemma3, gemma3_gguf):
    """llama.cpp's converter writes no eot id for Gemma 3; llama.cpp ends generation at
    <end_of_turn> by its text (and at the eos id). The file's generation stopped at <eos>
    alone, running on past the end of the model's turn."""
    tok = load_model(gemma3_gguf).tokenizer
    assert [tok.token_str(i) for i in tok.stop_ids] == ["<eos>", "<end_of_turn>"]
    assert tok.stop_ids == load_model(gemma3["jinja"]).tokenizer.stop_ids == (1, 106)
    for text in HARD:
        assert tok.text_ids(text) == load_model(gemma3["jinja"]).tokenizer.text_ids(text)


def test_chat_on_a_gemma3_gguf_renders_the_files_own_template(gemma3, gemma3_gguf, cli):
    """tokenizer.chat_template, with the file's <bos>: the same ids as transformers'
    apply_chat_template on the folder it was made from (was: refused, 'has no template')."""
    pytest.importorskip("jinja2")
    hf = transformers.AutoTokenizer.from_pretrained(str(gemma3["jinja"]))
    turn = [{"role": "user", "content": "What is the capital of France?"}]
    ids = hf.apply_chat_template(turn, tokenize=True, add_generation_prompt=True,
                                 return_dict=False)
    r = cli("encode", "--chat", turn[0]["content"], "--json", "--weights", gemma3_gguf)
    assert r.code == 0, r.err
    assert json.loads(r.out)["ids"] == list(ids)
    r = cli("generate", "--chat", "Hi", "-n", "3", "-t", "0", "--json", "--weights", gemma3_gguf)
    assert r.code == 0, r.err


def test_info_names_where_generation_ends_and_a_few_of_many_specials(gemma3, cli):
    """The real tokenizer names 6,400 special tokens: info printed every one (1,600 lines
    at 80 columns); it shows 12, says how many, and the ids generation ends at."""
    r = cli("info", "--weights", gemma3["jinja"])
    assert r.code == 0, r.err
    assert "generation ends at <eos> = 1, <end_of_turn> = 106" in r.out
    assert "<unused5> = 11 (the first 12 of 110; --json lists them all)" in " ".join(
        r.out.split())
    assert "<unused6>" not in r.out
    doc = json.loads(cli("info", "--json", "--weights", gemma3["jinja"]).out)
    assert doc["tokenizer"]["stop_ids"] == [1, 106]
    assert len(doc["tokenizer"]["special_tokens"]) == 110


def test_a_smollm2_gguf_ends_where_llama_cpp_does_and_chats_as_the_folder(smollm2, cli,
                                                                           tmp_path):
    """examples/make_gguf.py as the converter writes SmolLM2 (pre-tokenizer smollm, the
    folder's chat template): llama.cpp ends generation at its eos <|im_end|>, at
    <|endoftext|> by its text, and at <reponame>, which it takes for StarCoder's fill-in-
    the-middle repo token (llama-cpp-python on such a file: EOG ids [0, 2, 4])."""
    pytest.importorskip("gguf")
    pytest.importorskip("jinja2")

    make_gguf = example("make_gguf")
    out = tmp_path / "smollm2-F32.gguf"
    make_gguf.write(smollm2["instruct"], out, "F32", "smollm")
    tok = load_model(out).tokenizer
    assert sorted(tok.token_str(i) for i in tok.stop_ids) == ["<reponame>", "<|endoftext|>",
                                                             "<|im_end|>"]
    assert tok.stop_ids[0] == 2  # the file's eos first
    for text in HARD:
        assert tok.text_ids(text) == load_model(smollm2["instruct"]).tokenizer.text_ids(text)
    hf = transformers.AutoTokenizer.from_pretrained(str(smollm2["instruct"]))
    ids = hf.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True,
                                 add_generation_prompt=True, return_dict=False)
    r = cli("encode", "--chat", "Hi", "--json", "--weights", out)
    assert r.code == 0, r.err
    assert json.loads(r.out)["ids"] == list(ids)


def test_each_line_blames_the_line_naming_a_token_past_the_rows_alone(gemma3, cli, tmp_path):
    """--each-line tokenises its lines together: a line with <image_soft_token> crashed the
    whole batch with an IndexError (exit 1)."""
    lines = tmp_path / "lines.txt"
    lines.write_text("Once upon a time\nLily <image_soft_token> ran\nTom ran to the ball\n",
                     encoding="utf-8")
    r = cli("probs", "--each-line", lines, "--json", "--weights", gemma3["jinja"])
    assert r.code == 2
    assert [json.loads(x)["line"] for x in r.out.splitlines()] == [1, 3]
    assert r.err.count("error:") == 1 and "error: line 2:" in r.err and "no row for" in r.err


def test_generate_stops_at_end_of_turn_where_transformers_generate_stops(gemma3, cli,
                                                                          tmp_path):
    """The folder's <end_of_turn> row turned towards the last position's final stream, so
    greedy generation's first token is 106 (generation_config.json's second eos): tinygpt
    stops there and says so, as transformers' generate (reading the same file) stops."""
    import shutil

    folder = tmp_path / "ends"
    shutil.copytree(gemma3["jinja"], folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = load_model(folder).tokenizer.text_ids("Once upon a time")
    assert 106 not in ids  # its row is read by the head alone
    with torch.no_grad():
        x = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0, -1]
        table = hf.model.embed_tokens.weight
        table[106] = 60 * x / (x @ x)  # its logit 60, the others' about 1
        hf.to(torch.bfloat16).save_pretrained(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=5,
                      attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    assert out[0, len(ids):].tolist() == [106]
    r = cli("generate", "Once upon a time", "-t", "0", "-n", "5", "--json", "--weights", folder)
    *_, last = r.ndjson()
    assert last["stop"] == "endoftext" and last["stop_token"] == "<end_of_turn>"
    r = cli("generate", "Once upon a time", "-t", "0", "-n", "5", "--weights", folder)
    assert "stopped at <end_of_turn>" in r.err
    r = cli("generate", "Once upon a time", "-t", "0", "-n", "3", "--no-stop", "--json",
            "--weights", folder)
    assert r.ndjson()[1]["id"] == 106 and r.ndjson()[-1]["stop"] == "max_new_tokens"
