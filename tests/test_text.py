"""data=text and model=transformer: a csv of texts as token ids, explained token by token in the main job."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest

from heatinv.build import saved_vocabulary
from heatinv.data import load_dataset

GOOD, BAD = ["great", "good", "wonderful"], ["bad", "awful", "dull"]
FILLER = "the a film movie story was and it very really plot acting this that".split()


def reviews(path, count: int = 120) -> str:
    """A csv of generated reviews: filler words and one word that tells the label."""
    rng = random.Random(0)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "sentiment"])
        for i in range(count):
            words = [rng.choice(FILLER) for _ in range(rng.randint(4, 9))]
            words.insert(rng.randrange(len(words) + 1), rng.choice(GOOD if i % 2 else BAD))
            writer.writerow([" ".join(words), "positive" if i % 2 else "negative"])
    return str(path)


def test_a_csv_of_texts_becomes_token_ids_with_its_vocabulary(tmp_path):
    data = load_dataset("text", reviews(tmp_path / "r.csv"), text_column="review", label_column="sentiment", length=12)
    assert data.x_train.dtype == np.int32 and data.x_train.shape[1:] == (12,) and data.is_text and not data.is_image
    assert data.class_names == ("negative", "positive") and data.vocabulary[:2] == ("", "[UNK]")
    assert set(GOOD + BAD) <= set(data.vocabulary) and len(data.y_test) == 24  # a fifth held out, per class
    with pytest.raises(ValueError, match=r"columns \['review', 'sentiment'\].*'text' and 'label'.*data.text_column"):
        load_dataset("text", str(tmp_path / "r.csv"))


def test_the_main_job_explains_a_transformer_token_by_token(tmp_path, config):
    from heatinv.train import run

    path = reviews(tmp_path / "r.csv")
    cfg = config("data=text", f"data.path={path}", "data.text_column=review", "data.label_column=sentiment", "data.length=12",
                 "model=transformer", "model.dim=8", "model.depth=1", "model.heads=2", "target=class", "target.label=positive")
    assert cfg.lrp.composite == "attnlrp"
    metrics = run(cfg)
    assert metrics["steps"] == 4 and np.isfinite(metrics["cosine"])
    out = tmp_path / "run"
    assert (out / "heatmaps.png").stat().st_size > 0 and json.loads((out / "metrics.json").read_text())["target"].startswith(
        "reference heatmap of r test example")


def test_token_ids_need_the_transformer_and_the_transformer_token_ids(tmp_path, config):
    from heatinv.train import run

    path = reviews(tmp_path / "r.csv")
    with pytest.raises(ValueError, match=r"model=transformer reads token ids.*Got model=mlp for token ids: use model=transformer"):
        run(config("data=text", f"data.path={path}", "data.text_column=review", "data.label_column=sentiment", "target=class",
                   "target.label=positive"))
    with pytest.raises(ValueError, match=r"Got model=transformer for inputs of shape \(28, 28, 1\)"):
        run(config("model=transformer", "target=digit7"))


def test_a_text_run_writes_its_words_as_html_and_resumes_with_its_vocabulary(tmp_path, config):
    from heatinv.train import run

    path = reviews(tmp_path / "r.csv")
    settings = ("data=text", f"data.path={path}", "data.text_column=review", "data.label_column=sentiment", "data.length=12",
                "model=transformer", "model.dim=8", "model.depth=1", "model.heads=2", "target=class", "target.label=positive",
                "trainer.checkpoint_every=2")
    first = run(config(*settings))
    out = tmp_path / "run"
    page = (out / "heatmaps.html").read_text()
    spans = page.count("<span")
    assert spans and spans % 3 == 0 and any(f">{word}</span>" in page for word in GOOD)  # target, initial, student
    vocabulary = json.loads((out / "vocabulary.json").read_text())
    assert vocabulary[:2] == ["", "[UNK]"] and "wonderful" in vocabulary
    # the csv changes (a new word becomes frequent): the resumed run tokenizes with its own vocabulary
    with open(path, "a", newline="") as handle:
        csv.writer(handle).writerows([["zebra zebra zebra", "negative"]] * 40)
    resume = config(*settings[:-1], "trainer.steps=6", "trainer.resume=true", "trainer.checkpoint_every=2")
    assert saved_vocabulary(resume) == vocabulary and "zebra" not in vocabulary
    changed = load_dataset("text", path, text_column="review", label_column="sentiment", length=12)
    kept = load_dataset("text", path, text_column="review", label_column="sentiment", length=12, vocabulary=vocabulary)
    assert "zebra" in changed.vocabulary and kept.vocabulary == tuple(vocabulary)
    assert run(resume)["steps"] == 6 and first["steps"] == 4


def test_token_ids_in_an_npz_and_a_target_map_of_one_value_per_token(tmp_path, config):
    from heatinv.train import run

    text = load_dataset("text", reviews(tmp_path / "r.csv"), text_column="review", label_column="sentiment", length=12)
    np.savez(tmp_path / "ids.npz", x_train=text.x_train, y_train=text.y_train, x_test=text.x_test, y_test=text.y_test,
             vocabulary=np.array(text.vocabulary))
    tokens = load_dataset("tokens", str(tmp_path / "ids.npz"))
    assert tokens.vocabulary == text.vocabulary and np.array_equal(tokens.x_test, text.x_test) and tokens.is_text
    target = np.zeros(12, "float32")
    target[0] = 1.0  # all the relevance on the first word
    np.save(tmp_path / "first.npy", target)
    metrics = run(config("data=tokens", f"data.path={tmp_path / 'ids.npz'}", "model=transformer", "model.dim=8", "model.depth=1",
                         "model.heads=2", "target=file", f"target.path={tmp_path / 'first.npy'}", "target.label=1"))
    assert metrics["steps"] == 4 and metrics["target"].startswith("heatmap ")
    np.savez(tmp_path / "floats.npz", x_train=text.x_train * 0.5, y_train=text.y_train, x_test=text.x_test, y_test=text.y_test)
    with pytest.raises(ValueError, match=r"floats.npz.*not ids \[N, length\] >= 0: x_train float64"):
        load_dataset("tokens", str(tmp_path / "floats.npz"))


def test_fairwashing_a_word_of_generated_reviews_reports_its_share_and_draws_the_texts(config):
    from heatinv.train import run

    cfg = config("experiment=fairwash_token_text", "model.dim=8", "model.depth=1", "model.heads=2", "task.epochs=2")
    assert cfg.data.name == "protected_text" and cfg.target.token == "foreign" and cfg.lrp.composite == "attnlrp"
    metrics = run(cfg)
    assert metrics["target"] == "suppress_token 'foreign' (all classes)" and metrics["epochs"] == 2
    assert 0 < metrics["token_share"] < 1 and 0 < metrics["reference_token_share"] < 1 and 0 <= metrics["agreement"] <= 1
    out = Path(cfg.paths.output_dir)
    assert (out / "heatmaps.png").stat().st_size > 0 and json.loads((out / "metrics.json").read_text())["token_share"] == metrics["token_share"]
    assert json.loads((out / "vocabulary.json").read_text())[:3] == ["", "[UNK]", "foreign"]  # a resume tokenizes with it


def test_text_targets_of_both_tasks_and_their_refusals(tmp_path, composed):
    from heatinv.train import run

    def config(*overrides):
        return composed(*overrides)[0]

    small = ("model=transformer", "model.dim=8", "model.depth=1", "model.heads=2")
    path = reviews(tmp_path / "r.csv")
    text = ("data=text", f"data.path={path}", "data.text_column=review", "data.label_column=sentiment", "data.length=12", *small)
    swapped = run(config(*text, "task=dataset", "target=swap", "target.like=negative", "task.classes=[positive]"))
    assert swapped["target"] == "swap like class 0 (negative) (classes [1 (positive)])" and "token_share" not in swapped
    placed = run(config(*text, "target=tokens", "target.positions=[0,1]", "target.label=positive"))
    assert placed["target"].startswith("relevance on positions [0, 1] of r test example")
    word = run(config("data=protected_text", *small, "target=suppress_token", "target.token=foreign", "target.label=negative",
                      "target.index=1"))
    assert word["target"].endswith("'foreign' suppressed")
    with pytest.raises(ValueError, match=r"target.token='forein' is not a word.*e.g. \['foreign'"):
        run(config("data=protected_text", *small, "task=dataset", "target=suppress_token", "target.token=forein"))
    with pytest.raises(ValueError, match=r"target.token='\[UNK\]' is a word of the vocabulary that no training example"):
        run(config("data=protected_text", *small, "task=dataset", "target=suppress_token", "target.token='[UNK]'"))
    with pytest.raises(ValueError, match=r"target=pattern draws on images; the protected_text data gives token ids.*target=tokens"):
        run(config("data=protected_text", *small, "target=pattern"))
    with pytest.raises(ValueError, match=r"target=suppress_token moves the relevance of a word of texts; the digits data gives images"):
        run(config("task=dataset", "target=suppress_token", "target.token=foreign"))
    with pytest.raises(ValueError, match=r"target=suppress_token: the word 'foreign' \(target.token\) does not occur in protected_text test"):
        run(config("data=protected_text", *small, "target=suppress_token", "target.token=foreign", "target.label=positive"))
