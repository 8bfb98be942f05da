"""The one generation loop over a package's graphs (mindvl.engine.decode_loop): padded to a few batch sizes it
gives exactly the unpadded tokens, sequences joining a running batch get what they get alone, a sequence that
fails its step fails alone, and prefix caching and speculative decoding change no token."""
from dataclasses import replace

import numpy as np
import pytest

from mindvl.deploy.verify import stored_prompts
from mindvl.engine.decode_loop import SHRINK_AFTER, DecodeBatch, generate
from mindvl.engine.package_graphs import DECODE_WIDE, GenerationSpec, PackageGraphs, package_layout
from mindvl.engine.prefix_cache import PrefixCache
from mindvl.engine.sampling import sampling_config
from mindvl.errors import ConfigError
from mindvl.package_reader import as_array, graph_caller, load_graph, read_manifest


def _loaded(package):
    manifest = read_manifest(package)
    spec = GenerationSpec.from_manifest(manifest)
    graphs = {name: load_graph(package, manifest, name) for name in spec.graph_names()}
    return spec, package_layout(package, manifest), graphs, stored_prompts(package, manifest)


def _recorded(run):
    """`run`, and the (graph name, rows) of each call it makes."""
    calls = []

    def recording(name, inputs):
        calls.append((name, len(inputs[0])))
        return run(name, inputs)
    return recording, calls


def test_padded_batch_sizes_give_the_exact_tokens_and_bound_the_shapes(generative_package):
    spec, layout, graphs, prompts = _loaded(generative_package[1])
    run = graph_caller(graphs)
    recording, seen = _recorded(run)
    greedy = sampling_config(max_new_tokens=10, ignore_eos=True)
    exact = [g.tokens for g in generate(layout, PackageGraphs(spec, run), prompts[:3], greedy)]
    batch = DecodeBatch(layout, PackageGraphs(spec, recording), sizes=(1, 2, 4))
    rows = batch.prefill(prompts[:3], [greedy] * 3, owners=[0, 1, 2])
    tokens = [[] for _ in rows]
    while batch.rows:
        for row, delta in batch.sample_or_raise():
            tokens[row.owner].append(delta.token)
        batch.decode()
    assert tokens == exact
    assert {size for _, size in seen} == {4}  # 3 rows run at 4, never at 3


def _step(batch, tokens) -> None:
    """One step of `batch`: every row's next tokens into tokens[its owner], then the decode call."""
    for row, delta in batch.sample_or_raise():
        tokens[row.owner].append(delta.token)
    batch.decode()


def test_a_sequence_joining_a_running_batch_gets_its_tokens_alone(generative_package):
    spec, layout, graphs, prompts = _loaded(generative_package[1])
    run = graph_caller(graphs)
    greedy = sampling_config(max_new_tokens=8, ignore_eos=True)
    alone = [generate(layout, PackageGraphs(spec, run), [p], greedy)[0].tokens for p in prompts[:2]]
    batch = DecodeBatch(layout, PackageGraphs(spec, run), sizes=(1, 2))
    tokens = {0: [], 1: []}
    batch.prefill(prompts[:1], [greedy], owners=[0])
    for step in range(8):
        if step == 3:  # the second joins three steps late, at other cache slots than the first's
            batch.prefill(prompts[1:2], [greedy], owners=[1])
        _step(batch, tokens)
    while batch.rows:
        _step(batch, tokens)
    assert [tokens[0], tokens[1]] == alone


def test_rows_join_into_free_places_and_the_caches_shrink_only_once_the_rows_fit(generative_package):
    """Joining writes a newcomer's cache rows into a free place of the batch's caches and leaving only frees one:
    the caches grow to the next batch size when no place is free, shrink after SHRINK_AFTER steps at a smaller
    size, and every sequence gets the tokens it gets alone."""
    spec, layout, graphs, prompts = _loaded(generative_package[1])
    run = graph_caller(graphs)
    sizes = []

    def recording(name, inputs):
        if name == "decode":
            sizes.append((len(inputs[0]), len(batch.rows)))  # the caches' rows, the running rows
        return run(name, inputs)

    budgets = {"a": 14, "b": 3, "c": 14, "d": 5}
    settings = {name: sampling_config(max_new_tokens=n, ignore_eos=True) for name, n in budgets.items()}
    prompt = dict(zip(budgets, prompts * 4))
    alone = {name: generate(layout, PackageGraphs(spec, run), [prompt[name]], settings[name])[0].tokens
             for name in budgets}
    batch = DecodeBatch(layout, PackageGraphs(spec, recording), sizes=(1, 2, 4))
    tokens = {name: [] for name in budgets}
    placed = {}
    for name in "abc":
        placed[name] = batch.prefill([prompt[name]], [settings[name]], owners=[name])[0].place
    assert list(placed.values()) == [0, 1, 2] and batch.capacity == 4  # 1 -> 2 -> 4 rows
    while any(row.owner == "b" for row in batch.rows):
        _step(batch, tokens)
    assert batch.capacity == 4
    caches = batch.caches  # the last step's outputs
    joined = batch.prefill([prompt["d"]], [settings["d"]], owners=["d"])[0]
    assert joined.place == placed["b"] and batch.capacity == 4  # b's place, in the same arrays
    assert all(np.shares_memory(as_array(new), as_array(old)) for new, old in zip(batch.caches, caches))
    while batch.rows:
        _step(batch, tokens)
    assert tokens == alone
    # a and c alone once d left: the caches shrank to 2 rows at their SHRINK_AFTER-th step
    after_d = sizes[max(i for i, (_, rows) in enumerate(sizes) if rows == 3) + 1:]
    assert after_d == [(4, 2)] * (SHRINK_AFTER - 1) + [(2, 2)] * (len(after_d) - SHRINK_AFTER + 1)
    assert {size for size, _ in sizes} == {4, 2}


def test_steps_of_wide_rows_run_the_wide_graph_and_give_the_same_tokens(generative_package):
    """From spec.wide_rows rows a step runs decode_wide (its products laid out for many rows); the tokens are
    decode's. A server of fewer streams does not load it (graph_names(wide=False))."""
    spec, layout, graphs, prompts = _loaded(generative_package[1])
    assert DECODE_WIDE in spec.graph_names() and DECODE_WIDE not in spec.graph_names(wide=False)
    run = graph_caller(graphs)
    recording, called = _recorded(run)
    greedy = sampling_config(max_new_tokens=6, ignore_eos=True)
    plain = [g.tokens for g in generate(layout, PackageGraphs(spec, run, wide=False), prompts[:3], greedy)]
    wide = [g.tokens for g in generate(layout, PackageGraphs(replace(spec, wide_rows=2), recording), prompts[:3],
                                       greedy)]
    assert wide == plain
    assert {name for name, rows in called if name.startswith("decode")} == {DECODE_WIDE}  # 3 rows >= 2


def test_warming_up_runs_each_decode_step_at_every_batch_size_and_changes_no_token(generative_package):
    """A server compiles its decode steps for every batch size before requests come (PackageGraphs.warm_up):
    each size runs the step it will run (decode, decode_wide from wide_rows, the several-token step), and a
    generation afterwards gives the tokens of a cold one."""
    spec, layout, graphs, prompts = _loaded(generative_package[1])
    run = graph_caller(graphs)
    greedy = sampling_config(max_new_tokens=6, ignore_eos=True)
    cold = [g.tokens for g in generate(layout, PackageGraphs(spec, run), prompts[:3], greedy, sizes=(4,))]
    recording, called = _recorded(run)
    warmed = PackageGraphs(replace(spec, wide_rows=4), recording)
    warmed.warm_up((1, 2, 4))
    extend = f"extend_{spec.extend_steps}"
    assert called == [("decode", 1), (extend, 1), ("decode", 2), (extend, 2), (DECODE_WIDE, 4), (extend, 4)]
    assert [g.tokens for g in generate(layout, warmed, prompts[:3], greedy, sizes=(4,))] == cold


def test_waiting_prompts_prefill_together_within_the_tokens_of_their_bucket(generative_package):
    """DecodeBatch.together: the first prompt, then those after it of its bucket while the padded rows times the
    bucket stay within the tokens; a prompt of another bucket ends the group; with a prefix cache each goes
    alone (to reuse its prefix)."""
    spec, layout, graphs, prompts = _loaded(generative_package[1])
    greedy = [sampling_config(max_new_tokens=4)] * 5
    buckets = [layout.admit([p], 4)[0] for p in prompts]
    short = [p for p, b in zip(prompts, buckets) if b == min(buckets)][:2] * 3
    long = next(p for p, b in zip(prompts, buckets) if b > min(buckets))
    batch = DecodeBatch(layout, PackageGraphs(spec, graph_caller(graphs)), sizes=(1, 2, 4, 8))
    bucket = min(buckets)
    assert batch.together(short[:5], greedy, 2 * bucket) == 2
    assert batch.together(short[:5], greedy, 4 * bucket) == 4
    assert batch.together(short[:3], greedy, 4 * bucket) == 3  # padded to 4 rows: within the tokens
    assert batch.together(short[:5], greedy, 8 * bucket) == 5
    assert batch.together([short[0], long, short[1]], greedy, 8 * bucket) == 1
    assert batch.together([long, short[0]], greedy, bucket) == 1  # the first always
    cached = DecodeBatch(layout, PackageGraphs(spec, graph_caller(graphs)), prefixes=PrefixCache(2 ** 20))
    assert cached.together(short[:4], greedy, 8 * bucket) == 1


def test_a_sequence_whose_step_fails_fails_alone_and_its_neighbours_get_their_tokens(generative_package):
    """A row whose sampling raises (a NaN temperature got past no check here: SamplingConfig built without
    validate) gets the error and leaves the batch; the row beside it generates what it generates alone."""
    spec, layout, graphs, prompts = _loaded(generative_package[1])
    run = graph_caller(graphs)
    greedy = sampling_config(max_new_tokens=8, ignore_eos=True)
    alone = generate(layout, PackageGraphs(spec, run), prompts[1:2], greedy)[0].tokens
    broken = replace(sampling_config(temperature=1.0, max_new_tokens=8), temperature=float("nan"))
    batch = DecodeBatch(layout, PackageGraphs(spec, run), sizes=(1, 2))
    batch.prefill(prompts[:2], [broken, greedy], owners=["broken", "fine"])
    outcomes = {"broken": [], "fine": []}
    while batch.rows:
        for row, outcome in batch.sample():
            outcomes[row.owner].append(outcome)
        batch.decode()
    assert len(outcomes["broken"]) == 1 and isinstance(outcomes["broken"][0], ValueError)
    assert [delta.token for delta in outcomes["fine"]] == alone
    with pytest.raises(ValueError):  # one request's own batch raises its failure
        generate(layout, PackageGraphs(spec, run), prompts[:1], broken)


def _tokens(batch, prompts, settings):
    """Each prompt's tokens, prefilled one after another into `batch` (the server's joining) and decoded
    together."""
    tokens = {i: [] for i in range(len(prompts))}
    for index, (prompt, config) in enumerate(zip(prompts, settings)):
        batch.prefill([prompt], [config], owners=[index])
        _step(batch, tokens)
    while batch.rows:
        _step(batch, tokens)
    return [tokens[i] for i in range(len(prompts))]


def test_prompts_prefilled_from_a_cached_prefix_get_the_uncached_tokens(generative_package):
    """The same image asked again, a longer question after the same start, the same prompt again (all but its
    last token reused), a spoken one (its clip's slots differ): each generates what a whole prefill gives."""
    from mindvl.engine.prefix_cache import PrefixCache

    spec, layout, graphs, prompts = _loaded(generative_package[1])
    run = graph_caller(graphs)
    typed = next(p for p in prompts if p.question and p.mel is None)
    asked = [typed, replace(typed, question=typed.question + " and why"), typed,
             replace(typed, question="what colour is it"), *prompts]
    settings = [sampling_config(max_new_tokens=10, ignore_eos=True)] * len(asked)
    plain = [generate(layout, PackageGraphs(spec, run), [p], s)[0].tokens for p, s in zip(asked, settings)]
    cache = PrefixCache(64 << 20)
    reused = _tokens(DecodeBatch(layout, PackageGraphs(spec, run), sizes=(1, 2, 4, 8), prefixes=cache), asked,
                     settings)
    assert reused == plain
    assert cache.hits >= 3 and cache.reused_tokens > 3 * spec.image_tokens  # the image's slots among them


def test_speculated_drafts_keep_exactly_the_tokens_sampled_without_them(generative_package):
    """Greedy and seeded sampling, one row and several: prompt-lookup drafts verified in the several-token step
    leave every token as it was, and some are accepted (a small model repeats itself)."""
    spec, layout, graphs, prompts = _loaded(generative_package[1])
    run = graph_caller(graphs)
    settings = [sampling_config(max_new_tokens=24, ignore_eos=True),
                sampling_config(max_new_tokens=24, ignore_eos=True, temperature=0.8, seed=3)] * 2
    plain = [generate(layout, PackageGraphs(spec, run), [p], s)[0].tokens for p, s in zip(prompts, settings)]
    alone = DecodeBatch(layout, PackageGraphs(spec, run), sizes=(1,), speculative_tokens=7)
    assert _tokens(alone, prompts[:1], settings[:1]) == plain[:1]
    together = DecodeBatch(layout, PackageGraphs(spec, run), sizes=(1, 2, 4), speculative_tokens=3)
    assert _tokens(together, prompts, settings) == plain
    assert alone.accepted > 0 and together.drafted >= together.accepted > 0


def test_prefix_caching_and_speculation_are_refused_without_the_several_token_step(generative_package):
    spec, layout, graphs, _ = _loaded(generative_package[1])
    old = PackageGraphs(spec, graph_caller(graphs), extend=False)  # as a package exported before the step
    with pytest.raises(ConfigError, match="export it again"):
        DecodeBatch(layout, old, speculative_tokens=2)
    with pytest.raises(ConfigError, match=r"speculative_tokens: expected 1\.\.7"):
        DecodeBatch(layout, PackageGraphs(spec, graph_caller(graphs)), speculative_tokens=8)
