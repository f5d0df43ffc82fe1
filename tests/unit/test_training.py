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


def _autograd_grads(flat, models, x, y, weight):
    from torch.nn import functional as F

    models = models.detach().clone().requires_grad_()
    per = F.cross_entropy(flat.class_first_logits(models, x), y, reduction="none")
    losses = per.mean(1) if weight is None else (per * weight).sum(1)
    (grads,) = torch.autograd.grad(losses.sum(), models)
    return losses.detach(), grads


def test_softmax_regression_grads_are_autograds_bit_for_bit():
    # Prepare: 7 softmax-regression models (with and without a bias), each its own minibatch of
    # 30 rows (not a power of two, so 1/30 is rounded), and the same with padded rows weighted 0
    from torch import nn

    from dfedrw.peer.training import FlatModel, softmax_regression_grads

    g = torch.Generator().manual_seed(3)
    x = torch.rand(7, 30, 20, generator=g)
    y = torch.randint(0, 4, (7, 30), generator=g)
    padded = torch.zeros(7, 30)
    padded[:, :17] = 1.0 / 17
    for bias in (True, False):
        flat = FlatModel(nn.Sequential(nn.Linear(20, 4, bias=bias)), torch.device("cpu"))
        models = torch.randn(7, 20 * 4 + (4 if bias else 0), generator=g)
        for weight in (None, padded):
            # Execute
            losses, grads = softmax_regression_grads(flat, models, x, y, weight)

            # Assert: the very numbers autograd gives
            want_losses, want_grads = _autograd_grads(flat, models, x, y, weight)
            assert torch.equal(losses, want_losses)
            assert torch.equal(grads, want_grads)


def test_softmax_regression_grads_leave_other_models_to_autograd():
    # Prepare: a two-layer model
    from dfedrw.peer.training import FlatModel, softmax_regression_grads

    flat = FlatModel(build_model("mlp", 6, 3, hidden=5, seed=1), torch.device("cpu"))
    models = torch.stack([get_vector(build_model("mlp", 6, 3, hidden=5, seed=s)) for s in range(3)])

    # Execute / Assert
    assert softmax_regression_grads(flat, models, torch.rand(3, 4, 6), torch.zeros(3, 4, dtype=torch.long), None) is None
