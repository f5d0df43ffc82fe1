import torch

from dfedrw.peer.data import Dataset
from dfedrw.peer.models import build_model, get_vector, set_vector
from dfedrw.peer.training import LocalTrainer, VectorEvaluator, evaluate


def data(n=50, d=6, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Dataset(torch.rand(n, d, generator=g), torch.randint(0, k, (n,), generator=g), k)


def test_batched_evaluation_matches_one_model_at_a_time():
    ds = data()
    for name in ("softmax_regression", "mlp"):
        model = build_model(name, 6, 3, hidden=5, seed=1)
        base = get_vector(model)
        vectors = torch.stack([base, base * 0.5, base + 1.0, torch.full_like(base, float("nan"))])
        got = VectorEvaluator(model, ds)(vectors)
        for i in range(3):
            probe = build_model(name, 6, 3, hidden=5, seed=1)
            set_vector(probe, vectors[i])
            want = evaluate(probe, ds)
            assert abs(got["accuracy"][i].item() - want["accuracy"]) < 1e-9
            assert abs(got["loss"][i].item() - want["loss"]) < 1e-5
        assert torch.isnan(got["accuracy"][3]) and torch.isnan(got["loss"][3])
        assert torch.equal(get_vector(model), base), "the client's own model must not change"


def test_sgd_step_reduces_loss_and_is_seeded():
    ds = data(n=64)
    runs = []
    for _ in range(2):
        model = build_model("softmax_regression", 6, 3, seed=0)
        trainer = LocalTrainer(model, ds, lr=0.5, batch_size=64, local_steps=1, seed=7)
        losses = [trainer.step() for _ in range(30)]
        runs.append(losses)
        assert losses[-1] < losses[0]
    assert runs[0] == runs[1]


def test_model_init_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = get_vector(build_model("mlp", 4, 2, hidden=3, seed=9))
    after = torch.rand(1)
    assert torch.equal(before, after)
    assert torch.equal(a, get_vector(build_model("mlp", 4, 2, hidden=3, seed=9)))
