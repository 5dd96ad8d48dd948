"""`zoo import` / `zoo export`: other projects' zoo layouts <-> stores.

Small zoos are written here as those projects write them (torch.save of their modules' state dicts,
their JSON and folder shapes); their networks are re-implemented from their code (DWSNets
``nn/inr.py``, nfn ``experiments/siren_utils.py``) to check that an imported SIREN renders the image
the source network renders.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from torch import nn

import cli
from zoo.exchange import export_zoo, import_zoo
from zoo.exchange.common import LayoutError
from zoo.store import WeightStore, verify_store


# --------------------------------------------------------------------------- their networks
class DWSNetsSiren(nn.Module):
    """DWSNets ``nn/inr.py`` ``Siren``: its own ``weight`` and ``bias``, ``sin(w0 * F.linear(x, W, b))``."""

    def __init__(self, dim_in, dim_out, w0=30.0):
        super().__init__()
        self.w0 = w0
        bound = math.sqrt(6.0 / dim_in) / w0
        self.weight = nn.Parameter(torch.empty(dim_out, dim_in).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(dim_out).uniform_(-0.5, 0.5))  # theirs starts at 0; fitted ones differ

    def forward(self, x):
        return torch.sin(self.w0 * F.linear(x, self.weight, self.bias))


class DWSNetsINR(nn.Module):
    """DWSNets ``nn/inr.py`` ``INR`` (no positional encoding): ``seq`` of Sirens and a Linear, ``+ 0.5``."""

    def __init__(self, in_dim=2, n_layers=3, up_scale=16, out_channels=1):
        super().__init__()
        hidden = in_dim * up_scale
        layers = [DWSNetsSiren(in_dim, hidden)] + [DWSNetsSiren(hidden, hidden) for _ in range(n_layers - 2)]
        self.seq = nn.Sequential(*layers, nn.Linear(hidden, out_channels))

    def forward(self, x):
        return self.seq(x) + 0.5


def dwsnets_coordinates(shape):
    """DWSNets ``experiments/utils.py`` ``make_coordinates`` (batch of one dropped): np.meshgrid, 'xy'."""
    x, y = np.meshgrid(np.linspace(-1, 1, shape[0]), np.linspace(-1, 1, shape[1]))
    return torch.from_numpy(np.stack([x.flatten(), y.flatten()]).T).float()


def dwsnets_image(state_dict, size=28):
    """``INRImageDataset.__getitem__``'s rendering of a state dict: ``[C, H, W]``."""
    widths = [state_dict["seq.0.weight"].shape[1]] + [v.shape[0] for k, v in state_dict.items() if "bias" in k]
    inr = DWSNetsINR(n_layers=len(widths) - 1, up_scale=widths[1] // widths[0], out_channels=widths[-1])
    inr.load_state_dict(state_dict)
    with torch.no_grad():
        return inr(dwsnets_coordinates((size, size))).view(size, size, -1).permute(2, 0, 1)


class NFNSineLayer(nn.Module):
    """nfn ``siren_utils.SineLayer``: ``sin(omega_0 * self.linear(x))``."""

    def __init__(self, d_in, d_out, omega_0=30.0):
        super().__init__()
        self.omega_0, self.linear = omega_0, nn.Linear(d_in, d_out)

    def forward(self, x):
        return torch.sin(self.omega_0 * self.linear(x))


class NFNSiren(nn.Module):
    """nfn ``siren_utils.Siren(outermost_linear=True)``: ``net`` of SineLayers and a Linear; no offset."""

    def __init__(self, in_features=2, hidden_features=32, hidden_layers=1, out_features=1):
        super().__init__()
        layers = [NFNSineLayer(in_features, hidden_features)]
        layers += [NFNSineLayer(hidden_features, hidden_features) for _ in range(hidden_layers)]
        self.net = nn.Sequential(*layers, nn.Linear(hidden_features, out_features))

    def forward(self, coords):
        return self.net(coords), coords


def nfn_image(state_dict, size=28, channels=1):
    """``get_batch_siren``'s rendering: ``get_mgrid`` ('ij' meshgrid), values as ``[H, W, C]``, -> ``[C, H, W]``."""
    siren = NFNSiren(hidden_layers=sum(k.endswith("linear.weight") for k in state_dict) - 1, out_features=channels)
    siren.load_state_dict(state_dict)
    grid = torch.stack(torch.meshgrid(*[torch.linspace(-1, 1, size)] * 2, indexing="ij"), dim=-1).reshape(-1, 2)
    with torch.no_grad():
        return siren(grid)[0].reshape(size, size, channels).permute(2, 0, 1)


def nfn_siren_dataset(data_path, prefix, split_points, split):
    """nfn ``SirenDataset(data_path, prefix, split, split_points)`` items, ``state_dict_to_tensors``
    flattened: ``[([W1, b1, ...], label), ...]``."""
    idx_to_path, idx_to_label = {}, {}
    for path in glob.glob(os.path.join(data_path, f"{prefix}_*/*.pth")):
        idx = int(re.search(r"net(\d+)\.pth", path).group(1))
        idx_to_path[idx], idx_to_label[idx] = path, int(re.search(r"_(\d)s", path).group(1))
    val, test = split_points
    idcs = {"train": range(val), "val": range(val, test), "test": range(test, len(idx_to_path))}[split]
    return [(list(torch.load(idx_to_path[i]).values()), idx_to_label[i]) for i in idcs]


def rendered(store: WeightStore, index: int) -> torch.Tensor:
    """The store's own rendering of network ``index`` (``zoo show``'s decode): ``[C, H, W]``."""
    from zoo.inspect.inrs import decode

    h, w, c = store.manifest["source"]["image_shape"]
    return torch.from_numpy(decode(store, [index])[0]).reshape(h, w, c).permute(2, 0, 1)


# --------------------------------------------------------------------------- their layouts
def write_dwsnets_zoo(root: Path, counts=(6, 2, 3), n_layers=3, seed=0) -> Path:
    """MNIST-style DWSNets INRs: ``mnist_png_{training,testing}_{label}_{k}/checkpoints/model_final.pth``
    and the splits JSON of ``generate_data_splits.py`` (absolute paths, labels as strings)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    data = {}
    k = 0
    for split, count in zip(("train", "val", "test"), counts):
        data[split] = {"path": [], "label": []}
        for _ in range(count):
            label = int(rng.integers(10))
            folder = root / f"mnist_png_{'testing' if split == 'test' else 'training'}_{label}_{k}" / "checkpoints"
            folder.mkdir(parents=True)
            torch.save(DWSNetsINR(n_layers=n_layers).state_dict(), folder / "model_final.pth")
            data[split]["path"].append((folder / "model_final.pth").as_posix())
            data[split]["label"].append(str(label))
            k += 1
    path = root / "mnist_splits.json"
    path.write_text(json.dumps(data))
    return path


def write_nfn_zoo(root: Path, n=10, hidden_layers=1, seed=0, prefix="randinit_smaller") -> Path:
    """``{prefix}_{label}s/net{idx}.pth`` of nfn Sirens, plus an augmentation folder their TODO excludes."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    for idx in range(n):
        folder = root / f"{prefix}_{int(rng.integers(10))}s"
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(NFNSiren(hidden_layers=hidden_layers).state_dict(), folder / f"net{idx}.pth")
    aug = root / f"{prefix}_aug0_3s"
    aug.mkdir()
    torch.save(NFNSiren(hidden_layers=hidden_layers).state_dict(), aug / "net0.pth")
    return root


def write_state_dict_zoo(root: Path, widths, n=9, seed=0) -> Path:
    """``nn.Sequential(Linear, ReLU, ...)`` state dicts and a CSV whose rows are in mixed split order."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    lines = ["path,split,accuracy,epoch,optimizer"]
    splits = ["test", "train", "val", "train", "train", "test", "train", "val", "train"][:n]
    for i in range(n):
        layers = []
        for d_in, d_out in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(d_in, d_out), nn.ReLU()]
        (root / "nets").mkdir(parents=True, exist_ok=True)
        torch.save(nn.Sequential(*layers[:-1]).state_dict(), root / "nets" / f"m{i}.pth")
        optimizer = ["sgd", "adam"][i % 2]
        lines.append(f"nets/m{i}.pth,{splits[i]},{rng.uniform():.17g},{int(rng.integers(100))},{optimizer}")
    (root / "runs.csv").write_text("\n".join(lines) + "\n")
    return root


def assert_same_store(a, b) -> None:
    """Parameters and columns equal bit for bit (same splits too)."""
    a, b = WeightStore(a), WeightStore(b)
    assert a.manifest["splits"] == b.manifest["splits"]
    assert a.manifest["parameters"] == b.manifest["parameters"]
    first, second = a.read(0, a.num_networks), b.read(0, b.num_networks)
    for name in first:
        assert first[name].tobytes() == second[name].tobytes(), name
    assert a.networks.equals(b.networks), (a.networks.to_pydict(), b.networks.to_pydict())


def run(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args])


# --------------------------------------------------------------------------- dwsnets
def test_dwsnets_import_export_import_is_identical_and_renders_their_image(tmp_path):
    splits_json = write_dwsnets_zoo(tmp_path / "src")
    result = run("import", "dwsnets", splits_json, "--out", tmp_path / "a", "--chunk-size", 4, "--dataset", "mnist")
    assert result.exit_code == 0, result.output
    store = WeightStore(tmp_path / "a")
    assert verify_store(tmp_path / "a").ok
    assert store.manifest["splits"]["val"] == {"start": 6, "count": 2, "items": 2}
    assert store.manifest["source"]["state_dict_keys"] == [f"seq.{m}.{p}" for m in range(3) for p in ("weight", "bias")]
    data = json.loads(splits_json.read_text())
    table = store.networks.to_pydict()
    assert table["label"] == [int(v) for s in ("train", "val", "test") for v in data[s]["label"]]
    assert table["source_file"][6] == Path(data["val"]["path"][0]).relative_to(tmp_path / "src").as_posix()
    for i in (0, 7, 10):  # a train, a val and a test network
        state = torch.load(tmp_path / "src" / table["source_file"][i], weights_only=True)
        assert torch.allclose(rendered(store, i), dwsnets_image(state), atol=1e-5)
    assert torch.equal(torch.from_numpy(store.read(0, 1)["W1"][0]), state_of(tmp_path / "src", table, 0)[:, [1, 0]])
    rerun = run(*store.manifest["command"][1:])  # the recorded command remakes the same store (--overwrite)
    assert rerun.exit_code == 0, rerun.output
    assert WeightStore(tmp_path / "a").manifest["content_id"] == store.manifest["content_id"]

    result = run("export", tmp_path / "a", "--layout", "dwsnets", "--out", tmp_path / "exported")
    assert result.exit_code == 0, result.output
    exported = json.loads((tmp_path / "exported" / "dwsnets_splits.json").read_text())
    assert exported["train"]["label"] == data["train"]["label"]
    for path, original in zip(exported["test"]["path"], data["test"]["path"]):  # their loader's read, unchanged
        ours, theirs = torch.load(path, weights_only=True), torch.load(original, weights_only=True)
        assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert run("import", "dwsnets", tmp_path / "exported", "--out", tmp_path / "b").exit_code == 0
    assert_same_store(tmp_path / "a", tmp_path / "b")


def state_of(root, table, i):
    return torch.load(root / table["source_file"][i], weights_only=True)["seq.0.weight"]


# --------------------------------------------------------------------------- nfn
def test_nfn_import_export_import_is_identical_and_renders_their_image(tmp_path):
    src = write_nfn_zoo(tmp_path / "src", n=10)
    import_zoo("nfn-siren", src, tmp_path / "a", split_points=(6, 8), chunk_size=3, progress=False)
    store = WeightStore(tmp_path / "a")
    assert verify_store(tmp_path / "a").ok
    assert {s: v["count"] for s, v in store.manifest["splits"].items()} == {"train": 6, "val": 2, "test": 2}
    table = store.networks.to_pydict()
    assert [Path(p).name for p in table["source_file"]] == [f"net{i}.pth" for i in range(10)]  # aug folder left out
    assert table["label"] == [int(Path(p).parent.name.split("_")[-1][:-1]) for p in table["source_file"]]
    assert store.manifest["architecture"]["output_offset"] == 0.0
    for i in (0, 6, 9):
        state = torch.load(src / table["source_file"][i], weights_only=True)
        assert torch.allclose(rendered(store, i), nfn_image(state), atol=1e-4)  # w0 folded differently

    export_zoo(tmp_path / "a", "nfn-siren", tmp_path / "exported", progress=False)
    assert json.loads((tmp_path / "exported" / "split_points.json").read_text()) == {
        "prefix": "randinit_smaller", "split_points": [6, 8]}
    val = nfn_siren_dataset(tmp_path / "exported", "randinit_smaller", (6, 8), "val")
    params = store.read(6, 8)
    for k, (tensors, label) in enumerate(val):  # their loader's view of our export is the store's
        assert label == table["label"][6 + k]
        assert all(np.array_equal(t.numpy(), params[name][k]) for t, name in zip(tensors, params))
    import_zoo("nfn-siren", tmp_path / "exported", tmp_path / "b", progress=False)  # split points read back
    assert_same_store(tmp_path / "a", tmp_path / "b")


def test_an_nfn_zoo_exported_as_dwsnets_renders_the_same_images(tmp_path):
    """Across layouts the conventions differ (input order, the +0.5 offset): the export converts them."""
    src = write_nfn_zoo(tmp_path / "src", n=4, hidden_layers=2)
    import_zoo("nfn-siren", src, tmp_path / "store", split_points=(2, 3), progress=False)
    export_zoo(tmp_path / "store", "dwsnets", tmp_path / "dws", progress=False)
    exported = json.loads((tmp_path / "dws" / "dwsnets_splits.json").read_text())
    table = WeightStore(tmp_path / "store").networks.to_pydict()
    for i, path in enumerate(exported["train"]["path"] + exported["val"]["path"] + exported["test"]["path"]):
        theirs = torch.load(src / table["source_file"][i], weights_only=True)
        ours = dwsnets_image(torch.load(path, weights_only=True))
        assert torch.allclose(ours, nfn_image(theirs), atol=1e-3)  # 3 sine layers of float rounding; transposed: ~1


# --------------------------------------------------------------------------- state dicts and parquet
@pytest.mark.parametrize("seed", [0, 1])
def test_state_dicts_round_trip_on_random_architectures(tmp_path, seed):
    rng = np.random.default_rng(seed)
    widths = [int(v) for v in rng.integers(1, 9, size=int(rng.integers(2, 5)))]
    src = write_state_dict_zoo(tmp_path / "src", widths, seed=seed)
    import_zoo("state-dicts", src, tmp_path / "a", chunk_size=2, progress=False)
    store = WeightStore(tmp_path / "a")
    assert store.widths == tuple(widths)
    table = store.networks.to_pydict()
    assert table["split"] == ["train"] * 5 + ["val"] * 2 + ["test"] * 2
    assert table["source_file"][:2] == ["nets/m1.pth", "nets/m3.pth"]  # CSV order within a split
    assert set(table) == {"index", "split", "accuracy", "epoch", "optimizer", "source_file"}
    state = torch.load(src / "nets" / "m1.pth", weights_only=True)
    assert np.array_equal(store.read(0, 1)[f"W{len(widths) - 1}"][0], state[f"{2 * (len(widths) - 2)}.weight"].numpy())

    export_zoo(tmp_path / "a", "state-dicts", tmp_path / "exported", progress=False)
    import_zoo("state-dicts", tmp_path / "exported", tmp_path / "b", progress=False)
    assert_same_store(tmp_path / "a", tmp_path / "b")


def test_parquet_export_is_one_row_per_network_with_its_columns_and_parameters(tmp_path):
    src = write_state_dict_zoo(tmp_path / "src", [3, 5, 2])
    import_zoo("state-dicts", src, tmp_path / "store", chunk_size=2, progress=False)
    export_zoo(tmp_path / "store", "parquet", tmp_path / "pq", progress=False)
    store = WeightStore(tmp_path / "store")
    assert sorted(p.name for p in (tmp_path / "pq").iterdir()) == ["test.parquet", "train.parquet", "val.parquet"]
    parts = [pq.read_table(tmp_path / "pq" / f"{s}.parquet") for s in ("train", "val", "test")]
    meta = json.loads(parts[0].schema.metadata[b"weightzoo"])
    frame = __import__("pandas").concat([p.to_pandas() for p in parts], ignore_index=True)
    assert list(frame["index"]) == list(range(9))
    params = store.read(0, 9)
    for name, shape in meta["parameters"].items():
        assert np.array_equal(np.stack([np.asarray(v).reshape(shape) for v in frame[name]]), params[name])
    for column in store.networks.column_names:
        assert frame[column].tolist() == store.networks.column(column).to_pylist()


# --------------------------------------------------------------------------- refusals
def one_line_error(result, named: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], result.output
    return lines[0]


def assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.partial")]


def test_malformed_dwsnets_sources_are_refused_in_one_line_and_write_nothing(tmp_path):
    splits_json = write_dwsnets_zoo(tmp_path / "src", counts=(3, 1, 2))
    data = json.loads(splits_json.read_text())
    out = tmp_path / "out"

    def attempt(changed: dict, name="bad_splits.json"):
        path = tmp_path / "src" / name
        path.write_text(json.dumps(changed))
        return run("import", "dwsnets", path, "--out", out, "--chunk-size", 1)

    missing = json.loads(json.dumps(data))
    missing["test"]["path"][1] = str(tmp_path / "src" / "gone.pth")
    one_line_error(attempt(missing), "gone.pth")
    assert_nothing_written(out)

    no_label = json.loads(json.dumps(data))
    no_label["val"]["label"] = []
    assert "label" in one_line_error(attempt(no_label), "bad_splits.json")
    assert_nothing_written(out)

    wider = tmp_path / "src" / "wider.pth"  # a 2 -> 48 -> 48 -> 1 INR among 2 -> 32 -> 32 -> 1 ones
    torch.save(DWSNetsINR(up_scale=24).state_dict(), wider)
    mixed = json.loads(json.dumps(data))
    mixed["test"]["path"][1] = str(wider)  # the last network: chunks before it are written, then removed
    assert "one architecture" in one_line_error(attempt(mixed), "wider.pth")
    assert_nothing_written(out)

    bad_shape = tmp_path / "src" / "bad_shape.pth"
    state = DWSNetsINR().state_dict()
    state["seq.1.bias"] = torch.zeros(7)
    torch.save(state, bad_shape)
    mixed["test"]["path"][1] = str(bad_shape)
    one_line_error(attempt(mixed), "bad_shape.pth")
    assert_nothing_written(out)

    diverged = tmp_path / "src" / "nan.pth"
    state = DWSNetsINR().state_dict()
    state["seq.2.weight"][0, 3] = float("nan")
    torch.save(state, diverged)
    mixed["test"]["path"][1] = str(diverged)
    assert "NaN" in one_line_error(attempt(mixed), "nan.pth")
    assert_nothing_written(out)


def test_malformed_nfn_and_state_dict_sources_are_refused(tmp_path):
    src = write_nfn_zoo(tmp_path / "nfn", n=5)
    (next(src.glob("randinit_smaller_[0-9]s/net3.pth"))).unlink()
    with pytest.raises(LayoutError, match="net3.pth is missing"):
        import_zoo("nfn-siren", src, tmp_path / "out", split_points=(2, 3), progress=False)
    sd = write_state_dict_zoo(tmp_path / "sd", [2, 3, 1], n=3)
    state = torch.load(sd / "nets" / "m2.pth", weights_only=True)
    state["1.running_mean"] = torch.zeros(3)
    torch.save(state, sd / "nets" / "m2.pth")
    with pytest.raises(LayoutError, match="m2.pth: key '1.running_mean'"):
        import_zoo("state-dicts", sd, tmp_path / "out", chunk_size=1, progress=False)
    assert_nothing_written(tmp_path / "out")


class PlantedCode:
    """Unpickling this calls ``open(marker, "w")``: code run by merely loading the file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.mark.parametrize("how", ["torch.save", "pickle.dump"])
def test_a_pth_that_would_run_code_is_refused_without_running_it(tmp_path, how):
    splits_json = write_dwsnets_zoo(tmp_path / "src", counts=(2, 0, 1))
    data = json.loads(splits_json.read_text())
    marker, evil = tmp_path / "marker", Path(data["train"]["path"][1])
    state = {**torch.load(evil, weights_only=True), "payload": PlantedCode(marker)}
    if how == "torch.save":
        torch.save(state, evil)
    else:
        with open(evil, "wb") as f:
            pickle.dump(state, f, protocol=2)
    with contextlib.suppress(RuntimeError):  # a bare pickle is read as torch's legacy header: run, then refused
        torch.load(evil, weights_only=False)  # the plant is real: a trusting load runs it
    assert marker.exists()
    marker.unlink()

    line = one_line_error(run("import", "dwsnets", splits_json, "--out", tmp_path / "out"), str(evil))
    assert "weights_only" in line
    assert not marker.exists()
    assert_nothing_written(tmp_path / "out")


def test_export_refuses_a_non_empty_folder_and_never_leaves_half_a_layout(tmp_path):
    src = write_nfn_zoo(tmp_path / "src", n=4)
    import_zoo("nfn-siren", src, tmp_path / "store", split_points=(2, 3), progress=False)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    one_line_error(run("export", tmp_path / "store", "--layout", "parquet", "--out", out), "not empty")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert run("export", tmp_path / "store", "--layout", "parquet", "--out", out, "--overwrite").exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet", "val.parquet"]

    sd = write_state_dict_zoo(tmp_path / "sd", [2, 4, 1], n=3)  # an MLP zoo is no SIREN zoo
    import_zoo("state-dicts", sd, tmp_path / "mlps", progress=False)
    one_line_error(run("export", tmp_path / "mlps", "--layout", "nfn-siren", "--out", tmp_path / "x"), "SIREN")
    assert_nothing_written(tmp_path / "x")

    def failing_save(*args, **kwargs):  # a disk that fills up after the first network
        if failing_save.calls:
            raise OSError(28, "No space left on device")
        failing_save.calls += 1
        return original(*args, **kwargs)

    failing_save.calls, original = 0, torch.save
    torch.save = failing_save
    try:
        with pytest.raises(OSError):
            export_zoo(tmp_path / "store", "dwsnets", tmp_path / "half", progress=False)
    finally:
        torch.save = original
    assert_nothing_written(tmp_path / "half")
    assert os.listdir(tmp_path / "store")  # the store itself untouched


def test_info_and_show_describe_an_imported_zoo(tmp_path):
    """An imported zoo has no fitting record (PSNR, steps, views): `zoo info` says where it came
    from instead, and `zoo show` draws its INRs without source images."""
    splits_json = write_dwsnets_zoo(tmp_path / "src")
    assert run("import", "dwsnets", splits_json, "--out", tmp_path / "a").exit_code == 0
    info = run("info", tmp_path / "a")
    assert info.exit_code == 0, info.output
    assert "imported from the dwsnets layout" in info.output and "psnr" not in info.output
    shown = run("show", tmp_path / "a", "--out", tmp_path / "grid.png", "--count", 3)
    assert shown.exit_code == 0, shown.output
    assert (tmp_path / "grid.png").stat().st_size > 0 and "drawing the INRs alone" in shown.output
    card = (tmp_path / "a" / "README.md").read_text()
    assert "remakes the store" in card and "resumes or repairs" not in card


def test_info_summarizes_an_imported_mlp_zoo_and_show_refuses_it_in_one_line(tmp_path):
    """Imported state dicts (family ``mlp``) are neither INRs nor classifier zoos: `zoo info` gives their
    architecture and their numeric columns (it once failed on a SIREN key, `w0_per_layer`)."""
    src = write_state_dict_zoo(tmp_path / "src", [3, 5, 2])
    assert run("import", "state-dicts", src, "--activation", "tanh", "--out", tmp_path / "a").exit_code == 0
    info = run("info", tmp_path / "a")
    assert info.exit_code == 0, info.output
    assert "3 -> 5 -> 2  MLP, activation tanh" in info.output and "imported from the state-dicts layout" in info.output
    accuracy = WeightStore(tmp_path / "a").networks.column("accuracy").to_numpy()
    assert f"accuracy   p5 {np.percentile(accuracy, 5):.4f}" in info.output and "epoch      p5" in info.output
    assert "optimizer" not in info.output  # not a number
    trained = run("train", tmp_path / "a", "--model", "mlp", "--task", "regress", "--target", "accuracy", "--epochs", 1,
                  "--lr", "1e-3", "--batch-size", 4, "--out", tmp_path / "run")
    assert trained.exit_code == 0, trained.output  # its 2 val networks: the hint names where its splits come from
    assert "give a choice worth making (the CSV's split column)" in trained.output
    shown = run("show", tmp_path / "a", "--out", tmp_path / "x.png")
    assert shown.exit_code == 2 and "zoo of imported MLPs" in shown.output and "Traceback" not in shown.output
    assert not (tmp_path / "x.png").exists()
    card = (tmp_path / "a" / "README.md").read_text()  # its lab's first numeric column, not an INR's PSNR
    assert "| split | networks (index range) | accuracy |" in card and "PSNR" not in card
    assert f"| all | 9 | p5 {np.percentile(accuracy, 5):.4f}" in card
    assert "is not recorded (an imported zoo: `zoo import --dataset NAME`" in card and "`None`" not in card
    assert "INR-zoo setup" not in card


def test_state_dicts_take_their_activation_from_the_option_or_a_column_and_keep_it_in_a_round_trip(tmp_path):
    import pyarrow.csv as pcsv

    from dws.scalegmn.symmetry import symmetry_of
    from zoo.exchange.state_dicts import PER_NETWORK, UNRECORDED

    src = write_state_dict_zoo(tmp_path / "src", [3, 5, 2])
    import_zoo("state-dicts", src, tmp_path / "unnamed", progress=False)
    assert WeightStore(tmp_path / "unnamed").manifest["architecture"]["activation"] == UNRECORDED
    result = run("import", "state-dicts", src, "--activation", "relu", "--out", tmp_path / "a")
    assert result.exit_code == 0, result.output
    store = WeightStore(tmp_path / "a")
    assert store.manifest["architecture"]["activation"] == "relu" and symmetry_of("relu") == "scale"
    assert "--activation" in store.manifest["command"]
    export_zoo(tmp_path / "a", "state-dicts", tmp_path / "exported", progress=False)
    assert set(pcsv.read_csv(tmp_path / "exported" / "networks.csv").column("activation").to_pylist()) == {"relu"}
    import_zoo("state-dicts", tmp_path / "exported", tmp_path / "b", progress=False)  # from the column
    assert_same_store(tmp_path / "a", tmp_path / "b")
    assert WeightStore(tmp_path / "b").manifest["architecture"]["activation"] == "relu"

    lines = (src / "runs.csv").read_text().splitlines()
    mixed = [lines[0] + ",activation"] + [f"{line},{'tanh' if i % 3 else 'relu'}" for i, line in enumerate(lines[1:])]
    (src / "runs.csv").write_text("\n".join(mixed) + "\n")
    import_zoo("state-dicts", src, tmp_path / "mixed", progress=False)
    mixed_store = WeightStore(tmp_path / "mixed")
    assert mixed_store.manifest["architecture"]["activation"] == PER_NETWORK
    assert set(mixed_store.networks.column("activation").to_pylist()) == {"relu", "tanh"}
    with pytest.raises(LayoutError, match="leave one out"):
        import_zoo("state-dicts", src, tmp_path / "both", activation="relu", progress=False)
    (src / "runs.csv").write_text("\n".join(mixed).replace("tanh", "swish") + "\n")
    with pytest.raises(LayoutError, match="'swish', not one of relu"):
        import_zoo("state-dicts", src, tmp_path / "unknown", progress=False)
    for layout, activation in (("state-dicts", "sine"), ("dwsnets", "relu")):
        with pytest.raises(LayoutError, match="SIRENs|record theirs"):
            import_zoo(layout, src, tmp_path / f"refused-{layout}", activation=activation, progress=False)
    assert not any((tmp_path / name).exists() for name in ("both", "unknown", "refused-state-dicts", "refused-dwsnets"))


def test_a_classifier_zoo_through_state_dicts_keeps_its_networks_columns_values_and_activation(mnist_classifier_zoo,
                                                                                              tmp_path):
    """Its float32 and whole-valued real columns come back as the same values (they once came back rounded to
    float64 and as integers), its activation in the manifest; only what the layout has no place for differs."""
    from zoo.store.compare_values import compare_values

    export_zoo(mnist_classifier_zoo, "state-dicts", tmp_path / "exported", progress=False)
    import_zoo("state-dicts", tmp_path / "exported", tmp_path / "back", chunk_size=7, progress=False)
    original = WeightStore(mnist_classifier_zoo)
    assert original.networks.schema.field("test_accuracy").type == "float"  # float32
    found = compare_values(mnist_classifier_zoo, tmp_path / "back")
    assert not found.differing and not found.statistics_differ
    assert found.columns_differ == ["classes"]  # a list, as JSON text
    assert found.columns_only_a == ["activation"] and found.columns_only_b == ["source_file"]
    assert WeightStore(tmp_path / "back").manifest["architecture"]["activation"] == "relu"


def test_a_parquet_export_imports_back_as_the_same_networks(tiny_store, mnist_classifier_zoo, tmp_path):
    """``zoo import parquet`` of what ``zoo export --layout parquet`` wrote: at the same chunk size every
    parameter and statistics file is the same file; at another the same values (an INR and a classifier zoo)."""
    from zoo.store.compare import compare, store_side
    from zoo.store.compare_values import compare_values

    assert run("export", tiny_store, "--layout", "parquet", "--out", tmp_path / "pq").exit_code == 0
    chunk = WeightStore(tiny_store).chunk_size
    result = run("import", "parquet", tmp_path / "pq", "--out", tmp_path / "back", "--chunk-size", chunk)
    assert result.exit_code == 0, result.output
    back = WeightStore(tmp_path / "back")
    assert verify_store(tmp_path / "back").ok
    assert back.manifest["kind"] == "imported-parquet" and "of a mnist-inr store" in back.manifest["description"]
    assert back.manifest["source"]["exported_content_id"] == WeightStore(tiny_store).manifest["content_id"]
    by_file = compare(store_side(tiny_store), store_side(tmp_path / "back"))
    assert not any(by_file.differ[p] or by_file.only_a[p] or by_file.only_b[p] for p in ("parameters", "statistics"))
    assert compare_values(tiny_store, tmp_path / "back").same_networks

    export_zoo(mnist_classifier_zoo, "parquet", tmp_path / "clf-pq", progress=False)
    import_zoo("parquet", tmp_path / "clf-pq", tmp_path / "clf-back", chunk_size=7, progress=False)  # blocks span files
    found = compare_values(mnist_classifier_zoo, tmp_path / "clf-back")
    assert found.same_networks and not found.columns_differ and found.provenance == [
        "kind mnist-classifiers vs imported-parquet"]
    info = run("info", tmp_path / "clf-back")  # no training record: summarized as imported MLPs
    assert info.exit_code == 0 and "test_accuracy p5" in info.output, info.output
    shown = run("show", tmp_path / "clf-back", "--out", tmp_path / "x.png")
    assert shown.exit_code == 2 and "zoo of imported MLPs (family 'mlp-classifier')" in shown.output
    from dws.tasks.domain import store_images
    from zoo.store import StoreError

    with pytest.raises(StoreError, match="records no data set or input normalization"):
        store_images(WeightStore(tmp_path / "clf-back"))


def test_a_parquet_folder_that_is_not_an_export_is_refused_and_leaves_nothing(tiny_store, tmp_path):
    import pyarrow as pa

    export_zoo(tiny_store, "parquet", tmp_path / "pq", progress=False)
    cases = {}
    cases["no-train"] = shutil.copytree(tmp_path / "pq", tmp_path / "no-train")
    (cases["no-train"] / "train.parquet").unlink()
    cases["plain"] = tmp_path / "plain"
    cases["plain"].mkdir()
    pq.write_table(pa.table({"W1": [[1.0, 2.0]]}), cases["plain"] / "train.parquet")
    cases["empty-cell"] = shutil.copytree(tmp_path / "pq", tmp_path / "empty-cell")
    table = pq.read_table(cases["empty-cell"] / "val.parquet")
    w2 = table.column("W2").to_pylist()
    w2[1] = None
    column = pa.array(w2, table.schema.field("W2").type)
    pq.write_table(table.set_column(table.column_names.index("W2"), "W2", column), cases["empty-cell"] / "val.parquet")
    why = {"no-train": "no train.parquet", "plain": "no weightzoo metadata", "empty-cell": "column W2 is not"}
    for name, src in cases.items():
        result = run("import", "parquet", src, "--out", tmp_path / f"out-{name}")
        assert result.exit_code == 2 and why[name] in result.output and "Traceback" not in result.output, result.output
        assert not (tmp_path / f"out-{name}").exists() or not any((tmp_path / f"out-{name}").iterdir())


def test_an_older_parquet_export_without_kind_and_targets_imports_with_label_as_its_target(tiny_store, tmp_path):
    import json as json_

    import pyarrow as pa

    from zoo.exchange.parquet import METADATA_KEY

    export_zoo(tiny_store, "parquet", tmp_path / "pq", progress=False)
    for path in (tmp_path / "pq").glob("*.parquet"):  # the metadata exports wrote until 2026-12-07
        table = pq.read_table(path)
        meta = json_.loads(table.schema.metadata[METADATA_KEY])
        older = {k: v for k, v in meta.items() if k not in ("kind", "targets")}
        pq.write_table(table.replace_schema_metadata({METADATA_KEY: json_.dumps(older).encode()}), path)
        assert pa.types.is_fixed_size_list(pq.read_schema(path).field("W1").type)
    import_zoo("parquet", tmp_path / "pq", tmp_path / "back", progress=False)
    back = WeightStore(tmp_path / "back")
    assert back.manifest["targets"] == ["label"] and back.manifest["description"].endswith("(pq)")
