"""CCNet normalisation and the training-corpus helpers (detokenizer, hash split)."""

from __future__ import annotations

from gristmill.filters.ccnet_normalize import normalize, normalize_lines, strip_accents
from gristmill.filters.train_corpus import is_heading, is_heldout, text_hash, wikitext_detokenize


def test_case_accents_digits():
    assert normalize("  Élève à São Paulo, 2019 ") == "eleve a sao paulo, 0000"
    assert normalize("Ⅻ ٣٤ x²") == "ⅻ 00 x²"  # \d is Unicode digits (Arabic-Indic), not other numerics
    assert strip_accents("naïve façade") == "naive facade"


def test_unicode_punctuation_and_non_printing():
    assert normalize("“Hi”，she said…「ok」") == '"hi",she said..."ok"'
    assert normalize("a—b–c’d") == "a - b-c'd"
    assert normalize("tab\there\x00\x85\x7fend") == "tabhereend"  # control chars removed, not spaced


def test_normalize_lines_drops_empty_lines_only():
    assert normalize_lines("One\n\n  \nTWO 22\n") == ["one", "two 00"]
    assert normalize_lines("") == []


def test_wikitext_detokenize():
    line = ' The <unk> lobster , known as " H. gammarus " , weighs 1 @,@ 500 @.@ 5 g ( 3 @-@ 4 lb ) . '
    assert wikitext_detokenize(line) == 'The lobster, known as "H. gammarus", weighs 1,500.5 g (3-4 lb).'
    assert is_heading(" = = Description = = \n") and is_heading(" = Homarus gammarus = ")
    assert not is_heading(" x = 3 is a value . ")


def test_hash_split_is_stable_and_about_the_fraction():
    # digits normalise to 0: make texts distinct in letters
    texts = ["paragraph " + "".join(chr(97 + int(c, 16)) for c in f"{i:x}") for i in range(5000)]
    assert len({text_hash(t) for t in texts}) == 5000
    held = [t for t in texts if is_heldout(t, 0.1)]
    assert 400 < len(held) < 600
    assert held == [t for t in texts if is_heldout(t, 0.1)]
    # normalisation-equal texts hash (and split) alike: a duplicate cannot sit on both sides
    assert text_hash("Café 12") == text_hash("cafe 99")
    assert {is_heldout(t.upper(), 0.1) for t in held} == {True}
    assert [t for t in texts if is_heldout(t, 0.1, seed=1)] != held


def _ccnet_reference(line: str) -> str:
    """cc_net/text_normalizer.py normalize() with its defaults, step by step as written there."""
    import re
    import unicodedata

    from gristmill.filters.ccnet_normalize import UNICODE_PUNCT

    line = line.strip()
    if not line:
        return line
    line = line.lower()
    line = "".join(c for c in unicodedata.normalize("NFD", line) if unicodedata.category(c) != "Mn")
    line = re.sub(r"\d", "0", line)
    line = "".join(UNICODE_PUNCT.get(c, c) for c in line)
    return re.sub(f"[{''.join(map(chr, list(range(0, 32)) + list(range(127, 160))))}]", "", line)


def test_single_pass_equals_ccnet_steps_on_real_text(wet_files, shared_data):
    from gristmill.filters.train_corpus import iter_documents

    lines = [l for t in iter_documents(wet_files) for l in t.split("\n")]
    lines += (shared_data / "corpus" / "en" / "wikitext-2.valid.txt").read_text().splitlines()
    lines += ["“Ｆｕｌｌ” １２３ ．． 「x」 a\u0301 \u0085 ١٢", "ǅ ﬁ Å ⁵ ½"]
    assert len(lines) > 10_000 and sum(not l.isascii() for l in lines) > 1000  # many scripts in the sample
    assert [normalize(l) for l in lines] == [_ccnet_reference(l) for l in lines]
