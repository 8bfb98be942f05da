"""Generation on a tiny converted decoder: one decode graph for every step, a batch of prompts of
different lengths gives each prompt's own tokens, sampling is reproducible, stops and streaming."""
import pytest

from mindvl.cli import main
from mindvl.errors import ConfigError
from mindvl import from_pretrained

PROMPTS = ["the cat", "a red circle and a blue square are drawn on a white page", "is there a green triangle"]


@pytest.fixture(scope="module")
def model(tiny_llms):
    return from_pretrained(tiny_llms["gemma3_text"], cache_len=64)  # grouped queries, sliding window, sandwich


def test_one_decode_graph_for_every_step(tiny_llms):
    model = from_pretrained(tiny_llms["llama"], cache_len=64)
    first = model.generate(PROMPTS[0], max_new_tokens=20, stop_tokens=[])
    second = model.generate(PROMPTS[2], max_new_tokens=9)
    assert len(first.tokens) + len(second.tokens) > 20
    assert len(model.decode_graph.compile_cache) == 1  # graphs MindSpore compiled for the decode cell
    assert len(model.prefill_graph.compile_cache) == 1  # both prompts fit the 16-token bucket


def test_batch_gives_each_prompt_its_own_tokens(model):
    alone = [model.generate(p, max_new_tokens=10) for p in PROMPTS]
    together = model.generate(PROMPTS, max_new_tokens=10)
    assert [g.tokens for g in together] == [g.tokens for g in alone]
    assert [g.text for g in together] == [g.text for g in alone]
    assert [g.prompt_tokens for g in together] == [len(model.encode(p)) for p in PROMPTS]


def test_sampling_is_reproducible_with_a_seed(model):
    settings = dict(max_new_tokens=12, temperature=1.5, top_k=50, top_p=0.95, seed=7)
    first = model.generate(PROMPTS, **settings)
    again = model.generate(PROMPTS, **settings)
    other = model.generate(PROMPTS, **{**settings, "seed": 8})
    assert [g.tokens for g in first] == [g.tokens for g in again]
    assert [g.tokens for g in first] != [g.tokens for g in other]
    greedy = model.generate(PROMPTS[1], max_new_tokens=12)
    assert model.generate(PROMPTS[1], max_new_tokens=12, temperature=0.7, top_k=1, seed=3).tokens == greedy.tokens


def test_stop_tokens_strings_and_length(model):
    greedy = model.generate(PROMPTS[1], max_new_tokens=12)
    assert greedy.finish == "length" and len(greedy.tokens) == 12
    stop = greedy.tokens[4]
    stopped = model.generate(PROMPTS[1], max_new_tokens=12, stop_tokens=[stop])
    assert stopped.finish == "stop" and stopped.tokens == greedy.tokens[:greedy.tokens.index(stop) + 1]
    assert stopped.text == model.decode_text(stopped.tokens[:-1])  # the stop token is not in the text
    text = greedy.text
    needle = text[len(text) // 2:len(text) // 2 + 2]
    cut = model.generate(PROMPTS[1], max_new_tokens=12, stop_strings=[needle])
    assert cut.finish == "stop" and cut.text == text[:text.index(needle)]


def test_stream_yields_the_answer_as_it_is_made(model):
    whole = model.generate(PROMPTS, max_new_tokens=8)
    deltas = list(model.stream(PROMPTS, max_new_tokens=8))
    for index, generation in enumerate(whole):
        mine = [d for d in deltas if d.index == index]
        assert [d.token for d in mine] == generation.tokens
        assert "".join(d.text for d in mine) == generation.text
        assert [d.finish for d in mine][-1] == generation.finish and not any(d.finish for d in mine[:-1])


def test_repetition_penalty_changes_a_repetitive_answer(tiny_llms):
    model = from_pretrained(tiny_llms["qwen2"], cache_len=64)  # its greedy answer repeats one token
    plain = model.generate("the cat sat on the mat", max_new_tokens=10)
    penalised = model.generate("the cat sat on the mat", max_new_tokens=10, repetition_penalty=3.0)
    assert len(set(penalised.tokens)) > len(set(plain.tokens))


def test_bad_settings_and_prompts_are_refused(model):
    with pytest.raises(ConfigError, match="top_p: expected a value in"):
        model.generate("x", top_p=0)
    with pytest.raises(ConfigError, match=r"unknown \['top_q'\]"):
        model.generate("x", top_q=1)
    with pytest.raises(ConfigError, match="exceed the cache of 64 tokens; lower max_new_tokens"):
        model.generate(PROMPTS[1], max_new_tokens=60)
    with pytest.raises(ConfigError, match="longer than the largest bucket"):
        model.generate("the cat " * 40, max_new_tokens=1)
    with pytest.raises(ConfigError, match="stop_strings: an empty string"):
        model.generate("x", stop_strings=[""])
    with pytest.raises(ConfigError, match=r"temperature: expected a value in \[0, 2\] \(0: greedy\), got nan"):  # every door validates alike
        model.generate("x", temperature=float("nan"))
    with pytest.raises(ConfigError, match="max_new_tokens: expected an integer, got 1.5"):
        model.generate("x", max_new_tokens=1.5)
    with pytest.raises(ConfigError, match="prompt: 4,000 characters; a prompt of this model holds at most"):
        model.generate("x" * 4000, max_new_tokens=1)


def test_cli_prints_the_answer(tiny_llms, capsys):
    assert main(["generate", "--model", str(tiny_llms["llama"]), "the cat", "--max-new-tokens", "5"]) == 0
    out, err = capsys.readouterr()
    expected = from_pretrained(tiny_llms["llama"], cache_len=64).generate("the cat", max_new_tokens=5)
    assert out == "the cat" + expected.text + "\n" and f"[{expected.finish}]" in err


def test_mindvl_from_pretrained_opens_an_llm_folder(tiny_llms):
    import mindvl
    from mindvl.generation import LanguageModel

    model = mindvl.from_pretrained(tiny_llms["qwen2"], cache_len=48)
    assert isinstance(model, LanguageModel) and model.cache_len == 48


def test_the_fused_kernels_give_the_standard_tokens(model, tiny_llms):
    from mindvl.cells.kernels import fused_cells, library
    if library() is None:
        pytest.skip("no C++ compiler here: generation keeps the standard operators")
    fused = [type(c).__name__ for _, c in model.lm.cells_and_names() if isinstance(c, fused_cells())]
    # a decode step's block as one kernel; the prefill's block products stay MindSpore's
    assert set(fused) == {"FusedRMSNorm", "FusedRotateHalf", "FusedHeadMatMul", "FusedDecodeStep"}
    standard = from_pretrained(tiny_llms["gemma3_text"], cache_len=64, kernels="standard")
    assert not any(isinstance(c, fused_cells()) for _, c in standard.lm.cells_and_names())
    for prompt in PROMPTS:
        want = standard.generate(prompt, max_new_tokens=12)
        got = model.generate(prompt, max_new_tokens=12)
        assert got.tokens == want.tokens
    auto = from_pretrained(tiny_llms["gemma3_text"], cache_len=64, kernels="auto")  # the default: fused here
    assert {type(c).__name__ for _, c in auto.lm.cells_and_names() if isinstance(c, fused_cells())} == set(fused)
    with pytest.raises(ConfigError, match=r"kernels: expected one of \['auto', 'standard', 'fused'\], got 'fast'"):
        from_pretrained(tiny_llms["llama"], cache_len=64, kernels="fast")


def test_token_ids_generate_as_their_text_does(model):
    """As transformers users pass them: one list (or 1-D array) of ids is one prompt, a list of them a batch."""
    import numpy as np

    text = model.generate(PROMPTS[0], max_new_tokens=6)
    ids = model.encode(PROMPTS[0])
    assert model.generate(ids, max_new_tokens=6).tokens == text.tokens
    assert model.generate(np.asarray(ids), max_new_tokens=6).tokens == text.tokens
    both = model.generate([ids, model.encode(PROMPTS[2])], max_new_tokens=6)
    assert [g.tokens for g in both] == [g.tokens for g in model.generate([PROMPTS[0], PROMPTS[2]], max_new_tokens=6)]
    with pytest.raises(ConfigError, match=r"token ids must lie in \[0, "):
        model.generate([5, 10 ** 9])
    with pytest.raises(ConfigError, match="a prompt is text or a sequence of token ids"):
        model.generate([[1.5, 2.0]])
