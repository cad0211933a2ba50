"""Your own data (issue 16, items 2 and 4; docs/own-data.md): ``dataset=local`` reads
CSV/TSV/JSON Lines/Parquet, a dataset file in your own ``--config-dir`` runs through the
real console script, every bad file fails in one line naming the file, the problem and
the fix, and a train run's ``metrics.json`` is strict JSON."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import torch
from sklearn.model_selection import train_test_split

from saleval.crowd.export.formats import instructions
from saleval.modeling.data import load_dataset
from saleval.modeling.data_checks import DataError
from saleval.modeling.models import build_model, load_trained
from saleval.pipeline import tables
from saleval.pipeline.records.jsonfiles import write_json
from tests.conftest import compose_config

BIN = Path(sys.executable).parent  # the venv's console scripts sit next to its python


def reviews(n: int = 40) -> pd.DataFrame:
    """``n`` short reviews, half ``pos``, half ``neg``, with their own ids."""
    return pd.DataFrame(
        {
            "id": [f"r{i:03d}" for i in range(n)],
            "review": [f"review {i} was {'great' if i % 2 else 'dull'}" for i in range(n)],
            "sentiment": ["pos" if i % 2 else "neg" for i in range(n)],
        }
    )


def write(df: pd.DataFrame, path: Path) -> Path:
    """``df`` in the format its suffix names."""
    name = path.name
    if name.endswith((".csv", ".csv.gz")):
        df.to_csv(path, index=False)
    elif name.endswith(".tsv"):
        df.to_csv(path, sep="\t", index=False)
    elif name.endswith(".jsonl"):
        df.to_json(path, orient="records", lines=True)
    elif name.endswith(".parquet"):
        df.to_parquet(path, index=False)
    else:
        path.write_text(df.to_csv(index=False))
    return path


def local(root: Path, *overrides: str) -> object:
    """The ``dataset=local`` node over files in ``root``, review/sentiment columns."""
    return compose_config(
        "train",
        [
            "dataset=local",
            f"dataset.data_root={root}",
            "dataset.text_column=review",
            "dataset.label_column=sentiment",
            *overrides,
        ],
    ).dataset


@pytest.mark.parametrize("name", ["d.csv", "d.tsv", "d.jsonl", "d.parquet", "d.csv.gz"])
def test_every_format_gives_the_same_splits(tmp_path: Path, name: str) -> None:
    write(reviews(), tmp_path / name)
    data = load_dataset(local(tmp_path, f"dataset.files.all={name}", "dataset.id_column=id"))
    assert data.label_names == ["neg", "pos"]  # found in the data, sorted
    assert [len(data[s]) for s in ("train", "validation", "test")] == [28, 4, 8]
    # the same seeded, stratified split whatever the format: scikit-learn's, seed 42
    df = reviews()
    _, test_ids = train_test_split(
        df["id"], test_size=0.2, random_state=42, stratify=df["sentiment"]
    )
    assert sorted(data["test"]["sample_id"]) == sorted(test_ids)
    want = df.set_index("id").loc[data["test"]["sample_id"]]
    assert data["test"]["text"].tolist() == want["review"].tolist()
    assert data["test"]["label"].tolist() == (want["sentiment"] == "pos").astype(int).tolist()


def test_label_names_from_config_set_the_class_order(tmp_path: Path) -> None:
    write(reviews(), tmp_path / "d.csv")
    data = load_dataset(local(tmp_path, "dataset.files.all=d.csv", "dataset.label_names=[pos,neg]"))
    texts = pd.concat(data.splits.values())
    assert data.label_names == ["pos", "neg"]
    assert set(texts[texts["text"].str.endswith("great")]["label"]) == {0}
    # class indices in the file, no names given: the indices, in numeric order
    write(reviews().assign(sentiment=[i % 2 for i in range(40)]), tmp_path / "idx.csv")
    assert load_dataset(local(tmp_path, "dataset.files.all=idx.csv")).label_names == ["0", "1"]


def test_split_files_and_a_held_out_validation(tmp_path: Path) -> None:
    df = reviews(60)
    write(df[:40], tmp_path / "train.csv")
    write(df[40:50], tmp_path / "val.jsonl")
    write(df[50:], tmp_path / "test.parquet")
    over = ["dataset.files.train=train.csv", "dataset.files.test=test.parquet"]
    three = load_dataset(local(tmp_path, *over, "dataset.files.validation=val.jsonl"))
    assert [len(three[s]) for s in ("train", "validation", "test")] == [40, 10, 10]
    assert three["test"]["text"].tolist() == df["review"][50:].tolist()  # file order kept
    two = load_dataset(local(tmp_path, *over))  # no validation file: 10% of train held out
    assert [len(two[s]) for s in ("train", "validation", "test")] == [36, 4, 10]
    assert set(two["validation"]["label"]) == {0, 1}


def _problem(
    tmp_path: Path,
    df: pd.DataFrame | None,
    name: str = "d.csv",
) -> Path:
    path = tmp_path / name
    if df is not None:
        write(df, path)
    return path


# (case, file contents, file name, extra overrides, what the message says)
ERRORS: list[tuple[str, Callable[[], pd.DataFrame | None], str, list[str], str]] = [
    ("missing", lambda: None, "d.csv", [], r"file not found; check dataset.data_root"),
    ("header only", lambda: reviews()[:0], "d.csv", [],
     r"no data rows — only a header \(id, review, sentiment\); add rows"),
    ("class of one row", lambda: reviews(41).assign(sentiment=["neg"] + ["pos"] * 40), "d.csv",
     [], r"cannot split off the test set \(20%\) stratified by label: The "
     r"least populated classes? in y ha(s|ve) only 1 member.*rows per class: neg: 1, pos: 40\. Add rows"),
    ("no text column", lambda: reviews(), "d.csv", ["dataset.text_column=body"],
     r"no column 'body' \(dataset.text_column\); the file has columns \['id', 'review', "
     r"'sentiment'\]: set dataset.text_column=<one of them>"),
    ("no label column", lambda: reviews(), "d.tsv", ["dataset.label_column=y"],
     r"no column 'y' \(dataset.label_column\); the file has columns"),
    ("unknown labels", lambda: reviews().assign(sentiment=["neg", "pos", "maybe", "pos"] * 10),
     "d.csv", ["dataset.label_names=[neg,pos]"],
     r"row 3, field sentiment: 'maybe' is not one of \['neg', 'pos'\] \(10 rows in all: "
     r"'maybe' ×10\); fix those rows or list every label in dataset.label_names"),
    ("empty texts", lambda: reviews().assign(review=lambda d: d["review"].where(d.index % 7 != 1, " ")),
     "d.csv", [], r"6 of 40 rows have an empty review \(rows 2, 9, 16, 23, 30, \.\.\.\); fill"),
    ("null texts", lambda: reviews().assign(review=lambda d: d["review"].where(d.index != 3, None)),
     "d.jsonl", [], r"1 of 40 rows has an empty review \(row 4\)"),
    ("no labels", lambda: reviews().assign(sentiment=lambda d: d["sentiment"].where(d.index != 0, "")),
     "d.csv", [], r"1 row has no sentiment \(row 1\); fill them in"),
    ("repeated ids", lambda: reviews().assign(id=["a", "b"] * 20), "d.csv",
     ["dataset.id_column=id"], r"40 rows have an empty or repeated id .*must be unique"),
    ("unknown type", lambda: reviews(), "d.txt", [], r"unknown file type '.txt'; read_local reads"),
    ("too few to subsample", lambda: reviews(), "d.csv", ["dataset.max_test=1"],
     r"dataset.max_test=1: cannot draw 1 of 8 rows stratified by label"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "make", "name", "over", "says"), ERRORS, ids=[e[0] for e in ERRORS]
)
def test_a_bad_file_fails_in_one_line_naming_it_and_the_fix(
    tmp_path: Path,
    case: str,
    make: Callable[[], pd.DataFrame | None],
    name: str,
    over: list[str],
    says: str,
) -> None:
    path = _problem(tmp_path, make(), name)
    with pytest.raises(DataError) as err:
        load_dataset(local(tmp_path, f"dataset.files.all={name}", *over))
    msg = str(err.value)
    if case != "too few to subsample":  # names the split limit, not the file
        assert msg.startswith(str(path)), msg
    assert re.search(says, msg), msg
    assert "\n" not in msg


def test_an_empty_file_and_a_mix_of_file_keys_fail_naming_them(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_bytes(b"")
    with pytest.raises(
        DataError, match=re.escape(f"{tmp_path / 'd.csv'}: the file is empty (0 bytes)")
    ):
        load_dataset(local(tmp_path, "dataset.files.all=d.csv"))
    both = ["dataset.files.all=d.csv", "dataset.files.train=t.csv"]
    with pytest.raises(DataError, match=r"gives 'all' and \['train'\]; give either one file"):
        load_dataset(local(tmp_path, *both))
    with pytest.raises(DataError, match=r"gives \['train'\]; give train and test"):
        load_dataset(local(tmp_path, "dataset.files.train=t.csv"))
    with pytest.raises(DataError, match=r"no files given; set dataset.files.all=<file>"):
        load_dataset(local(tmp_path))


def test_no_label_descriptions_still_make_instructions() -> None:
    text = instructions("mine", ["neg", "pos"], {}, {})
    assert "### neg\n\nExample: none" in text and "### pos" in text
    with pytest.raises(ValueError, match=r"label_descriptions lacks \['pos'\]"):
        instructions("mine", ["neg", "pos"], {"neg": "Did not like it."}, {})


def test_json_reports_are_strict(tmp_path: Path) -> None:
    out = write_json(tmp_path / "m.json", {"val_accuracy": float("nan"), "k": [float("inf"), 1]})

    def reject(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    assert json.loads(out.read_text(), parse_constant=reject) == {
        "val_accuracy": None,
        "k": [None, 1],
    }


def test_own_config_dir_through_the_console_script_then_a_chained_stage(
    tmp_path: Path, mlflow_uri: str, make_cfg
) -> None:
    """``saleval-train --config-dir <dir> dataset=mine``: a file of the user's own, labels
    from the data, ``limit_train_batches=0`` (the model as it starts, evaluated and saved),
    a strict ``metrics.json``; explain then takes the dataset from the train run."""
    from saleval.stages import explain

    data = tmp_path / "data"
    data.mkdir()
    write(reviews(), data / "reviews.csv")
    (tmp_path / "conf" / "dataset").mkdir(parents=True)
    (tmp_path / "conf" / "dataset" / "mine.yaml").write_text(
        f"name: mine\ndata_root: {data}\nfiles: {{all: reviews.csv}}\n"
        "text_column: review\nlabel_column: sentiment\nid_column: id\n"
    )
    run_dir = tmp_path / "train"
    proc = subprocess.run(
        [
            str(BIN / "saleval-train"),
            "--config-dir",
            str(tmp_path / "conf"),
            "dataset=mine",
            "model=tiny",
            "trainer=smoke",
            "trainer.limit_train_batches=0",
            "tracking.log_model=false",
            f"paths.output_root={tmp_path / 'outputs'}",
            f"run_dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    def reject(token: str) -> None:
        raise ValueError(f"metrics.json holds {token}")

    metrics = json.loads((run_dir / "metrics.json").read_text(), parse_constant=reject)
    assert (metrics["steps"], metrics["epochs"], metrics["n_train"]) == (0, 0, 28)
    assert 0 <= metrics["val_accuracy"] <= 1  # validated although nothing trained
    info = json.loads((run_dir / "run.json").read_text())
    assert info["provenance"]["dataset"] == "mine"
    assert info["provenance"]["label_names"] == ["neg", "pos"]  # read from the data
    # zero training batches: the saved weights are the seeded starting weights
    saved, _ = load_trained(str(run_dir / "model"))
    start = build_model(compose_config("train", ["model=tiny"]).model, ["neg", "pos"], seed=42)
    for (name, a), b in zip(start.state_dict().items(), saved.state_dict().values()):
        assert torch.equal(a, b), name

    cfg = make_cfg(
        "explain",
        [
            f"inputs.model={run_dir}",
            "data.n_samples=4",
            "method=[random]",
            "progress=false",
            "view.samples=1",
            "view.overlap_k=5",
        ],
    )
    out = explain.run(cfg)  # no dataset=: adopted from the train run, data_root kept
    preds = tables.PREDICTIONS.read(out["run_dir"])
    assert len(preds) == 4 and preds["sample_id"].str.fullmatch(r"r\d{3}").all()
    assert (
        json.loads(Path(out["run_dir"], "run.json").read_text())["provenance"]["dataset"] == "mine"
    )
