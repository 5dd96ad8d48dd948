"""NFN-NP and NFN-HNP (dws/nfn): the symmetries they claim, on random architectures, with a group
action written here on the raw tensors (not the model code's), controls that they are not trivially
invariant, the layer norms and channel dropout keeping them, and a short `zoo train` run of each."""

from __future__ import annotations

import json

import pytest
import torch

from dws.nfn import ChannelDropout, ChannelLayerNorm, HNPLayer, NeuronLayerNorm, NFNInvariant, NPLayer
from dws.weightspace import WeightSpace
from dws_helpers import derange

MODES = ("np", "hnp")
LAYERS = {"np": NPLayer, "hnp": HNPLayer}


def random_widths(gen: torch.Generator) -> tuple[int, ...]:
    """2-4 layers, widths 2-6 (at least two outputs, so that output permutations exist)."""
    depth = int(torch.randint(2, 5, (1,), generator=gen))
    widths = torch.randint(2, 7, (depth + 1,), generator=gen).tolist()
    return tuple(widths)


def random_space(widths, batch, channels, gen) -> WeightSpace:
    w = tuple(torch.randn(batch, o, i, channels, generator=gen, dtype=torch.float64)
              for i, o in zip(widths[:-1], widths[1:]))
    b = tuple(torch.randn(batch, o, channels, generator=gen, dtype=torch.float64) for o in widths[1:])
    return WeightSpace(w, b)


def act(ws: WeightSpace, perms) -> WeightSpace:
    """``perms[l]`` reorders the neurons of layer ``l`` (``0..L``): rows of ``W_l``/``b_l``, columns of ``W_{l+1}``."""
    weights = tuple(w[:, perms[l + 1]][:, :, perms[l]] for l, w in enumerate(ws.weights))
    biases = tuple(b[:, perms[l + 1]] for l, b in enumerate(ws.biases))
    return WeightSpace(weights, biases)


def group_element(widths, gen, hidden=True, inputs=False, outputs=False):
    """A random permutation of the chosen neurons (the others fixed), one per layer ``0..L``."""
    L = len(widths) - 1
    chosen = lambda l: (inputs if l == 0 else outputs if l == L else hidden)  # noqa: E731
    return [torch.randperm(d, generator=gen) if chosen(l) else torch.arange(d) for l, d in enumerate(widths)]


def close(a: WeightSpace, b: WeightSpace) -> bool:
    return all(torch.allclose(x, y, atol=1e-10) for x, y in zip(a.weights + a.biases, b.weights + b.biases))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(6))
def test_each_layer_is_equivariant_to_hidden_neuron_permutations(mode, seed):
    gen = torch.Generator().manual_seed(seed)
    widths = random_widths(gen)
    c_in, c_out = (int(c) for c in torch.randint(1, 5, (2,), generator=gen))
    layer = LAYERS[mode](widths, c_in, c_out).double()
    x = random_space(widths, 3, c_in, gen)
    perms = group_element(widths, gen)
    assert close(layer(act(x, perms)), act(layer(x), perms)), widths
    # the output moves with the input: a non-trivial permutation changes it
    perms = [torch.arange(d) for d in widths]
    perms[1] = derange(widths[1], gen)
    assert not close(layer(act(x, perms)), layer(x))


@pytest.mark.parametrize("seed", range(4))
def test_the_np_layer_is_equivariant_to_input_and_output_permutations_and_the_hnp_layer_is_not(seed):
    """NP's group permutes every neuron; HNP's terms tell input and output neurons apart."""
    gen = torch.Generator().manual_seed(100 + seed)
    widths = random_widths(gen)
    x = random_space(widths, 2, 2, gen)
    perms = group_element(widths, gen, inputs=True, outputs=True)
    perms[0], perms[-1] = derange(widths[0], gen), derange(widths[-1], gen)
    np_layer, hnp_layer = NPLayer(widths, 2, 3).double(), HNPLayer(widths, 2, 3).double()
    assert close(np_layer(act(x, perms)), act(np_layer(x), perms))
    assert not close(hnp_layer(act(x, perms)), act(hnp_layer(x), perms))


def small_model(widths, mode, seed, norm=None):
    torch.manual_seed(seed)
    return NFNInvariant(widths, 3, mode=mode, hidden_channels=4, fourier_features=3, head_hidden=8,
                        norm=norm).double().eval()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("norm", [None, "simple", "param"])
@pytest.mark.parametrize("seed", range(3))
def test_the_invariant_model_is_invariant_to_hidden_permutations_only(mode, norm, seed):
    gen = torch.Generator().manual_seed(200 + seed)
    widths = random_widths(gen)
    model = small_model(widths, mode, seed, norm)
    x = random_space(widths, 4, 1, gen)
    y = model(x)
    assert y.shape == (4, 3)
    torch.testing.assert_close(model(act(x, group_element(widths, gen))), y, rtol=1e-9, atol=1e-10)
    # controls: another input, and a permutation of the input or of the output neurons, change the output
    assert not torch.allclose(model(random_space(widths, 4, 1, gen)), y)
    for end in (0, -1):
        perms = [torch.arange(d) for d in widths]
        perms[end] = derange(widths[end], gen)
        assert not torch.allclose(model(act(x, perms)), y, atol=1e-8), f"neurons of layer {end} permuted"


def test_np_tells_input_neurons_apart_through_its_position_encoding():
    """Without the encoding (and with a head that pools the input axis away) NP could not."""
    from dws.nfn import IOPositionEncoding

    gen = torch.Generator().manual_seed(7)
    widths = (3, 4, 5, 2)
    x = random_space(widths, 2, 1, gen)
    perms = [derange(3, gen), torch.arange(4), torch.arange(5), torch.arange(2)]
    torch.manual_seed(0)
    layer = NPLayer(widths, 1 + IOPositionEncoding().channels, 2).double()
    plain = lambda ws: layer(IOPositionEncoding()(ws))  # noqa: E731
    assert not close(plain(act(x, perms)), act(plain(x), perms))


def test_the_models_are_sized_to_the_dwsnet_and_built_as_the_reference_mnist_config():
    """inv_ff_mnist.yaml / inv_ff_io_mnist.yaml: channel dropout 0.1 after every NF layer, no layer norm."""
    from dws.tasks.models import build_model

    for name in ("nfn-np", "nfn-hnp"):
        model, desc = build_model(name, (2, 32, 32, 1), 10)
        assert isinstance(model, NFNInvariant)
        assert abs(desc["params"] - desc["sized_to"]) / desc["sized_to"] < 0.15, desc
        kinds = [type(m) for m in model.layers]
        assert kinds.count(ChannelDropout) == 3 and all(m.p == 0.1 for m in model.layers if type(m) is ChannelDropout)
        assert ChannelLayerNorm not in kinds and NeuronLayerNorm not in kinds


@pytest.mark.parametrize("norm", ["simple", "param"])
def test_the_layer_norms_add_few_parameters_and_bad_names_are_refused(norm):
    widths = (2, 32, 32, 1)
    plain, normed = NFNInvariant(widths, 10, mode="hnp"), NFNInvariant(widths, 10, mode="hnp", norm=norm)
    extra = sum(p.numel() for p in normed.parameters()) - sum(p.numel() for p in plain.parameters())
    assert 0 < extra < 0.01 * sum(p.numel() for p in plain.parameters())
    with pytest.raises(ValueError, match="norm must be"):
        NFNInvariant(widths, 10, norm="batch")


def randomize_affine(norm: torch.nn.Module) -> torch.nn.Module:
    """Affine parameters away from their (1, 0) init, so that per-neuron parameters would show."""
    with torch.no_grad():
        for p in norm.parameters():
            p.normal_()
    return norm.double()


@pytest.mark.parametrize("seed", range(5))
def test_the_channel_layer_norm_is_equivariant_to_every_neuron_permutation(seed):
    gen = torch.Generator().manual_seed(300 + seed)
    widths = random_widths(gen)
    c = int(torch.randint(2, 6, (1,), generator=gen))
    norm = randomize_affine(ChannelLayerNorm(len(widths) - 1, c))
    x = random_space(widths, 3, c, gen)
    perms = group_element(widths, gen, inputs=True, outputs=True)  # NP's group: input and output neurons too
    assert close(norm(act(x, perms)), act(norm(x), perms))
    # it normalizes: with the (1, 0) affine init every entry has mean 0 over its channels
    fresh = ChannelLayerNorm(len(widths) - 1, c).double()(x)
    assert all(t.mean(dim=-1).abs().max() < 1e-10 for t in fresh.weights + fresh.biases)
    assert not close(norm(x), x)


@pytest.mark.parametrize("seed", range(5))
def test_the_neuron_layer_norm_is_equivariant_to_hidden_permutations_only(seed):
    gen = torch.Generator().manual_seed(400 + seed)
    widths = random_widths(gen)
    c = int(torch.randint(1, 5, (1,), generator=gen))
    norm = randomize_affine(NeuronLayerNorm(widths, c))
    x = random_space(widths, 3, c, gen)
    perms = group_element(widths, gen)
    assert close(norm(act(x, perms)), act(norm(x), perms))
    # W_1's rows are normalized over inputs and channels together: with the (1, 0) init each row has mean 0
    fresh = NeuronLayerNorm(widths, c).double()(x)
    assert fresh.weights[0].mean(dim=(2, 3)).abs().max() < 1e-10
    # control: its per-input / per-output affine parameters tell those neurons apart
    for end in (0, -1):
        perms = [torch.arange(d) for d in widths]
        perms[end] = derange(widths[end], gen)
        assert not close(norm(act(x, perms)), act(norm(x), perms)), f"neurons of layer {end} permuted"


@pytest.mark.parametrize("seed", range(4))
def test_channel_dropout_drops_whole_weight_channels_so_one_draw_commutes_with_permutations(seed):
    gen = torch.Generator().manual_seed(500 + seed)
    widths = random_widths(gen)
    x = random_space(widths, 8, 16, gen).map(lambda t: t.abs() + 1)  # no zeros of its own
    drop = ChannelDropout(0.5).train()
    perms = group_element(widths, gen, inputs=True, outputs=True)
    torch.manual_seed(seed)
    dropped = drop(x)
    torch.manual_seed(seed)  # the same draw: weight masks are per (network, channel), not per neuron
    for a, b in zip(drop(act(x, perms)).weights, act(dropped, perms).weights):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for w_in, w_out in zip(x.weights, dropped.weights):
        kept = w_out != 0
        assert (kept == kept[:, :1, :1]).all(), "a weight channel is dropped whole or kept whole"
        assert 0 < kept[:, 0, 0].float().mean() < 1
        torch.testing.assert_close(w_out[kept], 2 * w_in[kept])  # kept entries scaled by 1 / (1 - p)
    # biases: elementwise, as in the reference code (nn.Dropout): some entry of some channel differs
    zeros = torch.cat([b.flatten() == 0 for b in dropped.biases])
    assert 0 < zeros.float().mean() < 1
    # eval mode: the identity
    assert close(drop.eval()(x), x)


def test_adapt_is_refused_in_one_line(tiny_store):
    from dws.tasks.options import TrainOptions, check_options

    with pytest.raises(ValueError, match="outputs a vector"):
        check_options(TrainOptions(store=str(tiny_store), model="nfn-hnp", task="adapt"))


@pytest.mark.parametrize("name", ["nfn-np", "nfn-hnp"])
def test_train_saves_and_reevaluates_a_run(name, tiny_store, tmp_path):
    from dws.tasks.options import TrainOptions
    from dws.tasks.run import train_run
    from dws.tasks.rundir import evaluate_run

    out = tmp_path / name
    metrics = train_run(TrainOptions(store=str(tiny_store), model=name, epochs=2, lr=1e-3, batch_size=16,
                                     hidden_channels=4, out=str(out), progress=False), log=lambda *_: None)
    assert json.loads((out / "config.json").read_text())["model"]["model"] == name
    assert len(json.loads((out / "metrics.json").read_text())["history"][0]) == 2
    again = evaluate_run(out, tiny_store)
    assert again["accuracy"] == pytest.approx(metrics["test"][0]["accuracy"], abs=1e-6)
    assert again["loss"] == pytest.approx(metrics["test"][0]["loss"], rel=1e-5)


def test_regress_trains_on_a_sine_store(tmp_path):
    """An invariant regression task (frequencies of sines) runs through the same loop."""
    from dws.tasks.options import TrainOptions
    from dws.tasks.run import train_run
    from zoo.generate.run import GenerateOptions, generate

    sines = tmp_path / "sines"
    generate(GenerateOptions(kind="sine-regression", out=str(sines), limit=24, chunk_size=8, steps=2, progress=False),
             log=lambda *_: None)
    metrics = train_run(TrainOptions(store=str(sines), model="nfn-hnp", task="regress", epochs=1, lr=1e-3,
                                     batch_size=8, hidden_channels=4, out=str(tmp_path / "run"), progress=False),
                        log=lambda *_: None)
    assert torch.isfinite(torch.tensor(metrics["test"][0]["loss"]))
