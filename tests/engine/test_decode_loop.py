"""The one generation loop over a package's graphs (mindvl.engine.decode_loop): padded to a few batch sizes it
gives exactly the unpadded tokens, and sequences joining a running batch get what they get alone."""
from mindvl.deploy.verify import stored_prompts
from mindvl.engine.decode_loop import DecodeBatch, generate
from mindvl.engine.package_graphs import GenerationSpec, PackageGraphs, package_layout
from mindvl.engine.sampling import sampling_config
from mindvl.package_reader import graph_caller, load_graph, read_manifest


def _loaded(package):
    manifest = read_manifest(package)
    spec = GenerationSpec.from_manifest(manifest)
    graphs = {name: load_graph(package, manifest, name) for name in spec.graph_names()}
    return spec, package_layout(package, manifest), graphs, stored_prompts(package, manifest)


def test_padded_batch_sizes_give_the_exact_tokens_and_bound_the_shapes(generative_package):
    spec, layout, graphs, prompts = _loaded(generative_package[1])
    run = graph_caller(graphs)
    seen = []

    def recording(name, inputs):
        seen.append((name, len(inputs[0])))
        return run(name, inputs)

    greedy = sampling_config(max_new_tokens=10, ignore_eos=True)
    exact = [g.tokens for g in generate(layout, PackageGraphs(spec, run), prompts[:3], greedy)]
    batch = DecodeBatch(layout, PackageGraphs(spec, recording), sizes=(1, 2, 4))
    rows = batch.prefill(prompts[:3], [greedy] * 3, owners=[0, 1, 2])
    tokens = [[] for _ in rows]
    while batch.rows:
        for row, delta in batch.sample():
            tokens[row.owner].append(delta.token)
        batch.decode()
    assert tokens == exact
    assert {size for _, size in seen} == {4}  # 3 rows run at 4, never at 3


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
        for row, delta in batch.sample():
            tokens[row.owner].append(delta.token)
        batch.decode()
    while batch.rows:
        for row, delta in batch.sample():
            tokens[row.owner].append(delta.token)
        batch.decode()
    assert [tokens[0], tokens[1]] == alone
