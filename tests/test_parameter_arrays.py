"""The one conversion between a store's parameter arrays and per-layer values (zoo/store/format.py),
and the WeightSpace built on it (dws/stream/batch.py)."""

import numpy as np
import pytest
import torch

from dws.stream.batch import arrays_from_weightspace, weightspace_from_arrays
from dws.weightspace import WeightSpace
from zoo.store import StoreError, parameter_shapes
from zoo.store.format import arrays_from_layers, layers_from_arrays


@pytest.mark.parametrize("widths", [(2, 32, 32, 1), (1, 8, 1), (5, 3)])
def test_arrays_and_layers_round_trip_in_storage_order(widths):
    rng = np.random.default_rng(len(widths))
    arrays = {name: rng.standard_normal((4, *shape)).astype(np.float32)
              for name, shape in parameter_shapes(widths).items()}
    weights, biases = layers_from_arrays(dict(reversed(arrays.items())))  # any order in
    assert [w.shape[1:] for w in weights] == [(o, i) for i, o in zip(widths[:-1], widths[1:])]
    again = arrays_from_layers(weights, biases)
    assert list(again) == list(parameter_shapes(widths))  # storage order out
    assert all(again[k] is arrays[k] for k in arrays)

    ws = weightspace_from_arrays(arrays)
    assert ws.widths == tuple(widths) and ws.batch_size == 4
    back = arrays_from_weightspace(ws)
    assert all(np.array_equal(back[k], arrays[k]) for k in arrays)


@pytest.mark.parametrize("names", [["W1", "b1", "W2"], ["W1", "b2"], ["W1", "b1", "W3", "b3"], []])
def test_names_that_are_not_a_network_are_refused(names):
    with pytest.raises(StoreError, match="W1, b1, ..., WM, bM"):
        layers_from_arrays({n: np.zeros(1) for n in names})


def test_a_weightspace_with_channels_is_not_written():
    ws = WeightSpace((torch.zeros(2, 3, 4, 1),), (torch.zeros(2, 3, 1),))
    with pytest.raises(ValueError, match="channel"):
        arrays_from_weightspace(ws)
