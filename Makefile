# The same commands as the README; `make` is a convenience, not a requirement.
.PHONY: example test bench docs clean
example:
	python3 -m venv .venv && .venv/bin/pip install -q -c ci/constraints.txt -e . && .venv/bin/python examples/train.py
test:
	python3 -m venv .venv && .venv/bin/pip install -q -c ci/constraints.txt nox && .venv/bin/nox
bench:
	python3 -m venv .venv && .venv/bin/pip install -q -c ci/constraints.txt -e ".[test]" && .venv/bin/python benchmarks/run.py && .venv/bin/python benchmarks/summary_cost.py && .venv/bin/python benchmarks/filters.py
docs:  # docs/quickstart.md's sample output, from a real run of the example
	.venv/bin/python ci/docs_examples.py
clean:
	rm -rf .venv .nox lightning_logs .pytest_cache .hypothesis build *.egg-info
