"""The batched engine's parts: a rule's batched path against its per-client one, the models as
batched products, padded minibatches, the results folder. No network here."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfedrw.engines.steps import rule_groups, train_together
from dfedrw.engines.together import run_together
from dfedrw.engines.run import BatchedRun, engine_device
from dfedrw.peer.learning.model_matrix import FlatModel, ManyEvaluator, VectorEvaluator, _layer_plan
from dfedrw.peer.aggregation import DFedAvg, DFedReweighting, Flame, RoundBatch
from dfedrw.peer.aggregation.qfdfl import QFDFL
from dfedrw.peer.aggregation.crs import make_crs
from dfedrw.peer.aggregation.tpm import make_tpm
from dfedrw.peer.learning.data import Dataset
from dfedrw.peer.learning.models import build_model
from dfedrw.peer.results.records import read_rounds


def _batch(vectors, rows, sizes):
    ids = tuple(tuple(range(len(r))) for r in rows)
    return RoundBatch(round=0, vectors=vectors, rows=rows, ids=ids, num_samples=sizes)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    clients=st.integers(1, 6),
    pool=st.integers(1, 9),
    weighting=st.sampled_from(["data_size", "uniform"]),
)
def test_dfedavg_batched_gives_each_client_what_its_own_call_gives(data, clients, pool, weighting):
    """Any pool (a NaN row among them, sizes of 0 included), any candidate rows per client."""
    vectors = torch.randn(pool, 5, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 10**6))))
    if data.draw(st.booleans()):
        vectors[data.draw(st.integers(0, pool - 1))] = float("nan")
    rows = tuple(tuple(data.draw(st.lists(st.integers(0, pool - 1), min_size=1, max_size=pool, unique=True))) for _ in range(clients))
    sizes = tuple(tuple(data.draw(st.integers(0, 50)) for _ in r) for r in rows)
    batch = _batch(vectors, rows, sizes)
    rule = DFedAvg(weighting)
    for c, agg in enumerate(rule.batched(batch)):
        one = rule(batch.one(c))
        assert agg.weights.keys() == one.weights.keys()
        assert all(abs(agg.weights[k] - one.weights[k]) <= 1e-15 for k in one.weights)
        torch.testing.assert_close(agg.model, one.model, rtol=1e-6, atol=1e-6, equal_nan=True)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), clients=st.integers(1, 6), pool=st.integers(1, 9), q=st.sampled_from([0.0, 0.1, 0.5, 2.0]))
def test_qfdfl_batched_gives_each_client_what_its_own_call_gives(data, clients, pool, q):
    """Any pool (a NaN row, a client's own row NaN), any declared losses (NaN, 0, one whose
    power overflows or vanishes)."""
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 10**6)))
    vectors = torch.randn(pool, 5, generator=gen)
    if data.draw(st.booleans()):
        vectors[data.draw(st.integers(0, pool - 1))] = float("nan")
    rows = tuple(tuple(data.draw(st.lists(st.integers(0, pool - 1), min_size=1, max_size=pool, unique=True))) for _ in range(clients))
    loss = st.one_of(st.floats(0.0, 50.0), st.sampled_from([float("nan"), 1e300, 1e-300]))
    declared = tuple(tuple(data.draw(loss) for _ in r) for r in rows)
    batch = RoundBatch(
        round=0, vectors=vectors, rows=rows, ids=tuple(tuple(range(len(r))) for r in rows), num_samples=tuple((10,) * len(r) for r in rows),
        declared_losses=declared, references=torch.randn(clients, 5, generator=gen),
    )
    rule = QFDFL(q=q, lr=0.05)
    for c, agg in enumerate(rule.batched(batch)):
        one = rule(batch.one(c))
        # The products have other shapes (all clients' distances and models at once): the
        # same values to the last bits of float64, rounded to float32.
        assert agg.weights.keys() == one.weights.keys() and agg.scores == one.scores is None
        assert all(math.isclose(agg.weights[k], one.weights[k], rel_tol=1e-9, abs_tol=1e-12) for k in one.weights)
        torch.testing.assert_close(agg.model, one.model, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_a_nan_row_of_one_client_never_reaches_another():
    vectors = torch.tensor([[1.0, 2.0], [float("nan"), 0.0], [3.0, 4.0]])
    # client 0: its own row is NaN and its neighbour's is fine; client 1 gets only finite rows.
    batch = _batch(vectors, ((1, 0), (2, 0)), ((10, 10), (10, 30)))
    first, second = DFedAvg().batched(batch)
    assert first.weights == {0: 0.0, 1: 1.0} and torch.equal(first.model, vectors[0])
    assert torch.allclose(second.model, torch.tensor([1.5, 2.5])) and second.weights == {0: 0.25, 1: 0.75}


def _aux_sets(gen, sizes, features=6, classes=3):
    return {k: Dataset(torch.randn(n, features, generator=gen), torch.randint(0, classes, (n,), generator=gen), classes) for k, n in sizes.items()}


@pytest.mark.parametrize(
    "name, features, classes, sizes",
    [
        ("softmax_regression", 6, 3, (30, 17, 40, 8)),
        ("mlp", 6, 3, (30, 17, 40, 8)),
        ("softmax_regression", 784, 10, (600, 37, 1200, 1)),  # Fashion-MNIST's shapes: weights laid out once
    ],
    ids=["softmax-regression", "mlp", "softmax-regression-fashion-mnist-shapes"],
)
def test_many_evaluator_scores_as_each_owners_evaluator(name, features, classes, sizes):
    """Owners with auxiliary sets of different sizes, candidate lists of different lengths, a
    NaN candidate (alone for one owner), owners out of order and not all of them: each gets
    exactly what its own evaluator gives."""
    gen = torch.Generator().manual_seed(3)
    template = build_model(name, features, classes, hidden=5, seed=0)
    aux = _aux_sets(gen, dict(zip((3, 5, 9, 11), sizes, strict=True)), features, classes)
    evaluators = {k: VectorEvaluator(template, d) for k, d in aux.items()}
    many = ManyEvaluator()
    vectors = torch.randn(10, sum(p.numel() for p in template.parameters()), generator=gen)
    vectors[4, 1] = float("nan")
    owners, rows = [9, 3, 11, 5], [(0, 1, 2, 4), (3,), (5, 6, 7, 8, 9, 4), (4,)]
    for k, r, got in zip(owners, rows, many(vectors, [evaluators[k] for k in owners], rows), strict=True):
        want = VectorEvaluator(template, aux[k])(vectors[list(r)])
        for key in ("accuracy", "loss"):
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, equal_nan=True)
        assert torch.isnan(got["loss"][list(r).index(4)]) if 4 in r else True


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("name, features", [("softmax_regression", 784), ("mlp", 6), ("resnet20", 64)], ids=["softmax-regression", "mlp", "resnet20"])
def test_many_evaluator_scores_a_cpu_pool_for_owners_on_cuda_as_each_owners_evaluator(name, features):
    """The pool on the CPU (as rules get it), the auxiliary sets on the GPU: the pool goes over
    once, and each owner gets its own evaluator's scores (to float tolerance: the laid-out
    product may take other kernels than each owner's)."""
    gen = torch.Generator().manual_seed(3)
    shape = (1, 8, 8) if name == "resnet20" else None
    template = build_model(name, features, 10, hidden=5, seed=0, input_shape=shape)
    aux = {k: Dataset(d.x.cuda(), d.y.cuda(), 10) for k, d in _aux_sets(gen, {3: 30, 5: 17, 9: 40}, features, 10).items()}
    evaluators = {k: VectorEvaluator(template, d) for k, d in aux.items()}
    vectors = torch.randn(8, sum(p.numel() for p in template.parameters()), generator=gen) * 0.1
    vectors[4, 1] = float("nan")
    owners, rows = [9, 3, 5], [(0, 1, 2, 4), (3,), (5, 6, 7, 4)]
    for k, r, got in zip(owners, rows, ManyEvaluator()(vectors, [evaluators[k] for k in owners], rows), strict=True):
        want = evaluators[k](vectors[list(r)])
        for key in ("accuracy", "loss"):
            torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-5, equal_nan=True)


class _Reevaluates:
    """A TPM that scores a perturbed copy of the candidates: its own tensor, not the one given."""

    def __call__(self, candidates, evaluate):
        return evaluate(candidates + 0.01)["loss"]


@pytest.mark.parametrize(
    "tpm, crs", [("loss", "loss_clip_mean"), ("accuracy", "softmax"), ("combined", "softmax"), (_Reevaluates(), "loss_clip_mean")],
    ids=["loss-clip", "accuracy-softmax", "combined", "tpm-with-its-own-candidates"],
)
@pytest.mark.parametrize("many", [True, "without-metrics", False], ids=["evaluate-many", "evaluate-many-of-every-metric", "per-client-evaluate"])
def test_dfedreweighting_batched_gives_each_client_what_its_own_call_gives(tpm, crs, many):
    gen = torch.Generator().manual_seed(5)
    template = build_model("softmax_regression", 6, 3, seed=0)
    owners = (0, 1, 2, 3)
    aux = _aux_sets(gen, {k: 12 + 5 * k for k in owners})
    evaluators = {k: VectorEvaluator(template, d) for k, d in aux.items()}
    vectors = torch.randn(7, sum(p.numel() for p in template.parameters()), generator=gen)
    vectors[5] = float("inf")  # a diverged candidate: score NaN, weight 0
    rows = ((0, 1, 2, 5), (1, 0, 6), (2, 0, 3, 4, 5), (3, 2))
    ids = ((0, 1, 2, 7), (1, 0, 8), (2, 0, 3, 9, 7), (3, 2))
    batch = RoundBatch(
        round=3, vectors=vectors, rows=rows, ids=ids, num_samples=tuple((10,) * len(r) for r in rows),
        evaluate=tuple(evaluators[k] for k in owners),
        # A scorer that cannot be asked for some metrics only (no ``metrics`` keyword) gives them all.
        evaluate_many=(lambda vectors, owners, rows: ManyEvaluator()(vectors, owners, rows)) if many == "without-metrics" else ManyEvaluator() if many else None,
    )
    params = {"temperature": 1.0} if crs == "softmax" else {}
    rule = DFedReweighting(tpm=make_tpm(tpm) if isinstance(tpm, str) else tpm, crs=make_crs(crs, **params))
    for c, agg in enumerate(rule.batched(batch)):
        one = rule(batch.one(c))
        assert agg.weights.keys() == one.weights.keys() == agg.scores.keys()
        for key in one.weights:
            assert abs(agg.weights[key] - one.weights[key]) <= 1e-6, (c, key)
            assert agg.scores[key] == pytest.approx(one.scores[key], rel=1e-5, nan_ok=True)
        if 5 in rows[c]:  # the diverged candidate, sent by 7
            assert agg.weights[7] == 0.0 and agg.scores[7] != agg.scores[7]
        torch.testing.assert_close(agg.model, one.model, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["softmax_regression", "mlp"])
def test_batched_products_are_each_clients_own_model(name):
    template = build_model(name, 8, 3, hidden=5, seed=0)
    model = FlatModel(template, torch.device("cpu"))
    assert model.plan is not None
    vectors = torch.randn(4, sum(model.sizes))
    shared = torch.randn(7, 8)
    own = torch.randn(4, 7, 8)
    for c in range(4):
        torch.testing.assert_close(model.batch_logits(vectors, shared)[c], model.logits(vectors[c], shared))
        torch.testing.assert_close(model.batch_logits(vectors, own)[c], model.logits(vectors[c], own[c]))


@pytest.mark.parametrize(
    "template",
    [
        build_model("softmax_regression", 8, 3, seed=0),
        build_model("mlp", 8, 3, hidden=5, seed=0),
        torch.nn.Sequential(torch.nn.Linear(8, 4, bias=False), torch.nn.Tanh(), torch.nn.Linear(4, 3, bias=False)),
        torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Softmax(dim=1), torch.nn.Linear(4, 3)),  # not elementwise
    ],
    ids=["softmax-regression", "mlp", "no-bias", "a-layer-that-is-not-elementwise"],
)
def test_class_first_logits_are_each_models_logits_transposed(template):
    model = FlatModel(template, torch.device("cpu"))
    vectors = torch.randn(4, sum(model.sizes))
    x = torch.randn(7, 8)
    own = torch.randn(4, 7, 8)  # each model its own inputs (a local step's minibatches)
    got, got_own = model.class_first_logits(vectors, x), model.class_first_logits(vectors, own)
    assert got.shape == got_own.shape == (4, 3, 7)
    for c in range(4):
        torch.testing.assert_close(got[c], model.logits(vectors[c], x).t())
        torch.testing.assert_close(got_own[c], model.logits(vectors[c], own[c]).t())


@pytest.mark.parametrize(
    "template",
    [
        build_model("softmax_regression", 8, 3, seed=0),
        build_model("mlp", 8, 3, hidden=5, seed=0),
        torch.nn.Sequential(torch.nn.Linear(8, 4, bias=False), torch.nn.Tanh(), torch.nn.Linear(4, 3, bias=False)),
    ],
    ids=["softmax-regression", "mlp", "no-bias"],
)
def test_a_planned_models_logits_are_its_forward_bit_for_bit(template):
    # Prepare: the module's own forward with its parameters swapped for views of the vector
    from torch.func import functional_call

    model = FlatModel(template, torch.device("cpu"))
    vector = torch.randn(sum(model.sizes), generator=torch.Generator().manual_seed(2))
    x = torch.randn(301, 8, generator=torch.Generator().manual_seed(3))
    parts = torch.split(vector, model.sizes)
    params = {n: p.view(s) for n, p, s in zip(model.names, parts, model.shapes, strict=True)}

    # Execute
    got = model.logits(vector, x)

    # Assert
    assert torch.equal(got, functional_call(model.module, params, (x,)))


def test_other_modules_go_through_vmap():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 2))

        def forward(self, x):
            return torch.tanh(x @ self.w)

    assert _layer_plan(Odd()) is None
    assert _layer_plan(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))) is None
    # Parameter-free but not elementwise: the batched layouts would move the dim it reads.
    assert _layer_plan(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Softmax(dim=1))) is None
    model = FlatModel(Odd(), torch.device("cpu"))
    vectors = torch.randn(2, 6)
    x = torch.randn(4, 3)
    torch.testing.assert_close(model.batch_logits(vectors, x)[1], model.logits(vectors[1], x))


class _EqualBySetting:
    """A user's rule that defines equality and so is unhashable."""

    def __init__(self, setting):
        self.setting = setting

    def __eq__(self, other):
        return isinstance(other, _EqualBySetting) and self.setting == other.setting


class _Undecidable:
    """A rule whose equality raises."""

    def __eq__(self, other):
        raise RuntimeError("cannot compare")

    __hash__ = None


def test_rules_group_by_class_and_settings_hashable_or_not():
    # Prepare: frozen dataclasses (hashable), a user's unhashable rule, one that cannot be compared
    odd = _Undecidable()
    rules = [DFedAvg("uniform"), Flame(seed=1), DFedAvg("uniform"), _EqualBySetting(2), Flame(seed=2),
             _EqualBySetting(2), DFedAvg("data_size"), odd, _EqualBySetting(3), odd, Flame(seed=1)]

    # Execute
    groups = rule_groups(rules)

    # Assert: equal rules share a group, in first-seen order (Flames of any seed: their batch
    # group leaves it out); the undecidable one is alone each time
    assert [members for _, members in groups] == [[0, 2], [1, 4, 10], [3, 5], [6], [7], [8], [9]]
    assert [rules[members[0]] is rule for rule, members in groups] == [True] * len(groups)
    assert [m for _, m in rule_groups([Flame(seed=1), Flame(seed=2, noise=0.5), Flame(seed=3)])] == [[0, 2], [1]]


def test_cuda_is_refused_in_one_line_where_there_is_none():
    if torch.cuda.is_available():
        assert engine_device("cuda").type == "cuda"
    else:
        with pytest.raises(ValueError, match=r"^engine.device='cuda': this machine has no CUDA device"):
            engine_device("cuda")


def test_a_shard_smaller_than_the_batch_is_padded_and_the_padding_weighs_nothing(small_scenario, tmp_path):
    """Batch size 300 on digits with 6 clients under Dirichlet(0.1): shards of different sizes,
    some below 300. Each client's loss and step are those of its own (smaller) batch."""
    scenario = small_scenario("topology.honest=6", "topology.byzantine=0", "attack.name=none", "train.batch_size=300", "data.partition='dirichlet:0.1'")
    run = BatchedRun(scenario, tmp_path)
    sizes = [b.batch_size for b in run.batches]
    assert len(set(sizes)) > 1 and min(sizes) < 300
    before = run.models.clone()
    losses = train_together([run])[0]
    for c, k in enumerate(run.honest):
        # The same step, for this client alone, from the same minibatch.
        order = run.batches[c]
        idx = order._order[order._pos - order.batch_size : order._pos]  # its first minibatch
        w = before[c].clone().requires_grad_()
        rows = run.shard_rows[run.offsets[c] + idx]  # its shard's rows of the training set
        x, y = run.train_features(run.train_x[rows]), run.train_y[rows]
        loss = torch.nn.functional.cross_entropy(run.model.logits(w, x), y)
        loss.backward()
        assert abs(losses[c] - float(loss.detach())) < 1e-5
        torch.testing.assert_close(run.models[c], (before[c] - scenario.train.lr * w.grad), rtol=1e-5, atol=1e-6)


def test_an_interrupted_batch_keeps_its_rounds_and_says_so_in_each_runs_summary(small_scenario, tmp_path):
    # Prepare: Ctrl-C (or SIGTERM, which the entry points turn into it) during round 5
    scenario = small_scenario("topology.honest=4", "topology.byzantine=1", "attack.name=gaussian", "engine.name=batched")
    runs = [BatchedRun(scenario, tmp_path / "a"), BatchedRun(dataclasses.replace(scenario, seed=44), tmp_path / "b")]

    def stop(r):
        if r == 5:
            raise KeyboardInterrupt

    # Execute
    summaries = run_together(runs, stop)

    # Assert
    for run, summary in zip(runs, summaries, strict=True):
        assert summary["interrupted"] and json.loads((run.out_dir / "summary.json").read_text()) == summary
        assert summary["honest_completed"] == 0 and sorted(summary["failed_peers"]) == list(range(5))
        for k in range(5):
            assert [r["round"] for r in read_rounds(run.out_dir, k)] == list(range(6))
            assert not json.loads((run.out_dir / "peers" / f"{k}.json").read_text())["completed"]


def test_results_folder_has_every_runs_layout(small_scenario, tmp_path):
    scenario = small_scenario("topology.honest=4", "topology.byzantine=1", "attack.name=gaussian", "eval.every=10", "engine.name=batched")
    summary = run_together([BatchedRun(scenario, tmp_path)])[0]
    assert summary["engine"] == "batched" and summary["failed_peers"] == [] and summary["honest_completed"] == 4
    assert (tmp_path / "scenario.toml").exists() and json.loads((tmp_path / "summary.json").read_text()) == summary
    byzantine = next(int(k) for k, p in summary["peers"].items() if p["role"] == "byzantine")
    for k in range(5):
        records = read_rounds(tmp_path, k)
        assert [r["round"] for r in records] == list(range(20))
        final = json.loads((tmp_path / "peers" / f"{k}.json").read_text())
        assert final["completed"] and final["engine"] == "batched"
        if k == byzantine:
            assert final["attack"] == "gaussian" and all(r["weights"] == {} for r in records)
        else:
            assert {"accuracy", "global_accuracy", "aggregation", "num_samples"} <= final.keys()
            assert "accuracy" in records[9] and "accuracy" not in records[8] and "accuracy" in records[19]
            assert all(abs(sum(r["weights"].values()) - 1) < 1e-5 for r in records)


def check_cuda_gives_the_cpu_results(small_scenario, tmp_path, base: tuple[str, ...], tolerance: float) -> None:
    """The same run on the CPU and on CUDA: the same senders each round, weights within
    ``tolerance``, final accuracies within 2 points (a close call can go the other way)."""
    runs = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        runs[device] = run_together([BatchedRun(small_scenario(*base, f"engine.device={device}"), out)])[0]
        runs[device]["out"] = out
    assert runs["cuda"]["device"].startswith("cuda")
    for k, peer in runs["cpu"]["peers"].items():
        if peer["role"] != "honest":
            continue
        assert abs(peer["accuracy"] - runs["cuda"]["peers"][k]["accuracy"]) <= 2.0
        for a, b in zip(read_rounds(runs["cpu"]["out"], int(k)), read_rounds(runs["cuda"]["out"], int(k)), strict=True):
            assert a["weights"].keys() == b["weights"].keys()
            assert all(abs(a["weights"][s] - b["weights"][s]) <= tolerance for s in a["weights"]), (k, a["round"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_the_batched_engine_on_cuda_gives_the_cpu_results(small_scenario, tmp_path):
    """CUDA kernels are not bit-identical to CPU ones: the same weights to 1e-4 over 20 rounds."""
    check_cuda_gives_the_cpu_results(
        small_scenario, tmp_path, ("topology.honest=5", "topology.byzantine=1", "attack.name=gaussian", "engine.name=batched"), 1e-4
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_a_convolutional_model_in_the_batched_engine_on_cuda_gives_the_cpu_results(small_scenario, tmp_path):
    """ResNet-20 with momentum over 5 rounds: weights within 1e-3 (cuDNN's convolutions sum in
    other orders than the CPU's)."""
    base = (
        "topology.honest=5", "topology.byzantine=1", "attack.name=gaussian", "engine.name=batched", "train.model=resnet20",
        "train.momentum=0.9", "rounds=5", "eval.every=5",
    )
    check_cuda_gives_the_cpu_results(small_scenario, tmp_path, base, 1e-3)


def test_a_batch_hands_each_client_the_pools_finite_rows_and_inputs_check_their_length():
    vectors = torch.tensor([[1.0, 2.0], [float("nan"), 0.0], [3.0, 4.0]])
    batch = RoundBatch(
        round=0, vectors=vectors, rows=((0, 1), (2, 0)), ids=((0, 1), (2, 0)), num_samples=((1, 1), (1, 1)),
        finite_pool=torch.tensor([True, False, True]),
    )
    assert batch.one(0).finite == (True, False) and batch.one(1).finite_list() == [True, True]
    assert batch.select([1]).one(0).finite == (True, True)
    # Without the pool's mask a rule checks the rows itself, with the same answer.
    assert _batch(vectors, ((0, 1), (2, 0)), ((1, 1), (1, 1))).one(0).finite_list() == [True, False]
    with pytest.raises(ValueError, match="finite has 1 entries but there are 2 ids"):
        dataclasses.replace(batch.one(0), finite=(True,))


# -- models without a layer plan (the convolutional ones) -----------------------------------------


def small_lenet() -> torch.nn.Module:
    return build_model("lenet5", 144, 3, input_shape=(1, 12, 12), seed=1)


def test_a_convolutional_model_is_called_once_per_model_with_its_own_parameters():
    template = small_lenet()
    model = FlatModel(template, torch.device("cpu"))
    assert model.plan is None and model.layout == "loop"
    vectors = torch.randn(3, sum(model.sizes)) * 0.1
    x, own = torch.randn(5, 144), torch.randn(3, 5, 144)
    with torch.no_grad():
        shared, each = model.batch_logits(vectors, x), model.batch_logits(vectors, own)
    for c in range(3):
        torch.nn.utils.vector_to_parameters(vectors[c], template.parameters())
        with torch.no_grad():
            assert torch.equal(shared[c], template(x)) and torch.equal(each[c], template(own[c]))


def test_the_loop_and_the_vmap_layouts_agree():
    template = small_lenet()
    loop, mapped = FlatModel(template, torch.device("cpu")), FlatModel(template, torch.device("cpu"), layout="vmap")
    vectors = torch.randn(4, sum(loop.sizes)) * 0.1
    x = torch.randn(6, 144)
    torch.testing.assert_close(loop.class_first_logits(vectors, x), mapped.class_first_logits(vectors, x))
    with pytest.raises(ValueError, match="layout='grouped' is not valid; choose one of: loop, vmap"):
        FlatModel(template, torch.device("cpu"), layout="grouped")


def test_rows_go_in_blocks_when_no_gradient_is_wanted(monkeypatch):
    from dfedrw.peer.learning import model_matrix as training
    template = small_lenet()
    model = FlatModel(template, torch.device("cpu"))
    # The widest activation of LeNet-5 on 12x12: 6 channels of 12x12 after the first convolution.
    assert training.activation_width(template, 144) == 6 * 12 * 12
    monkeypatch.setattr(training, "BLOCK_VALUES", 6 * 12 * 12 * 4)  # 4 rows a block
    assert model.block_rows(144) == 4
    calls = []
    monkeypatch.setattr(template, "forward", lambda rows, forward=template.forward: calls.append(len(rows)) or forward(rows))
    vectors = torch.nn.utils.parameters_to_vector(template.parameters()).detach()[None]
    x = torch.randn(10, 144)
    with torch.no_grad():
        blocked = model.batch_logits(vectors, x)
    assert calls == [4, 4, 2]
    calls.clear()
    whole = model.batch_logits(vectors.clone().requires_grad_(), x)  # a gradient: the rows at once
    assert calls == [10]
    torch.testing.assert_close(blocked, whole.detach())


def test_the_gradient_of_stacked_convolutional_models_is_each_models_own():
    from torch.nn import functional as F

    template = small_lenet()
    model = FlatModel(template, torch.device("cpu"))
    vectors = (torch.randn(3, sum(model.sizes)) * 0.1).requires_grad_()
    x, y = torch.randn(3, 5, 144), torch.randint(0, 3, (3, 5))
    losses = F.cross_entropy(model.class_first_logits(vectors, x), y, reduction="none").mean(1)
    (grads,) = torch.autograd.grad(losses.sum(), vectors)
    for c in range(3):
        torch.nn.utils.vector_to_parameters(vectors[c].detach(), template.parameters())
        template.zero_grad()
        F.cross_entropy(template(x[c]), y[c]).backward()
        torch.testing.assert_close(grads[c], torch.nn.utils.parameters_to_vector(p.grad for p in template.parameters()))


def test_evaluate_takes_a_convolutional_models_rows_in_blocks(monkeypatch):
    from dfedrw.peer.learning import model_matrix
    from dfedrw.peer.learning.data import Dataset
    from dfedrw.peer.learning.training import evaluate

    import weakref

    template = small_lenet()
    data = Dataset(x=torch.randn(9, 144), y=torch.randint(0, 3, (9,)), num_classes=3)
    whole = evaluate(template, data)
    monkeypatch.setattr(model_matrix, "BLOCK_VALUES", 6 * 12 * 12 * 2)  # 2 rows a block
    monkeypatch.setattr(model_matrix, "_ROWS", weakref.WeakKeyDictionary())  # measured again
    calls = []
    template.register_forward_hook(lambda module, inputs, output: calls.append(len(inputs[0])))
    blocked = evaluate(template, data)
    assert calls[-5:] == [2, 2, 2, 2, 1]
    assert blocked["accuracy"] == whole["accuracy"]
    assert blocked["loss"] == pytest.approx(whole["loss"], rel=1e-6)


def test_vmapped_models_take_shared_rows_in_blocks_for_all_of_them_together(monkeypatch):
    """Without gradients the vmap layout splits the shared rows so that every model's block
    together holds what one model's block holds in the loop: the same logits as at once."""
    from dfedrw.peer.learning import model_matrix

    import weakref

    model = FlatModel(small_lenet(), torch.device("cpu"), layout="vmap")
    vectors = torch.randn(3, sum(model.sizes)) * 0.1
    x = torch.randn(10, 144)
    with torch.no_grad():
        whole = model.batch_logits(vectors, x)
    monkeypatch.setattr(model_matrix, "BLOCK_VALUES", 6 * 12 * 12 * 6)  # 6 rows for one model: 2 for three
    monkeypatch.setattr(model_matrix, "_ROWS", weakref.WeakKeyDictionary())
    seen = []
    real = model_matrix.vmap
    monkeypatch.setattr(model_matrix, "vmap", lambda f, in_dims: (lambda v, rows: seen.append(len(rows)) or real(f, in_dims=in_dims)(v, rows)))
    with torch.no_grad():
        blocked = model.batch_logits(vectors, x)

    assert seen == [2, 2, 2, 2, 2]
    torch.testing.assert_close(blocked, whole, rtol=1e-6, atol=1e-6)
    looped = FlatModel(small_lenet(), torch.device("cpu"), layout="loop")
    with torch.no_grad():
        torch.testing.assert_close(looped.batch_logits(vectors, x), whole, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_on_a_gpu_blocks_are_larger_than_on_the_cpu():
    from dfedrw.peer.learning.model_matrix import BLOCK_VALUES, DEVICE_BLOCK_VALUES, block_rows

    cpu, cuda = small_lenet(), small_lenet().cuda()
    assert block_rows(cuda, 144) == max(1, DEVICE_BLOCK_VALUES // (6 * 12 * 12)) > block_rows(cpu, 144) == max(1, BLOCK_VALUES // (6 * 12 * 12))
