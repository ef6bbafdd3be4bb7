"""The search tool: Okapi BM25 over a local corpus, offline, in numpy."""

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
import json
import math
import os
import re
from typing import Any

import numpy as np

from rljax.tools._base import Tool
from rljax.tools._base import ToolError

_WORD = re.compile(r"\w+")
_TEXT_KEYS = ("text", "contents", "content", "body")


def tokenize(text: str) -> list[str]:
  """Lower-cased word tokens (runs of letters, digits and _)."""
  return _WORD.findall(text.lower())


class BM25:
  """An Okapi BM25 index over a list of texts.

  The score of document D for query Q is

    sum over distinct terms t of Q:
      IDF(t) * f(t, D) * (k1 + 1) / (f(t, D) + k1 * (1 - b + b * |D| / avgdl))
    IDF(t) = ln(1 + (N - n(t) + 0.5) / (n(t) + 0.5))

  with f(t, D) the count of t in D, |D| its length in tokens, avgdl the
  mean length, N the number of documents and n(t) how many contain t
  (Robertson and Zaragoza, "The Probabilistic Relevance Framework: BM25
  and Beyond", 2009, with Lucene's IDF, which is never negative; bm25s and
  Lucene use the same). Query terms count once each. Each term's weights
  are computed once, at indexing, so a query costs a few sparse
  additions.

  Args:
    texts: the documents.
    k1: term-frequency saturation.
    b: length normalisation.
    tokenize: text -> tokens; default lower-cased words.

  Raises:
    ValueError: no texts, or k1 < 0, or b outside [0, 1].
  """

  def __init__(
    self,
    texts: Sequence[str],
    *,
    k1: float = 1.5,
    b: float = 0.75,
    tokenize: Callable[[str], list[str]] = tokenize,
  ):
    if isinstance(texts, str) or not len(texts):
      raise ValueError(f"BM25 needs a non-empty list of texts; got {texts!r}.")
    if not (k1 >= 0 and 0 <= b <= 1):
      raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1; got {k1}, {b}.")
    self.tokenize = tokenize
    counts = [Counter(tokenize(t)) for t in texts]
    lengths = np.array([sum(c.values()) for c in counts], np.float64)
    norm = k1 * (1 - b + b * lengths / max(lengths.mean(), 1e-12))
    postings: dict[str, tuple[list[int], list[float]]] = {}
    for doc, count in enumerate(counts):
      for term, f in count.items():
        ids, weights = postings.setdefault(term, ([], []))
        ids.append(doc)
        weights.append(f * (k1 + 1) / (f + norm[doc]))
    n_docs = len(texts)
    self._postings = {}
    for term, (ids, weights) in postings.items():
      idf = math.log(1 + (n_docs - len(ids) + 0.5) / (len(ids) + 0.5))
      self._postings[term] = (np.array(ids), idf * np.array(weights))
    self.size = n_docs

  def scores(self, query: str) -> np.ndarray:
    """The BM25 score of every document for `query`, float64 [N]."""
    scores = np.zeros((self.size,), np.float64)
    for term in set(self.tokenize(query)):
      if term in self._postings:
        ids, weights = self._postings[term]
        scores[ids] += weights
    return scores

  def top_k(self, query: str, k: int) -> list[tuple[int, float]]:
    """The k best (document index, score) with a positive score, best first.

    Ties keep corpus order.
    """
    scores = self.scores(query)
    order = np.argsort(-scores, kind="stable")[:k]
    return [(int(i), float(scores[i])) for i in order if scores[i] > 0]


def load_corpus(
  corpus: Sequence[str | Mapping[str, Any]] | str | os.PathLike,
) -> list[dict[str, str]]:
  """Documents as {"title", "text"} dicts from texts, dicts or a JSONL file.

  Args:
    corpus: a list of texts; or of dicts with "text" (or "contents",
      "content", "body") and an optional "title"; or the path of a JSONL
      file of such dicts, one a line.

  Returns:
    The documents, in order.

  Raises:
    ValueError: a document has no text, or a JSONL line is not an object.
  """
  if isinstance(corpus, (str, os.PathLike)):
    with open(corpus, encoding="utf-8") as f:
      lines = [(i, line) for i, line in enumerate(f, 1) if line.strip()]
    entries = []
    for i, line in lines:
      try:
        entries.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise ValueError(
          f"{corpus}:{i} is not a JSON line ({e.msg})."
        ) from None
    corpus = entries
  documents = []
  for i, entry in enumerate(corpus):
    if isinstance(entry, str):
      documents.append({"title": "", "text": entry})
      continue
    key = next(
      (k for k in _TEXT_KEYS if isinstance(entry, Mapping) and k in entry), None
    )
    if key is None or not isinstance(entry[key], str):
      raise ValueError(
        f"corpus document {i} must be a text or a dict with a 'text' string;"
        f" got {str(entry)[:80]!r}."
      )
    title = entry.get("title") or ""
    documents.append({"title": str(title), "text": entry[key]})
  return documents


def search_tool(
  corpus: Sequence[str | Mapping[str, Any]] | str | os.PathLike,
  *,
  name: str = "search",
  k: int = 3,
  snippet_chars: int = 300,
  k1: float = 1.5,
  b: float = 0.75,
) -> Tool:
  """A search tool: the top-k BM25 matches of a query in a local corpus.

  Titles and texts are indexed together. The result lists each match as
  "[rank] title" and a snippet of `snippet_chars` around the first query
  word found in it; a query matching nothing says so.

  Args:
    corpus: see `load_corpus`.
    name: the tool's name.
    k: most results per query.
    snippet_chars: characters of each result's snippet.
    k1: BM25's term-frequency saturation.
    b: BM25's length normalisation.

  Returns:
    A Tool taking one string argument, "query".

  Raises:
    ValueError: an empty corpus, or k or snippet_chars not positive.
  """
  for key, value in (("k", k), ("snippet_chars", snippet_chars)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(
        f"search_tool {key} must be a positive int; got {value!r}"
      )
  documents = load_corpus(corpus)
  index = BM25([f"{d['title']}\n{d['text']}" for d in documents], k1=k1, b=b)

  def search(query: str) -> str:
    """Search the corpus for documents about `query`.

    Args:
      query: keywords to look for.
    """
    words = tokenize(query)
    if not words:
      raise ToolError("the query has no words")
    hits = index.top_k(query, k)
    if not hits:
      return f"No results for {query!r}."
    return "\n\n".join(
      _entry(rank, documents[i], words, snippet_chars)
      for rank, (i, _) in enumerate(hits, 1)
    )

  description = (
    f"Search a local collection of {len(documents)} documents and return"
    f" the best {k} matches (title and snippet)."
  )
  return Tool.from_function(search, name=name, description=description)


def _entry(rank: int, doc: Mapping[str, str], words, chars: int) -> str:
  """One result: "[rank] title" and the snippet around a query word."""
  snippet = _snippet(doc["text"], words, chars)
  if not doc["title"]:
    return f"[{rank}] {snippet}"
  return f"[{rank}] {doc['title']}\n{snippet}".rstrip()


def _snippet(text: str, words: Sequence[str], chars: int) -> str:
  """About `chars` characters of text around the first of `words` in it."""
  text = " ".join(text.split())
  pattern = "|".join(re.escape(w) for w in sorted(set(words), key=len)[::-1])
  found = re.search(rf"(?<!\w)(?:{pattern})(?!\w)", text, re.IGNORECASE)
  start = 0
  if found is not None and found.end() > chars * 3 // 4:
    start = found.start() - chars // 4  # the match a quarter in
    space = text.find(" ", start)
    start = start if space < 0 or space >= found.start() else space + 1
  end = start + chars
  snippet = text[start:end]
  if end < len(text):
    snippet = snippet.rsplit(" ", 1)[0] if " " in snippet else snippet
    snippet += " ..."
  return ("... " if start > 0 else "") + snippet
