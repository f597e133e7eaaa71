"""E-mail and IP anonymisation (`pii`) on the real WET sample, with addresses planted into real
records: FineWeb's e-mail addresses exactly (against datatrove's PIIFormatter), its IPv4
addresses but for the stated departures (each difference explained), the rest of every text
byte for byte as it was, and linear-time matching of hostile strings."""

from __future__ import annotations

import ipaddress
import random
import re
from collections import Counter

import pytest
from datatrove.data import Document
from datatrove.pipeline.formatters.pii import PIIFormatter, public_ip_validator

from gristmill.filters.pii import NOT_PUBLIC, PII, find_emails, find_ips, is_public, replace_pii
from gristmill.input.wet import WetReader

#: planted at the start of a line of a real record; each must be replaced, whole
REPLACED = [
    "john.doe@example.com",
    "jane+newsletter@mail.example.co.uk",  # plus-addressing
    "o'brien@example.ie",
    "user_name-1@sub-domain.example.org",
    "admin@[93.184.216.34]",  # an IP literal: one e-mail address
    "8.8.8.8",
    "93.184.216.34",
    "203.0.114.7",  # just past the documentation range 203.0.113/24
    "1.1.1.1",
]
#: planted the same way; each must be left as it is (the address is the part after any word)
LEFT = [
    *("192.168.1.1", "10.0.0.1", "127.0.0.1", "172.16.5.4", "169.254.1.1", "100.64.0.1", "0.0.0.0"),
    *("192.0.2.1", "198.51.100.7", "203.0.113.9", "198.18.0.1", "192.0.0.8", "224.0.0.251", "239.255.255.250"),
    *("240.1.2.3", "255.255.255.255"),
    *("version 8.8.8.8", "v1.2.3.4", "1.2.3.4.5", "010.001.001.001", "999.1.1.1", "ab8.8.8.8", "8.8.8.8cd"),
    '"john doe"@example.com',  # a quoted local part: FineWeb's pattern has none
    "john.@example.com",  # a local part may not end with "."
]
E, I = "<E>", "<I>"  # one replacement each, so that both sides' output can be compared
MARKED = {"email_replacement": [E], "ip_replacement": [I]}


@pytest.fixture(scope="module")
def records(wet_files) -> list[Document]:
    docs = list(WetReader([str(p) for p in wet_files]).run())
    assert len(docs) == 609
    return docs


@pytest.fixture(scope="module")
def planted(records) -> list[tuple[Document, list[tuple[int, int, str]]]]:
    """200 real records, each with 4 addresses planted at line starts: (document, [(start, end,
    planted string)]), positions in the planted text."""
    rnd = random.Random(7)
    out = []
    for doc in rnd.sample(records, 200):
        lines = doc.text.split("\n")
        chosen = {rnd.randrange(len(lines)): rnd.choice(REPLACED + LEFT) for _ in range(4)}
        plants, pos, parts = [], 0, []
        for n, line in enumerate(lines):
            if n in chosen:
                plants.append((pos, pos + len(chosen[n]), chosen[n]))
                line = chosen[n] + " " + line
            parts.append(line)
            pos += len(line) + 1
        out.append((Document(text="\n".join(parts), id=doc.id, metadata=dict(doc.metadata)), plants))
    assert sum(len(p) for _, p in out) >= 650
    return out


def datatrove_ip_spans(text: str) -> list[tuple[int, int]]:
    """The IPs datatrove's PIIFormatter replaces in `text` (its IP pass, after its e-mail pass)."""
    dt = PIIFormatter()
    return [m.span() for m in dt.ip_replacer.regex.finditer(text) if public_ip_validator(m.group())]


def splice(text: str, spans: list[tuple[int, int]], replacement: str) -> str:
    parts, pos = [], 0
    for s, t in spans:
        parts += (text[pos:s], replacement)
        pos = t
    return "".join(parts) + text[pos:]


_NOT_PUBLIC_NETS = [ipaddress.ip_network(f"{net}/{bits}") for net, bits in NOT_PUBLIC]
_VERSION_WORD = re.compile(r"(?i)\b(?:v|ver|version|rev|revision|release|build)\.?[ \t]*[:#]?[ \t]*$")


def departure(text: str, start: int, end: int) -> str | None:
    """Which stated departure keeps an IP that datatrove replaces at text[start:end], if any."""
    before, after = text[max(0, start - 2) : start], text[end : end + 2]
    if re.search(r"(\w|[0-9]\.)$", before) or re.match(r"(\w|\.[0-9])", after):
        return "glued"
    if _VERSION_WORD.search(text[max(0, start - 16) : start]):
        return "version"
    if any(ipaddress.ip_address(text[start:end]) in net for net in _NOT_PUBLIC_NETS):
        return "not_public"
    return None


# --- FineWeb's matches, departures explained --------------------------------------------------


def test_emails_are_found_where_datatrove_finds_them(records, planted):
    regex = PIIFormatter().emails_replacer.regex
    found = 0
    for doc in [*records, *(d for d, _ in planted)]:
        ours = find_emails(doc.text)
        assert ours == [m.span() for m in regex.finditer(doc.text)], doc.id
        found += len(ours)
    real = sum(len(find_emails(d.text)) for d in records)
    assert real == 182 and found > real  # the sample's own addresses, and the planted ones


def test_ips_are_datatroves_but_for_the_stated_departures(records, planted):
    seen = Counter()
    for doc in [*records, *(d for d, _ in planted)]:
        # datatrove looks for IPs after replacing e-mail addresses: compare on that text
        text = PIIFormatter(email_replacement=E).emails_replacer.replace(doc.text)
        theirs, ours = set(datatrove_ip_spans(text)), set(find_ips(text)[0])
        assert not ours - theirs, [text[s:t] for s, t in ours - theirs]
        for s, t in theirs - ours:
            why = departure(text, s, t)
            assert why, (doc.id, text[max(0, s - 20) : t + 20])
            seen[why] += 1
        # and the step, which looks for both on the text as written, replaces the same
        assert replace_pii(doc.text, doc.id, PII.Config(**MARKED)).text == splice(text, sorted(ours), I)
    assert set(seen) == {"glued", "version", "not_public"}, seen


def test_version_numbers_of_the_sample_are_what_datatrove_replaces_and_we_leave(records):
    """On the sample's own pages (nothing planted), datatrove replaces 15 IPs and we 9: the 6 we
    leave are version numbers ("v3.4.2.9305", "3.0.0.35414", "1.11.1.4.2", "Version: 2.4.4.1")."""
    kept = []
    for doc in records:
        text = PIIFormatter(email_replacement=E).emails_replacer.replace(doc.text)
        theirs, ours = set(datatrove_ip_spans(text)), set(find_ips(text)[0])
        kept += [(text[max(0, s - 9) : t + 2], departure(text, s, t)) for s, t in sorted(theirs - ours)]
    assert sum(len(find_ips(d.text)[0]) for d in records) == 9
    assert len(kept) == 6 and {why for _, why in kept} == {"glued", "version"}, kept
    assert any("Version: 2.4.4.1" in k for k, _ in kept) and any("v3.4.2.9305" in k for k, _ in kept)


# --- the planted addresses, and the rest of the text ------------------------------------------


def test_planted_addresses_are_replaced_or_left_as_stated(planted):
    config = PII.Config(**MARKED)
    for doc, plants in planted:
        spans = [(s, t) for s, t, _ in replace_pii(doc.text, doc.id, config).spans]
        for s, t, what in plants:
            if what in REPLACED:
                assert (s, t) in spans, (what, doc.id)
            else:  # no replacement touches the planted string
                assert not [x for x in spans if x[0] < t and s < x[1]], (what, doc.id)


def test_the_text_outside_replaced_spans_is_byte_identical(planted):
    config = PII.Config()  # FineWeb's replacement strings
    touched = 0
    for doc, _ in planted:
        r = replace_pii(doc.text, doc.id, config)
        touched += bool(r.spans)
        # walk both texts: between replacements, the new text is the old one, byte for byte
        old, new, pos_old, pos_new = doc.text.encode(), r.text.encode(), 0, 0
        for s, t, replacement in r.spans:
            s_b, t_b = len(doc.text[:s].encode()), len(doc.text[:t].encode())
            n = s_b - pos_old
            assert new[pos_new : pos_new + n] == old[pos_old:s_b]
            assert new[pos_new + n : pos_new + n + len(replacement)] == replacement.encode()
            # what was replaced is an address: an e-mail or an IP, the whole span
            assert find_emails(doc.text[s:t]) == [(0, t - s)] or find_ips(doc.text[s:t])[0] == [(0, t - s)]
            pos_old, pos_new = t_b, pos_new + n + len(replacement)
        assert new[pos_new:] == old[pos_old:]
    assert touched >= 120


def test_the_replacement_depends_on_the_document_and_the_address_not_on_the_task(planted):
    docs = [d for d, _ in planted]

    def outputs(order, tasks):
        out = {}
        for task in range(tasks):  # documents dealt to tasks as an executor would, each a fresh step
            step = PII()
            for doc in order[task::tasks]:
                copy = Document(text=doc.text, id=doc.id, metadata=dict(doc.metadata))
                step.filter_batch([copy])
                out[doc.id] = copy.text
        return out

    one = outputs(docs, 1)
    assert one == outputs(docs[::-1], 3) == outputs(random.Random(1).sample(docs, len(docs)), 7)
    texts = "".join(one.values())
    for replacement in [*PII.Config().email_replacement, *PII.Config().ip_replacement]:
        assert replacement in texts  # every string is used
    # FineWeb's rotation: a document's output depends on the documents before it in its task
    # (here one with an odd number of addresses, which moves the rotation by one)
    doc = next(d for d in docs if find_emails(d.text))
    before = next(d for d in docs if len(find_emails(d.text)) % 2 and d is not doc)
    alone, after_another = PIIFormatter(), PIIFormatter()
    after_another.format(before.text)
    assert alone.format(doc.text) != after_another.format(doc.text)


# --- hostile strings --------------------------------------------------------------------------

HOSTILE = [  # (text, ours, datatrove's) with one replacement each: "<E>", "<I>"
    ("ip 010.001.001.001 x", "ip 010.001.001.001 x", "ip 010.001.001.001 x"),  # leading zeros: no address
    ("ip 08.8.8.8 or 8.8.8.08", "ip 08.8.8.8 or 8.8.8.08", "ip 08.8.8.8 or 8.8.8.08"),
    ("ip 999.1.1.1 x", "ip 999.1.1.1 x", "ip 9<I> x"),  # out of range: FineWeb takes the tail
    ("ip 1.2.3.256", "ip 1.2.3.256", "ip <I>6"),
    ("1.2.3.4.5", "1.2.3.4.5", "<I>.5"),  # adjacent digits
    ("1234.5.6.7", "1234.5.6.7", "1<I>"),
    ("ab8.8.8.8 8.8.8.8cd x_8.8.8.8 ٣8.8.8.8", "ab8.8.8.8 8.8.8.8cd x_8.8.8.8 ٣8.8.8.8", "ab<I> <I>cd x_<I> ٣<I>"),
    ("dns 8.8.8.8. [8.8.4.4] ip=1.1.1.1&", "dns <I>. [<I>] ip=<I>&", "dns <I>. [<I>] ip=<I>&"),
    ("8.8.8.8:53 and 8.8.8.0/24", "<I>:53 and <I>/24", "<I>:53 and <I>/24"),
    ("version 8.8.8.8, v1.2.3.4, v. 8.8.8.8, Build: 8.8.8.8", "version 8.8.8.8, v1.2.3.4, v. 8.8.8.8, Build: 8.8.8.8",
     "version <I>, v<I>, v. <I>, Build: <I>"),
    ("mdns 224.0.0.251, ssdp 239.255.255.250", "mdns 224.0.0.251, ssdp 239.255.255.250", "mdns <I>, ssdp <I>"),
    ("lan 192.168.1.1 10.1.2.3 127.0.0.1 255.255.255.255 192.0.2.1", "lan 192.168.1.1 10.1.2.3 127.0.0.1 "
     "255.255.255.255 192.0.2.1", "lan 192.168.1.1 10.1.2.3 127.0.0.1 255.255.255.255 192.0.2.1"),
    ("jane+news@example.com", "<E>", "<E>"),  # plus-addressing
    ('"john doe"@example.com "a.b"@example.com', '"john doe"@example.com "a.b"@example.com',
     '"john doe"@example.com "a.b"@example.com'),  # quoted local parts: not in FineWeb's pattern
    ("user@bücher.de user@sub.bücher.de", "user@bücher.de <E>ücher.de", "user@bücher.de <E>ücher.de"),  # IDN
    ("user@xn--bcher-kva.de", "<E>", "<E>"),  # an IDN domain in punycode
    ("see http://example.com/user@host.org/x", "see http://<E>/x", "see http://<E>/x"),  # inside a URL
    ("mailto:a.b@c.io?subject=x", "mailto:<E>?subject=x", "mailto:<E>?subject=x"),
    ("john..doe@example.com .jo@example.com jo.@example.com", "john..<E> .<E> jo.@example.com",
     "john..<E> .<E> jo.@example.com"),
    ("éa@example.com a@b a@b.c- x@[1.2.3.4]", "éa@example.com a@b <E>- <E>", "éa@example.com a@b <E>- <E>"),
    ("1.2.3.4@x.com x@1.2.3.4", "<E> <E>", "<E> <E>"),  # an IP inside an address goes with it
]  # fmt: skip


@pytest.mark.parametrize(("text", "ours", "theirs"), HOSTILE)
def test_hostile_strings(text, ours, theirs):
    assert replace_pii(text, "id", PII.Config(**MARKED)).text == ours
    assert PIIFormatter(email_replacement=E, ip_replacement=I).format(text) == theirs


def adversarial(n: int) -> dict[str, str]:
    """Documents of n characters that make a backtracking matcher work hard."""
    return {
        "a-a-a-...@": ("a-" * n)[: n - 1] + "@",  # datatrove's e-mail pattern: quadratic
        "@a-a-a-...": "x@" + ("a-" * n)[: n - 2],
        "a@a@a@...": "a@" * (n // 2),
        "x@a.a.a.a...": "x@" + ("a." * n)[: n - 2],
        "..........@": "." * (n - 1) + "@",
        "1.1.1.1.1...": "1." * (n // 2),
        "x@[1.1.1.x@[1.1.1...": "x@[1.1.1." * (n // 9),
        "8.8.8.8 8.8.8.8 ...": "8.8.8.8 " * (n // 8),
    }


#: addresses replaced in the 100,000-character versions
ADVERSARIAL_REPLACED = {"x@a.a.a.a...": 1, "8.8.8.8 8.8.8.8 ...": 12_500}


@pytest.mark.parametrize("name", list(adversarial(100)))
def test_adversarial_documents(name):
    """Short versions (2,000 characters: datatrove's matcher is quadratic on some) find
    datatrove's e-mail addresses; long ones (100,000) what they hold. Their time is measured in
    benchmarks/filter_throughput.py (1 MB each), never asserted here."""
    short, long = adversarial(2_000)[name], adversarial(100_000)[name]
    assert find_emails(short) == [m.span() for m in PIIFormatter().emails_replacer.regex.finditer(short)]
    r = replace_pii(long, "id", PII.Config(**MARKED))
    assert len(r.spans) == ADVERSARIAL_REPLACED.get(name, 0)
    starts, ends = [0, *(t for _, t, _ in r.spans)], [*(s for s, _, _ in r.spans), len(long)]
    assert r.text.replace(E, "").replace(I, "") == "".join(long[a:b] for a, b in zip(starts, ends))


# --- the address table ------------------------------------------------------------------------


def test_not_public_is_the_table_and_pythons_is_global_elsewhere():
    for net, bits in NOT_PUBLIC:
        network = ipaddress.ip_network(f"{net}/{bits}")
        for address in (network[0], network[network.num_addresses // 2], network[-1]):
            assert not is_public(int(address)), address
        for outside in (int(network[0]) - 1, int(network[-1]) + 1):
            if 0 <= outside < 2**32 and not any(ipaddress.ip_address(outside) in n for n in _NOT_PUBLIC_NETS):
                assert is_public(outside), ipaddress.ip_address(outside)
    rnd, departures = random.Random(3), Counter()
    for _ in range(50_000):
        address = ipaddress.ip_address(rnd.getrandbits(32))
        if is_public(int(address)) != address.is_global:
            # where we differ from Python 3.11's is_global: multicast and 192.0.0/24, which it calls global
            assert address.is_global and (address.is_multicast or address in ipaddress.ip_network("192.0.0.0/24"))
            departures[address.is_multicast] += 1
    assert departures[True] > 0


# --- the step in a run ------------------------------------------------------------------------


def test_the_step_counts_what_it_replaced(planted):
    step = PII()
    docs = [Document(text=d.text, id=d.id, metadata=dict(d.metadata)) for d, _ in planted]
    size_in = sum(len(d.text.encode()) for d in docs)
    out = list(step.run(iter(docs)))
    stats = {k: v.total for k, v in step.stats.stats.items()}
    expected = [replace_pii(d.text, d.id, PII.Config()) for d, _ in planted]
    assert len(out) == stats["total"] == stats["forwarded"] == 200 and stats.get("dropped", 0) == 0
    assert stats["emails_replaced"] == sum(r.emails for r in expected) > 150
    assert stats["ips_replaced"] == sum(r.ips for r in expected) > 75
    assert stats["ips_not_public"] == sum(r.ips_not_public for r in expected) > 100
    assert stats["documents_touched"] == sum(bool(r.spans) for r in expected)
    assert stats["bytes_in"] == size_in and stats["bytes_out"] == sum(len(d.text.encode()) for d in out)
    assert [d.text for d in out] == [r.text for r in expected]
    nothing = PII()
    list(nothing.run(iter([Document(text="no address here", id="x")])))
    assert nothing.stats["emails_replaced"].total == nothing.stats["documents_touched"].total == 0


def test_a_fineweb_run_reports_replacements_and_drops_by_reason(tmp_path, wet_files, lid_model):
    """FineWeb's order (langid, Gopher repetition and quality, C4 without its terminal-punctuation
    rule, FineWeb's rules), with `pii` after langid: the stats, `pipeline stats`' journey and the
    report carry what each step replaced and dropped."""
    from gristmill.config import from_dict
    from gristmill.pipeline.report.journey import journey, journey_notes
    from gristmill.pipeline.report.page import build
    from gristmill.pipeline.runner import run

    cfg = {
        "run_dir": str(tmp_path / "fineweb"),
        "executor": {"type": "local", "tasks": 2, "workers": 1},
        "input": {"paths": [str(p) for p in wet_files]},
        "steps": [
            {"langid": {"model": str(lid_model), "languages": ["en"], "min_score": 0.65}},
            "pii",
            "gopher_repetition",
            "gopher_quality",
            {"c4_lines": {"filter_no_terminal_punct": False}},
            "fineweb_quality",
        ],
    }
    merged = run(from_dict(cfg))
    rows = {r.step: r for r in journey(merged)}
    pii, fineweb = rows["01_pii"], rows["05_fineweb_quality"]
    assert pii.docs_in == pii.docs_out == 407 and pii.dropped == 0 and pii.bytes_out != pii.bytes_in
    c = pii.counters
    assert c["emails_replaced"] > 0 and c["ips_replaced"] > 0 and 0 < c["documents_touched"] <= 407
    notes = journey_notes(pii)
    assert notes == (
        f"{c['emails_replaced']:,} e-mail and {c['ips_replaced']:,} IP addresses replaced "
        f"in {c['documents_touched']:,} documents"
    )
    assert fineweb.docs_in - fineweb.docs_out == fineweb.dropped > 0
    assert set(fineweb.drops) <= set(registered_drop_reasons("fineweb_quality")) and "line_punct_ratio" in fineweb.drops
    html = build(tmp_path / "fineweb")
    assert notes in html and "line_punct_ratio" in html


def registered_drop_reasons(step: str) -> tuple[str, ...]:
    from gristmill.core.step import registered_steps

    return registered_steps()[step].drop_reasons


def test_a_languages_own_settings_apply_to_its_pages_only(planted):
    step = PII(per_language={"zh": {"remove_ips": False, "email_replacement": ["nobody@example.net"]}})
    doc = next(d for d, plants in planted if any(p[2] == "8.8.8.8" for p in plants) and find_emails(d.text))
    as_en, as_zh = (Document(text=doc.text, id=doc.id, metadata={"language": lang}) for lang in ("en", "zh"))
    step.filter_batch([as_en, as_zh])
    assert as_en.text == replace_pii(doc.text, doc.id, PII.Config()).text
    assert "nobody@example.net" in as_zh.text and "8.8.8.8 " in as_zh.text and "8.8.8.8 " not in as_en.text
