"""BM25 against a dense numpy reference and a hand-worked corpus; the tool."""

import json
import math

import numpy as np
import pytest

from rljax import tools

CORPUS = ["cat sat", "cat cat dog", "dog"]


def _reference_scores(texts, query, k1=1.5, b=0.75):
  """Okapi BM25 with Lucene's IDF from a dense term-document count matrix."""
  docs = [t.lower().split() for t in texts]
  terms = sorted({w for d in docs for w in d})
  tf = np.array([[d.count(t) for t in terms] for d in docs], float)  # [N, V]
  lengths = tf.sum(1)
  n_t = (tf > 0).sum(0)
  idf = np.log(1 + (len(docs) - n_t + 0.5) / (n_t + 0.5))
  denom = tf + k1 * (1 - b + b * lengths[:, None] / lengths.mean())
  safe = np.where(tf > 0, denom, 1.0)  # k1 = 0 makes absent terms 0 / 0
  weights = np.where(tf > 0, idf * tf * (k1 + 1) / safe, 0.0)  # [N, V]
  picked = [terms.index(w) for w in set(query.lower().split()) if w in terms]
  return weights[:, picked].sum(1)


def test_hand_worked_corpus():
  # N = 3, lengths 2, 3, 1, avgdl = 2, k1 = 1.5, b = 0.75.
  # "cat" is in 2 docs: IDF = ln(1 + (3 - 2 + 0.5) / (2 + 0.5)) = ln 1.6.
  #   doc 0: f = 1, |D| = 2: 1 * 2.5 / (1 + 1.5 * (0.25 + 0.75 * 1)) = 1.0
  #   doc 1: f = 2, |D| = 3: 2 * 2.5 / (2 + 1.5 * (0.25 + 0.75 * 1.5))
  #          = 5 / 4.0625 = 1.2307692
  # "sat" is in 1 doc: IDF = ln(1 + 2.5 / 1.5) = ln(8/3).
  # "dog" is in 2 docs (ln 1.6): doc 1 2.5 / 3.0625, doc 2 (|D| = 1)
  #   2.5 / (1 + 1.5 * 0.625) = 2.5 / 1.9375.
  index = tools.BM25(CORPUS)
  ln16, ln83 = math.log(1.6), math.log(8 / 3)
  np.testing.assert_allclose(
    index.scores("cat"), [ln16 * 1.0, ln16 * 5 / 4.0625, 0.0], rtol=1e-12
  )
  np.testing.assert_allclose(
    index.scores("Dog, sat!"),
    [ln83, ln16 * 2.5 / 3.0625, ln16 * 2.5 / 1.9375],
    rtol=1e-12,
  )
  assert [i for i, _ in index.top_k("cat", 3)] == [1, 0]  # doc 2 scores 0
  assert [i for i, _ in index.top_k("dog sat", 3)] == [0, 2, 1]
  assert index.top_k("dog sat", 1) == [(0, pytest.approx(ln83))]
  assert index.top_k("unicorn", 3) == []


@pytest.mark.parametrize("k1, b", [(1.5, 0.75), (1.2, 0.0), (0.0, 1.0)])
def test_matches_dense_reference(k1, b):
  rng = np.random.default_rng(0)
  vocab = [f"w{i}" for i in range(30)]
  texts = [
    " ".join(rng.choice(vocab, size=rng.integers(1, 40))) for _ in range(50)
  ]
  index = tools.BM25(texts, k1=k1, b=b)
  for _ in range(20):
    query = " ".join(rng.choice(vocab + ["absent"], size=rng.integers(1, 6)))
    np.testing.assert_allclose(
      index.scores(query), _reference_scores(texts, query, k1, b), rtol=1e-10
    )


def test_search_tool_over_dicts_and_jsonl(tmp_path):
  docs = [
    {"title": "Paris", "text": "Paris is the capital of France. " * 3},
    {"title": "Berlin", "contents": "Berlin is the capital of Germany."},
    {"title": "Cats", "text": "Cats sleep a lot. They purr."},
  ]
  path = tmp_path / "corpus.jsonl"
  path.write_text("\n".join(json.dumps(d) for d in docs) + "\n\n")
  for corpus in (docs, path, str(path)):
    box = tools.Toolbox([tools.search_tool(corpus, k=2, snippet_chars=40)])
    result = box.execute(tools.ToolCall("search", {"query": "capital Germany"}))
    assert result.ok
    assert result.text == (
      "[1] Berlin\nBerlin is the capital of Germany.\n\n"
      "[2] Paris\nParis is the capital of France. Paris ..."
    )
  result = box.execute(tools.ToolCall("search", {"query": "purr"}))
  assert result.text == "[1] Cats\nCats sleep a lot. They purr."
  assert box.execute(tools.ToolCall("search", "zebra")).text == (
    "No results for 'zebra'."
  )
  result = box.execute(tools.ToolCall("search", "?!"))
  assert not result.ok and result.error == "the query has no words"
  schema = box.schemas()[0]["function"]
  assert schema["parameters"]["required"] == ["query"]
  assert "3 documents" in schema["description"]


def test_snippets_start_near_the_match():
  text = " ".join(f"filler{i}" for i in range(100)) + " the needle is here"
  tool = tools.search_tool([text], snippet_chars=40)
  out = tool.fn(query="needle")
  assert out == "[1] ... the needle is here"  # starts at a word
  out = tools.search_tool([text], snippet_chars=20).fn(query="filler1 here")
  assert out == "[1] filler0 filler1 ..."


def test_bad_corpora(tmp_path):
  with pytest.raises(ValueError, match="non-empty list"):
    tools.BM25([])
  with pytest.raises(ValueError, match="corpus document 1"):
    tools.search_tool(["fine", {"title": "no text"}])
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"text": "ok"}\nnot json\n')
  with pytest.raises(ValueError, match="bad.jsonl:2 is not a JSON line"):
    tools.load_corpus(bad)
  with pytest.raises(ValueError, match="k must be a positive int"):
    tools.search_tool(["a"], k=0)
