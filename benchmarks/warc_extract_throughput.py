"""HTML to text from WARC responses: resiliparse against trafilatura, one core, same pages.

    python benchmarks/warc_extract_throughput.py [--pages 3000] [--seed 1] [--repeat 3]
        [--sample-passes 20] [--write-warc OUT.warc.gz] [--memory 8 16 32]
        [--tag-pages 20000 100000] [--smoke]

Two inputs. The shared WARC sample (../shared/data/cc/warc: 16 real HTML responses of
CC-MAIN-2020-34, read `--sample-passes` times over), and `--pages` generated pages (seeded:
the same --pages/--seed give byte-identical pages). A generated page is built as sites build
them: a head with a title, meta tags, a stylesheet link, an inline <style> and JSON-LD and
analytics <script>s; a cookie banner, a header with a logo, a navigation bar and a search
form, a breadcrumb; the main part (an article: headline, byline, paragraphs with inline links
and emphasis, sub-headings, lists, a table of figures, a quotation, a figure with alt text and
caption, share links, sometimes a comment section; or a listing page of linked teasers and
pagination; or a product page with a specification table), a sidebar of related links, an
advertisement and a tag cloud, a footer of link columns and a copyright line, trailing scripts,
HTML comments throughout. The prose is the Universal Declaration of Human Rights in 10
languages (../shared/data/corpus/multi/udhr2.zip: en, de, fr, es, ru, zh, ja, ko, pl, ar; half
the pages English), the boilerplate's labels in the page's language; a third of the non-English
pages are in a legacy charset (windows-1252, iso-8859-1/-2, windows-1251, koi8-r, GBK,
Shift_JIS, EUC-JP, EUC-KR, windows-1256), declared in the HTTP header, in a <meta>, in both,
or nowhere (detection's turn).

Per extractor (gristmill's settings: `gristmill.input.warc.load_extractor`), CPU time of
this process, best of `--repeat`:
- extract: the extractor alone on each page already decoded to a string;
- reader: `iter_warc_documents` over a WARC file of the pages (gzip member per record, as
  Common Crawl writes them): inflate, record and HTTP parsing, charset, extraction.
Prints ms per page (mean; for the extractor alone also the median and the slowest page), MB/s
of HTML (the response bodies' bytes) per core, pages with empty text, characters kept, and the
ratio of the two extractors' speeds.

`--memory MB...`: for each size, two generated pages of about MB megabytes (an article of that
much prose, and the bodies of generated pages one after another), each in a one-record WARC
read by each extractor in a fresh process (no limit on the page's tags); prints the peak RSS
over that of the same process after reading a small page (imports and warm-up), per byte of the
page.

`--tag-pages N...`: pages of markup rather than text, N start tags each, in six shapes
(`TAG_SHAPES`: `<p>word `, `<td>1`, `<b>w</b> `, `<!---->`, `<p>`s under 500 nested
`<div>`s, and N nested `<div>`s), each read by each extractor in a fresh process (the reader's
`max_html_tags` raised above N): the peak RSS over the base as above, per tag and per byte of
the page, the reader's CPU seconds, what it kept (or why not), and for pages of at most 20,000
tags the extractor's CPU seconds on the page alone (without the reader's depth check). They are
what `input.max_html_tags` and `MAX_DEPTH` bound (`WarcReader.memory_bytes` takes
`TREE_BYTES_PER_TAG`).

`--smoke`: 60 generated pages, one pass over the sample, one run each, no memory runs, pages of
200 tags (seconds; checks that the benchmark still runs, its figures mean nothing).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GRISTMILL_DATA", REPO.parent / "shared" / "data"))
SAMPLE = DATA / "cc" / "warc" / "CC-MAIN-20200808165417-20200808195417-00395.sample.warc.gz"
UDHR = DATA / "corpus" / "multi" / "udhr2.zip"
EXTRACTORS = ("resiliparse", "trafilatura")

# language: UDHR file, legacy charsets
LANGS = {
    "en": ("eng", ["windows-1252"]),
    "de": ("deu", ["iso-8859-1", "windows-1252"]),
    "fr": ("fra", ["iso-8859-1", "windows-1252"]),
    "es": ("spa", ["windows-1252"]),
    "ru": ("rus", ["windows-1251", "koi8-r"]),
    "zh": ("cmn_hans", ["gbk"]),
    "ja": ("jpn", ["shift_jis", "euc-jp"]),
    "ko": ("kor", ["euc-kr"]),
    "pl": ("pol", ["iso-8859-2"]),
    "ar": ("arb", ["windows-1256"]),
}
# the boilerplate's labels per language, in the order of LABELS
BOILERPLATE = {
    "en": (
        "Home|News|About us|Contact|Search|Privacy policy|Terms of use|"
        "Related articles|Share|Comments|Read more|Next|Previous|"
        "All rights reserved|Tags|Advertisement|Accept cookies|Log in|"
        "Subscribe to our newsletter|By"
    ),
    "de": (
        "Startseite|Nachrichten|Über uns|Kontakt|Suche|Datenschutz|"
        "Nutzungsbedingungen|Ähnliche Artikel|Teilen|Kommentare|Weiterlesen|"
        "Weiter|Zurück|Alle Rechte vorbehalten|Schlagwörter|Anzeige|"
        "Cookies akzeptieren|Anmelden|Newsletter abonnieren|Von"
    ),
    "fr": (
        "Accueil|Actualités|À propos|Contact|Rechercher|Confidentialité|"
        "Conditions d'utilisation|Articles similaires|Partager|Commentaires|"
        "Lire la suite|Suivant|Précédent|Tous droits réservés|Mots-clés|"
        "Publicité|Accepter les cookies|Connexion|S'abonner à la lettre|Par"
    ),
    "es": (
        "Inicio|Noticias|Quiénes somos|Contacto|Buscar|Privacidad|"
        "Términos de uso|Artículos relacionados|Compartir|Comentarios|Leer más|"
        "Siguiente|Anterior|Todos los derechos reservados|Etiquetas|Publicidad|"
        "Aceptar cookies|Iniciar sesión|Suscríbete al boletín|Por"
    ),
    "ru": (
        "Главная|Новости|О нас|Контакты|Поиск|Конфиденциальность|"
        "Условия использования|Похожие статьи|Поделиться|Комментарии|"
        "Читать далее|Далее|Назад|Все права защищены|Теги|Реклама|"
        "Принять cookies|Войти|Подписаться на рассылку|Автор"
    ),
    "zh": (
        "首页|新闻|关于我们|联系我们|搜索|隐私政策|使用条款|相关文章|分享|评论|阅读全文|"
        "下一页|上一页|版权所有|标签|广告|接受cookies|登录|订阅邮件|作者"
    ),
    "ja": (
        "ホーム|ニュース|会社概要|お問い合わせ|検索|プライバシーポリシー|利用規約|関連記事|"
        "シェア|コメント|続きを読む|次へ|前へ|無断転載禁止|タグ|広告|クッキーに同意|ログイン|"
        "メールマガジン登録|著者"
    ),
    "ko": (
        "홈|뉴스|회사소개|문의하기|검색|개인정보처리방침|이용약관|관련 기사|공유|댓글|"
        "더 보기|다음|이전|모든 권리 보유|태그|광고|쿠키 허용|로그인|뉴스레터 구독|글쓴이"
    ),
    "pl": (
        "Strona główna|Aktualności|O nas|Kontakt|Szukaj|Polityka prywatności|"
        "Regulamin|Podobne artykuły|Udostępnij|Komentarze|Czytaj dalej|Dalej|"
        "Wstecz|Wszelkie prawa zastrzeżone|Tagi|Reklama|Akceptuję cookies|"
        "Zaloguj się|Zapisz się do newslettera|Autor"
    ),
    "ar": (
        "الرئيسية|الأخبار|من نحن|اتصل بنا|بحث|سياسة الخصوصية|شروط الاستخدام|"
        "مقالات ذات صلة|شارك|التعليقات|اقرأ المزيد|التالي|السابق|"
        "جميع الحقوق محفوظة|الوسوم|إعلان|قبول ملفات تعريف الارتباط|"
        "تسجيل الدخول|اشترك في النشرة|بقلم"
    ),
}
LABELS = (
    "home news about contact search privacy terms related share comments more next prev rights tags ad cookies login "
    "subscribe by"
).split()
NAMES = ["Anna Weber", "J. Martin", "Li Wei", "María López", "Olga Ivanova", "Sato Kenji", "Kim Min-jun", "A. Nowak"]
CSS_PROPS = ["margin", "padding", "color", "font-size", "line-height", "border", "background", "display", "width"]


def pools() -> dict[str, list[str]]:
    """Per language, the UDHR's paragraphs (lines of 40+ characters)."""
    out = {}
    with zipfile.ZipFile(UDHR) as z:
        for lang, (name, _) in LANGS.items():
            lines = z.read(f"udhr2/{name}.txt").decode("utf-8").splitlines()
            out[lang] = [x.strip() for x in lines if len(x.strip()) >= 40]
    return out


class PageMaker:
    """Deterministic pages: everything is drawn from one random.Random(seed)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.pools = pools()
        self.labels = {lang: dict(zip(LABELS, text.split("|"))) for lang, text in BOILERPLATE.items()}

    # --- pieces -------------------------------------------------------------------------------

    def para(self, lang: str, n: int = 0) -> str:
        r = self.rng
        parts = r.sample(self.pools[lang], n or r.randint(1, 3))
        text = " ".join(parts)
        words = text.split(" ")
        if len(words) > 8 and r.random() < 0.5:  # an inline link or emphasis, as articles have
            i = r.randrange(len(words) - 3)
            tag = r.choice(["a", "strong", "em"])
            attrs = f' href="/{lang}/{r.randrange(10**6)}.html"' if tag == "a" else ""
            words[i : i + 3] = [f"<{tag}{attrs}>{' '.join(words[i : i + 3])}</{tag}>"]
            text = " ".join(words)
        return text

    def short(self, lang: str, words: int = 8) -> str:
        p = self.rng.choice(self.pools[lang])
        if lang in ("zh", "ja"):
            return p[: words * 2]
        return " ".join(p.split()[:words]).rstrip(",;:")

    def link_list(self, lang: str, n: int, cls: str) -> str:
        r = self.rng
        items = "".join(
            f'<li><a href="/{lang}/{r.randrange(10**6)}.html">{self.short(lang, r.randint(3, 9))}</a></li>'
            for _ in range(n)
        )
        return f'<ul class="{cls}">{items}</ul>'

    def style(self) -> str:
        r, rules = self.rng, []
        for _ in range(r.randint(40, 400)):
            sel = r.choice([".", "#", ""]) + r.choice(
                ["nav", "hdr", "ftr", "col", "btn", "card", "grid", "post", "meta"]
            )
            sel += f"-{r.randrange(100)}"
            props = ";".join(f"{p}:{r.randrange(40)}px" for p in r.sample(CSS_PROPS, r.randint(2, 5)))
            rules.append(f"{sel}{{{props}}}")
        return "<style>" + "\n".join(rules) + "</style>"

    def script(self) -> str:
        r = self.rng
        body = ";".join(
            f"var _{r.randrange(10**4)}=function(a,b){{return a.{r.choice(['push', 'map'])}(b)+{r.randrange(999)}}}"
            for _ in range(r.randint(20, 300))
        )
        return f"<script>{body};window.dataLayer=window.dataLayer||[];dataLayer.push({{'event':'pv'}});</script>"

    def table(self, lang: str) -> str:
        r = self.rng
        cols = r.randint(3, 6)
        head = "".join(f"<th>{self.short(lang, 2)}</th>" for _ in range(cols))
        rows = "".join(
            "<tr>" + "".join(f"<td>{r.randrange(10**5) / 100:.2f}</td>" for _ in range(cols)) + "</tr>"
            for _ in range(r.randint(3, 15))
        )
        return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'

    def nest(self, html: str) -> str:
        """`html` inside 1-5 layout divs, as grid frameworks wrap every block."""
        r = self.rng
        classes = [
            r.choice(["row", "col-md-8", "inner", "wrap", "box", "section", "clearfix"]) for _ in range(r.randint(1, 5))
        ]
        return "".join(f'<div class="{c}">' for c in classes) + html + "</div>" * len(classes)

    # --- a page -------------------------------------------------------------------------------

    def page(self, lang: str, kind: str, size_hint: int = 0) -> tuple[str, str]:
        """(title, HTML as a string) of one page; `size_hint` grows an article to about that many
        characters. The meta charset is left as {META}, for `encode_page`."""
        r, lab = self.rng, self.labels[lang]
        site = r.choice(["daily", "the", "my", "city", "info"]) + r.choice(["news", "post", "blog", "shop", "portal"])
        title = self.short(lang, r.randint(4, 10))
        nav = "".join(f'<li><a href="/{k}">{lab[k]}</a></li>' for k in ("home", "news", "about", "contact"))
        nav += "".join(f'<li><a href="/c/{i}">{self.short(lang, 2)}</a></li>' for i in range(r.randint(2, 8)))
        out = [
            f'<!DOCTYPE html>\n<html lang="{lang}">\n<head>\n{{META}}\n<title>{title} | {site}</title>',
            f'<meta name="description" content="{self.short(lang, 20)}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f'<link rel="stylesheet" href="/static/main.{r.randrange(16**8):08x}.css">',
            self.style(),
            '<script type="application/ld+json">'
            + json.dumps({"@context": "https://schema.org", "@type": "NewsArticle", "headline": title})
            + "</script>",
            self.script(),
            "</head>",
            f'<body class="{kind} lang-{lang}">',
        ]
        if r.random() < 0.5:
            cookies = f"<p>{self.para(lang, 1)}</p><button>{lab['cookies']}</button>"
            out.append(f'<div id="cookie-banner" class="consent">{cookies}</div>')
        out += [
            f'<header class="site-header"><a class="logo" href="/">{site}</a>',
            f'<nav class="main-nav"><ul>{nav}</ul></nav>',
            f'<form class="search" action="/search"><input type="text" name="q" placeholder="{lab["search"]}">'
            f'<button type="submit">{lab["search"]}</button></form><a href="/login">{lab["login"]}</a></header>',
            f'<div class="breadcrumb"><a href="/">{lab["home"]}</a> &raquo; '
            f'<a href="/news">{lab["news"]}</a> &raquo; {title}</div>',
            "<!-- main column -->",
            '<div class="container"><main>',
        ]
        if kind == "article":
            out += self.article(lang, title, size_hint)
        elif kind == "listing":
            for _ in range(r.randint(8, 25)):
                teaser = (
                    f'<div class="teaser"><h3><a href="/{lang}/{r.randrange(10**6)}.html">'
                    f"{self.short(lang, 8)}</a></h3>"
                    f'<p>{self.short(lang, r.randint(12, 30))}…</p><a class="more" href="#">{lab["more"]}</a></div>'
                )
                out.append(self.nest(teaser))
            pages = "".join(f'<a href="?page={i}">{i}</a> ' for i in range(1, r.randint(3, 12)))
            out.append(
                f'<div class="pagination"><a href="#">{lab["prev"]}</a> {pages}<a href="#">{lab["next"]}</a></div>'
            )
        else:  # a product page
            out += [
                f'<div class="product"><h1>{title}</h1><div class="price">{r.randrange(10**4) / 100:.2f} €</div>',
                f"<p>{self.para(lang)}</p>",
                self.table(lang),
                f'<button class="buy">{lab["more"]}</button></div>',
            ]
        out.append("</main>")
        related = self.link_list(lang, r.randint(4, 10), "related")
        ad = f'<a href="https://ads.example/c?{r.randrange(10**9)}">{self.short(lang, 5)}</a>'
        tags = " ".join(f'<a href="/tag/{i}">{self.short(lang, 1)}</a>' for i in range(r.randint(5, 15)))
        out.append(
            '<aside class="sidebar">'
            + self.nest(f'<div class="widget"><h3>{lab["related"]}</h3>{related}</div>')
            + self.nest(f'<div class="ad"><span>{lab["ad"]}</span>{ad}</div>')
            + f'<div class="tags"><h3>{lab["tags"]}</h3>{tags}</div></aside></div>'
        )
        cols = "".join(
            self.nest(f'<div class="col">{self.link_list(lang, r.randint(3, 6), "footer-links")}</div>')
            for _ in range(r.randint(2, 4))
        )
        out += [
            f'<footer class="site-footer">{cols}<form class="newsletter"><label>{lab["subscribe"]}</label>'
            '<input type="email" name="email"><button>OK</button></form>',
            f'<p>&copy; 2020 {site}. {lab["rights"]}. <a href="/privacy">{lab["privacy"]}</a> | '
            f'<a href="/terms">{lab["terms"]}</a></p></footer>',
            "<!-- analytics -->",
            self.script(),
            self.script(),
            f'<script src="/static/app.{r.randrange(16**8):08x}.js" async></script>',
            "</body>\n</html>\n",
        ]
        return title, "\n".join(out)

    def article(self, lang: str, title: str, size_hint: int) -> list[str]:
        r, lab = self.rng, self.labels[lang]
        out = [
            f"<article><h1>{title}</h1>",
            f'<div class="byline">{lab["by"]} <a href="/author/{r.randrange(99)}">{r.choice(NAMES)}</a> · '
            f'<time datetime="2020-0{r.randint(1, 8)}-1{r.randint(0, 9)}">2020</time></div>',
        ]
        size = 0
        sections = r.randint(1, 5)
        while True:
            for _ in range(r.randint(2, 6)):
                p = f"<p>{self.para(lang)}</p>"
                out.append(self.nest(p) if r.random() < 0.3 else p)
                size += len(p)
            x = r.random()
            if x < 0.25:
                out.append(
                    "<ul>"
                    + "".join(f"<li>{self.short(lang, r.randint(5, 14))}</li>" for _ in range(r.randint(3, 7)))
                    + "</ul>"
                )
            elif x < 0.4:
                out.append(self.table(lang))
            elif x < 0.5:
                out.append(f"<blockquote><p>{self.para(lang, 1)}</p></blockquote>")
            elif x < 0.6:
                out.append(
                    f'<figure><img src="/img/{r.randrange(10**6)}.jpg" alt="{self.short(lang, 6)}">'
                    f"<figcaption>{self.short(lang, 10)}</figcaption></figure>"
                )
            elif x < 0.63:
                out.append('<!-- ad slot --><div class="ad-inline" data-slot="mid"></div>')
            sections -= 1
            if (size_hint and size >= size_hint) or (not size_hint and sections <= 0):
                break
            out.append(f"<h2>{self.short(lang, r.randint(3, 7))}</h2>")
        share = " ".join(
            f'<a href="https://{s}.example/share">{s}</a>' for s in ("facebook", "twitter", "whatsapp", "email")
        )
        out.append(f'<div class="share">{lab["share"]}: {share}</div></article>')
        if r.random() < 0.4:
            comments = "".join(
                f'<div class="comment"><span class="author">{r.choice(NAMES)}</span>'
                f"<p>{self.short(lang, r.randint(5, 30))}</p></div>"
                for _ in range(r.randint(1, 8))
            )
            out.append(f'<section class="comments"><h3>{lab["comments"]}</h3>{comments}</section>')
        return out


def encode_page(html: str, lang: str, rng: random.Random) -> tuple[bytes, str]:
    """(body bytes, HTTP Content-Type) of a page, in UTF-8 or (a third of the non-English pages,
    a tenth of the English ones) a legacy charset, declared in the header, a meta tag, both, or not at all."""
    legacy = rng.random() < (0.1 if lang == "en" else 0.33)
    charset = rng.choice(LANGS[lang][1]) if legacy else "utf-8"
    where = rng.choices(["both", "header", "meta", "none"], [5, 2, 2, 1])[0]
    if where in ("both", "meta"):
        meta = (
            f'<meta charset="{charset}">'
            if rng.random() < 0.7
            else f'<meta http-equiv="Content-Type" content="text/html; charset={charset}">'
        )
    else:
        meta = ""
    body = html.replace("{META}", meta, 1).encode(charset, errors="xmlcharrefreplace")
    ctype = f"text/html; charset={charset}" if where in ("both", "header") else "text/html"
    return body, ctype


def make_pages(n: int, seed: int) -> list[tuple[str, bytes, str]]:
    """`n` pages as (url, body, Content-Type); half English, the rest spread over 9 languages."""
    maker = PageMaker(seed)
    langs = list(LANGS)
    out = []
    for i in range(n):
        lang = "en" if maker.rng.random() < 0.5 else maker.rng.choice(langs[1:])
        kind = maker.rng.choices(["article", "listing", "product"], [7, 2, 1])[0]
        _, html = maker.page(lang, kind)
        body, ctype = encode_page(html, lang, maker.rng)
        out.append((f"http://{lang}.example{i % 97}.com/{kind}/{i}.html", body, ctype))
    return out


def big_page(mb: float, seed: int, shape: str) -> tuple[str, bytes, str]:
    """One English page of about `mb` megabytes: an `article` of that much prose (with its
    headings, lists, tables...), or `mixed`: the bodies of generated pages (articles, listings,
    product pages, with their boilerplate and scripts) one after another."""
    maker, head = PageMaker(seed), '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
    if shape == "article":
        _, html = maker.page("en", "article", size_hint=int(mb * 1e6))
        return "http://en.example.com/article.html", html.replace("{META}", '<meta charset="utf-8">', 1).encode(), ""
    parts, size = [], 0
    while size < mb * 1e6:
        kind = maker.rng.choices(["article", "listing", "product"], [7, 2, 1])[0]
        _, html = maker.page("en", kind)
        body = html[html.index("<body") : html.rindex("</body>")]
        body = body[body.index(">") + 1 :]
        parts.append(body)
        size += len(body)
    return "http://en.example.com/mixed.html", (head + "<title>x</title></head><body>" + "".join(parts)).encode(), ""


def warc_record(url: str, body: bytes, ctype: str, rng: random.Random) -> bytes:
    """A response record as Common Crawl writes it (its own gzip member)."""
    http = f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    head = (
        "WARC/1.0\r\nWARC-Type: response\r\nWARC-Date: 2020-08-08T17:27:41Z\r\n"
        f"WARC-Record-ID: <urn:uuid:{uuid.UUID(int=rng.getrandbits(128), version=4)}>\r\n"
        f"Content-Length: {len(http)}\r\nContent-Type: application/http; msgtype=response\r\n"
        f"WARC-Target-URI: {url}\r\nWARC-Identified-Payload-Type: text/html\r\n\r\n"
    )
    return gzip.compress(head.encode() + http + b"\r\n\r\n", compresslevel=6, mtime=0)


def write_warc(pages, path: Path, seed: int) -> None:
    rng = random.Random(seed)
    info = b"isPartOf: CC-MAIN-2020-34\r\n"
    head = (
        "WARC/1.0\r\nWARC-Type: warcinfo\r\nWARC-Date: 2020-08-08T16:54:17Z\r\n"
        f"WARC-Record-ID: <urn:uuid:{uuid.UUID(int=rng.getrandbits(128), version=4)}>\r\n"
        f"Content-Length: {len(info)}\r\nContent-Type: application/warc-fields\r\n\r\n"
    )
    with open(path, "wb") as f:
        f.write(gzip.compress(head.encode() + info + b"\r\n\r\n", mtime=0))
        for url, body, ctype in pages:
            f.write(warc_record(url, body, ctype, rng))


def sample_pages() -> list[tuple[str, bytes, str]]:
    """The shared sample's HTML responses as (url, body, Content-Type), read with gristmill's own parsing."""
    from gristmill.input.warc import decode_body, http_head
    from gristmill.input.wet import iter_records

    out = []

    def keep(rec):
        if rec.fields["warc-type"] == "response":
            status, headers, start = http_head(rec.payload)
            url = rec.fields["warc-target-uri"]
            out.append((url, bytes(decode_body(rec.payload, start, headers, 1 << 30)), headers.get("content-type", "")))
        return []

    list(iter_records(SAMPLE, keep))
    return out


# --- measuring ----------------------------------------------------------------------------------


def best_of(repeat: int, fn) -> tuple[float, object]:
    """The CPU seconds of the fastest of `repeat` calls of `fn`, and what that call returned."""
    best = None
    for _ in range(repeat):
        gc.collect()
        t0 = time.process_time()
        out = fn()
        cpu = time.process_time() - t0
        if best is None or cpu < best[0]:
            best = (cpu, out)
    return best


def measure(name: str, pages, warc: Path, repeat: int, passes: int = 1) -> dict:
    from gristmill.input.warc import decode_html, iter_warc_documents, load_extractor
    from gristmill.input.wet import WetRecord

    extract = load_extractor(name)
    extract(pages[0][1].decode("utf-8", "replace"))  # imports and first-call set-up out of the timing
    htmls = [decode_html(body, ctype)[0] for _, body, ctype in pages]

    def extract_all():
        texts, times, clock = [], [], time.process_time
        for _ in range(passes):
            for h in htmls:
                t0 = clock()
                texts.append(extract(h).strip())
                times.append(clock() - t0)
        return texts, sorted(times)

    cpu_x, (texts, times) = best_of(repeat, extract_all)

    def read_all():
        return [e for _ in range(passes) for e in iter_warc_documents(warc, extractor=name) if isinstance(e, WetRecord)]

    cpu_r, docs = best_of(repeat, read_all)
    n = len(pages) * passes
    html_mb = sum(len(b) for _, b, _ in pages) * passes / 1e6
    return {
        "name": name,
        "pages": n,
        "extract_ms": 1000 * cpu_x / n,
        "extract_mb_s": html_mb / cpu_x,
        "median_ms": 1000 * times[len(times) // 2],
        "max_ms": 1000 * times[-1],
        "reader_ms": 1000 * cpu_r / n,
        "reader_mb_s": html_mb / cpu_r,
        "empty": sum(1 for t in texts if not t),
        "chars": sum(len(t) for t in texts),
        "docs": len(docs),
    }


def report(title: str, rows: list[dict]) -> None:
    print(f"\n## {title}")
    cols = ["extractor", "pages", "extract ms/page", "median", "slowest", "extract MB/s/core"]
    print("| " + " | ".join([*cols, "reader ms/page", "reader MB/s/core", "empty", "chars"]) + " |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['name']} | {r['pages']:,} | {r['extract_ms']:.2f} | {r['median_ms']:.2f} | {r['max_ms']:.1f} "
            f"| {r['extract_mb_s']:.2f} | {r['reader_ms']:.2f} | {r['reader_mb_s']:.2f} | {r['empty']:,} "
            f"| {r['chars']:,} |"
        )
    a, b = rows
    print(
        f"{title}: ratio resiliparse/trafilatura (pages/s per core, extract): {b['extract_ms'] / a['extract_ms']:.1f}x"
    )
    print(f"{title}: ratio resiliparse/trafilatura (pages/s per core, reader): {b['reader_ms'] / a['reader_ms']:.1f}x")


MEMORY_CHILD = r"""
import json, sys
from gristmill.input.warc import iter_warc_documents
name, small, big = sys.argv[1:4]
def peak():
    return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")) * 1024
for _ in iter_warc_documents(small, extractor=name):
    pass
base = peak()
n = sum(len(getattr(e, "text", "")) for e in iter_warc_documents(big, extractor=name, max_html_tags=1 << 30))
print(json.dumps({"base": base, "peak": peak(), "chars": n}))
"""


def child_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p),
    }


def memory(sizes: list[float], seed: int, tmp: Path) -> None:
    env = child_env()
    small = tmp / "small.warc.gz"
    write_warc(make_pages(3, seed), small, seed)
    print("\n## Memory: one page, peak RSS over the same process after a small page")
    print("| extractor | page | page MB | peak RSS MB | over base MB | per page byte |")
    print("|---|---|---:|---:|---:|---:|")
    for shape in ("article", "mixed"):
        for mb in sizes:
            page = big_page(mb, seed, shape)
            big = tmp / f"big-{shape}-{mb:g}.warc.gz"
            write_warc([(page[0], page[1], "text/html")], big, seed)
            size = len(page[1])
            for name in EXTRACTORS:
                cmd = [sys.executable, "-c", MEMORY_CHILD, name, str(small), str(big)]
                out = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if out.returncode != 0:
                    print(
                        f"| {name} | {shape} | {size / 1e6:.1f} | failed: {out.stderr.strip().splitlines()[-1:]} | | |"
                    )
                    continue
                m = json.loads(out.stdout.strip().splitlines()[-1])
                over = m["peak"] - m["base"]
                print(
                    f"| {name} | {shape} | {size / 1e6:.1f} | {m['peak'] / 1e6:.0f} | {over / 1e6:.0f} "
                    f"| {over / size:.1f} |"
                )


TAGS_CHILD = r"""
import json, sys, time
from gristmill.input.warc import iter_warc_documents, load_extractor
name, small, big, tags, alone = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
def peak():
    return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")) * 1024
for _ in iter_warc_documents(small, extractor=name):
    pass
base, t = peak(), time.process_time()
events = list(iter_warc_documents(big, extractor=name, max_html_tags=tags + 1000))
cpu, top = time.process_time() - t, peak()
chars = sum(len(getattr(e, "text", "")) for e in events)
why = [e.reason for e in events if hasattr(e, "reason")]
alone_cpu = None
if alone != "-":  # the extractor on the page itself, without the reader's depth check
    html = open(alone, encoding="utf-8").read()
    t = time.process_time()
    load_extractor(name)(html)
    alone_cpu = time.process_time() - t
print(json.dumps({"base": base, "peak": top, "chars": chars, "cpu": cpu, "why": why, "alone": alone_cpu}))
"""

#: markup that makes an element (and a text node) per start tag: side by side, or under 500
#: nested <div>s (about the deepest a page of many tags may be: MAX_DEPTH), or all nested (`too_deep`)
TAG_SHAPES = {
    "p": lambda n: "<p>word " * n,
    "td": lambda n: "<td>1" * n,
    "b": lambda n: "<b>w</b> " * n,
    "comment": lambda n: "<!---->" * n,
    "p under 500 divs": lambda n: "<div>" * 500 + "<p>word " * (n - 500),
    "nested div": lambda n: "<div>a" * n,
}
#: pages of at most this many tags are also given to the extractor alone (nested: quadratic time)
ALONE_TAGS = 20_000


def tag_pages(counts: list[int], seed: int, tmp: Path, timeout: float = 900) -> None:
    env = child_env()
    small = tmp / "small.warc.gz"
    write_warc(make_pages(3, seed), small, seed)
    print("\n## Pages of tags: one page, peak RSS over the same process after a small page")
    print(
        "| extractor | shape | start tags | page MB | over base MB | bytes per tag | per page byte | reader CPU s "
        "| kept chars or reason | extractor alone CPU s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for n in counts:
        for shape, make in TAG_SHAPES.items():
            html = f"<html><head><meta charset='utf-8'></head><body><main>{make(n)}</main></body></html>"
            body = html.encode()
            stem = f"tags-{shape.replace(' ', '-')}-{n}"
            big = tmp / f"{stem}.warc.gz"
            write_warc([("http://en.example.com/tags.html", body, "text/html")], big, seed)
            alone = "-"
            if n <= ALONE_TAGS:
                (tmp / f"{stem}.html").write_text(html, encoding="utf-8")
                alone = str(tmp / f"{stem}.html")
            for name in EXTRACTORS:
                cmd = [sys.executable, "-c", TAGS_CHILD, name, str(small), str(big), str(n), alone]
                row = f"| {name} | {shape} | {n:,} | {len(body) / 1e6:.2f} |"
                try:
                    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
                except subprocess.TimeoutExpired:
                    print(f"{row} over {timeout:.0f} s wall | | | | | |")
                    continue
                if out.returncode != 0:
                    print(f"{row} failed: {out.stderr.strip().splitlines()[-1:]} | | | | | |")
                    continue
                m = json.loads(out.stdout.strip().splitlines()[-1])
                over = m["peak"] - m["base"]
                kept = ", ".join(m["why"]) or f"{m['chars']:,}"
                alone_s = "" if m["alone"] is None else f"{m['alone']:.2f}"
                print(
                    f"{row} {over / 1e6:.1f} | {over / n:,.0f} | {over / len(body):.1f} | {m['cpu']:.2f} "
                    f"| {kept} | {alone_s} |"
                )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sample-passes", type=int, default=20, help="reads of the 16 sample pages per timed run")
    ap.add_argument("--write-warc", type=Path, help="also keep the generated pages as this WARC file")
    ap.add_argument("--memory", type=float, nargs="*", default=[], help="page sizes (MB) for the memory runs")
    ap.add_argument("--tag-pages", type=int, nargs="*", default=[], help="start tags per page for the markup runs")
    ap.add_argument("--smoke", action="store_true", help="60 pages, one pass and run each: checks that it runs")
    args = ap.parse_args()
    if args.smoke:
        args.pages, args.repeat, args.sample_passes, args.memory, args.tag_pages = 60, 1, 1, [], [200]
    if not SAMPLE.is_file() or not UDHR.is_file():
        print(f"need {SAMPLE} and {UDHR}", file=sys.stderr)
        return 2
    from loguru import logger

    logger.remove()  # the reader's warnings are not the measurement
    logging_off()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        pages = make_pages(args.pages, args.seed)
        gen = tmp / "generated.warc.gz"
        write_warc(pages, gen, args.seed)
        if args.write_warc:
            args.write_warc.write_bytes(gen.read_bytes())
        mb = sum(len(b) for _, b, _ in pages) / 1e6
        print(
            f"generated {len(pages):,} pages ({mb:.1f} MB of HTML, {gen.stat().st_size / 1e6:.1f} MB as WARC.gz) "
            f"in {time.perf_counter() - t0:.1f} s, seed {args.seed}"
        )
        sample = sample_pages()
        print(f"sample: {len(sample)} HTML responses, {sum(len(b) for _, b, _ in sample) / 1e6:.2f} MB of HTML")
        for title, pp, warc, passes in (
            ("Common Crawl sample (16 pages)", sample, SAMPLE, args.sample_passes),
            (f"generated pages ({len(pages):,})", pages, gen, 1),
        ):
            rows = [measure(name, pp, warc, args.repeat, passes) for name in EXTRACTORS]
            report(title, rows)
        if args.memory:
            memory(args.memory, args.seed, tmp)
        if args.tag_pages:
            tag_pages(args.tag_pages, args.seed, tmp)
    return 0


def logging_off() -> None:
    import logging

    logging.getLogger("trafilatura").setLevel(logging.CRITICAL)  # its per-page "discarding" notes


if __name__ == "__main__":
    sys.exit(main())
