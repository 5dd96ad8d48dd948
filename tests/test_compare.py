"""``zoo checksums`` / ``zoo compare``: which parts of two zoos differ, from their checksums alone."""

import json
import shutil
from pathlib import Path

import numpy as np
import zarr
from click.testing import CliRunner

import cli
from zoo.store.compare import compare, part_of, record_side, store_side
from zoo.store.manifest import read_manifest

SESSION_23_RECORD = (Path(__file__).resolve().parents[1] / "docs/recorded/weight-models/full/zoo-checksums"
                     / "mnist-1e33f7aa70f27b6e.json")


def _copy(store, tmp_path, name="copy"):
    out = tmp_path / name
    shutil.copytree(store, out)
    return out


def _bump(array, index):
    """Rewrite one value of a zarr array by a small amount (its chunk's crc32c changes with it)."""
    values = array[index]
    array[index] = np.nextafter(values, np.float32(np.inf)).astype(values.dtype)


def test_a_copy_compares_identical(tiny_store, tmp_path):
    copy = _copy(tiny_store, tmp_path)
    result = CliRunner().invoke(cli.main, ["compare", str(tiny_store), str(copy)])
    assert result.exit_code == 0, result.output
    assert "identical" in result.output and "differ" not in result.output
    assert read_manifest(tiny_store)["content_id"] in result.output


def test_one_changed_weight_names_its_chunk_and_part(tiny_store, tmp_path):
    copy = _copy(tiny_store, tmp_path)
    _bump(zarr.open_group(str(copy / "arrays"), mode="r+")["W2"], (37, 3, 5))  # chunk 2 (16 networks each)
    found = compare(store_side(tiny_store), store_side(copy))
    assert found.differing_parts() == ["parameters"]
    assert found.differ["parameters"] == ["arrays/W2/c/2/0/0"]
    result = CliRunner().invoke(cli.main, ["compare", str(tiny_store), str(copy)])
    assert result.exit_code == 1
    assert "chunks that differ: 2 (of 4)" in result.output and "the networks differ" in result.output


def test_statistics_alone_differing_says_the_networks_are_equal(tiny_store, tmp_path):
    copy = _copy(tiny_store, tmp_path)
    _bump(zarr.open_group(str(copy / "arrays"), mode="r+")["stats/b1_std"], (4,))
    found = compare(store_side(tiny_store), store_side(copy))
    assert found.differing_parts() == ["statistics"] and not found.identical
    assert "the networks are equal" in found.summary()


def test_a_record_stands_in_for_a_store_that_is_gone(tiny_store, tmp_path):
    copy = _copy(tiny_store, tmp_path)
    result = CliRunner().invoke(cli.main, ["checksums", str(copy)])
    assert result.exit_code == 0, result.output
    saved = tmp_path / "record.json"
    saved.write_text(result.output)
    data = json.loads(result.output)
    assert data["content_id"] == read_manifest(copy)["content_id"]
    assert data["machine"] == read_manifest(copy)["machine"] and data["command"][:2] == ["zoo", "generate"]
    _bump(zarr.open_group(str(copy / "arrays"), mode="r+")["b3"], (0, 0))
    assert CliRunner().invoke(cli.main, ["compare", str(tiny_store), str(saved)]).exit_code == 0
    result = CliRunner().invoke(cli.main, ["compare", str(saved), str(copy)])
    assert result.exit_code == 1 and "arrays/b3/c/0/0" in result.output


def test_the_store_records_the_machine_that_wrote_it(tiny_store):
    machine = read_manifest(tiny_store)["machine"]
    assert machine["cpu"] and isinstance(machine["cpu"], dict)
    if Path("/proc/cpuinfo").exists():
        assert "model name" in machine["cpu"] and isinstance(machine["cpu"]["flags"], list)
    assert "Written on: " in (tiny_store / "README.md").read_text()


def test_session_23s_hand_written_record_is_read():
    found = record_side(SESSION_23_RECORD)
    assert found.content_id.startswith("sha256:1e33f7aa") and len(found.entries) == 517
    assert found.made_on["cpu"]["cpu family"] == 26
    same = compare(found, record_side(SESSION_23_RECORD))
    assert same.identical and "written on AMD EPYC (family 26, model 2)" in same.summary()
    assert sorted({part_of(p) for p in found.entries}) == ["metadata", "parameters", "statistics", "table"]


def test_bad_records_are_refused_in_one_line(tiny_store, tmp_path):
    runner = CliRunner()
    not_a_record = tmp_path / "other.json"
    not_a_record.write_text('{"a": 1}')
    result = runner.invoke(cli.main, ["compare", str(tiny_store), str(not_a_record)])
    assert result.exit_code == 2 and "not a checksum record" in result.output and "zoo checksums" in result.output
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"checksum_record": 99, "entries": {}}))
    result = runner.invoke(cli.main, ["compare", str(newer), str(tiny_store)])
    assert result.exit_code == 2 and "newer" in result.output
    broken = tmp_path / "broken.json"
    broken.write_text('{"entries": ')
    assert "not a readable checksum record" in runner.invoke(cli.main, ["compare", str(broken), str(broken)]).output
    result = runner.invoke(cli.main, ["compare", str(tiny_store), str(tmp_path / "absent")])
    assert result.exit_code == 2 and "neither a store" in result.output


def test_an_unfinished_store_is_compared_on_its_finished_chunks_only(tiny_store, tmp_path):
    """Chunks not yet written (and the statistics and table that come last) are left out, not "differ"."""
    from zoo.store.manifest import write_manifest

    unfinished = _copy(tiny_store, tmp_path)
    manifest = read_manifest(unfinished)
    manifest.update(status="in_progress", complete_chunks=[0, 1])
    del manifest["content_id"]
    write_manifest(unfinished, manifest)
    for name in ("W1", "W2", "W3", "b1", "b2", "b3"):
        for chunk in (unfinished / "arrays" / name / "c").glob("[23]"):
            shutil.rmtree(chunk)
    shutil.rmtree(unfinished / "arrays" / "stats")
    found = compare(store_side(unfinished), store_side(tiny_store))
    assert found.identical and found.not_compared > 0
    assert len(found.equal["parameters"]) == 2 * 6 and not found.equal["statistics"]
    assert "equal so far" in found.summary() and "only its 2 finished chunk(s)" in found.summary()
    _bump(zarr.open_group(str(unfinished / "arrays"), mode="r+")["W1"], (20, 0, 1))  # chunk 1: finished
    assert compare(store_side(unfinished), store_side(tiny_store)).differ["parameters"] == ["arrays/W1/c/1/0/0"]


def test_the_networks_id_follows_what_training_reads_and_nothing_else(tiny_store, tmp_path):
    """Another final MSE and PSNR (another machine's BLAS) leave the networks ID as it is and change the content
    ID; another label or weight changes both; an unfinished store has none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from generate_helpers import replace_networks_table
    from zoo.store.identity import networks_id

    def ids(root):
        manifest = read_manifest(root)
        return manifest["content_id"], networks_id(root, manifest)

    content, networks = ids(tiny_store)
    assert networks.startswith("networks-sha256:") and ids(_copy(tiny_store, tmp_path, "same")) == (content, networks)
    table = pq.read_table(tiny_store / "networks.parquet")
    diagnostics = _copy(tiny_store, tmp_path, "diagnostics")
    for column in ("mse", "psnr"):
        values = table.column(column).to_numpy()
        table = table.set_column(table.column_names.index(column), column,
                                 pa.array(np.nextafter(values, np.inf).astype(values.dtype)))
    replace_networks_table(diagnostics, table)
    assert ids(diagnostics)[0] != content and ids(diagnostics)[1] == networks

    labels = table.column("label").to_numpy().copy()
    labels[3] = (labels[3] + 1) % 10
    relabelled = _copy(tiny_store, tmp_path, "relabelled")
    replace_networks_table(relabelled, table.set_column(table.column_names.index("label"), "label", pa.array(labels)))
    assert ids(relabelled)[1] != networks

    weights = _copy(tiny_store, tmp_path, "weights")
    _bump(zarr.open_group(str(weights / "arrays"), mode="r+")["b2"], (59, 7))
    assert networks_id(weights, read_manifest(weights)) != networks
    manifest = {**read_manifest(tiny_store), "status": "in_progress"}
    assert networks_id(tiny_store, manifest) is None


def test_compare_names_the_table_columns_that_differ(tiny_store, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from generate_helpers import replace_networks_table

    record = tmp_path / "record.json"
    record.write_text(CliRunner().invoke(cli.main, ["checksums", str(tiny_store)]).output)
    other = _copy(tiny_store, tmp_path)
    table = pq.read_table(other / "networks.parquet")
    psnr = table.column("psnr").to_numpy()
    replace_networks_table(other, table.set_column(table.column_names.index("psnr"), "psnr", pa.array(psnr + 1)))
    for a in (tiny_store, record):
        result = CliRunner().invoke(cli.main, ["compare", str(a), str(other)])
        assert result.exit_code == 1
        assert "columns that differ: psnr" in result.output and "different: table (the networks are equal)" \
            in result.output
        assert "networks ID: equal" in result.output


def test_a_carried_cells_zoo_record_is_kept_and_completed(tiny_store, tmp_path):
    """pipelines.carried.record_zoo: written once; a record of the same zoo from before networks IDs (session
    23's, by hand, its CPU at the top level) gains them and this machine's CPU; another zoo's is refused."""
    import pytest

    from pipelines.carried import CarriedError, record_zoo

    path = record_zoo(tiny_store, tmp_path, "smoke", "mnist")
    first = json.loads(path.read_text())
    assert record_side(path).content_id == read_manifest(tiny_store)["content_id"]
    assert record_zoo(tiny_store, tmp_path, "smoke", "mnist") is None  # nothing to add
    older = {k: first[k] for k in ("content_id", "command", "software", "entries")}
    older["cpu"] = {"model name": "Some Xeon", "cpu family": 6, "model": 143}
    path.write_text(json.dumps(older))
    assert record_zoo(tiny_store, tmp_path, "smoke", "mnist") == path
    again = json.loads(path.read_text())
    assert again["networks_id"] == first["networks_id"] and again["columns"] == first["columns"]
    assert again["machines"] == [older["cpu"], first["machine"]["cpu"]] and again["cpu"] == older["cpu"]
    path.write_text(json.dumps({**older, "content_id": "sha256:" + "0" * 64}))
    with pytest.raises(CarriedError, match="records another zoo"):
        record_zoo(tiny_store, tmp_path, "smoke", "mnist")
