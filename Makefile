# nexus-admit developer entry points. `make simulate` and `make test` are the two commands
# README.md promises a newcomer; everything else is for day-to-day work.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export GOTOOLCHAIN := local
# the package version (nexus_admit/__init__.py): the image tag and the packaged chart follow it
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' nexus_admit/__init__.py)

.PHONY: image chart install simulate plan-sample bench bench-e2e run demo test controlplane-background e2e-oldest lint unit fuzz e2e cluster-up cluster-down cluster-status controlplane clean

$(BIN)/nexus-admit: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

install: $(BIN)/nexus-admit

## The main job on its embedded default scenario (no cluster needed). The report
## (Markdown, PNG plots, JSON) goes to $(SIMULATE_REPORT); more options through
## SIMULATE_ARGS, e.g. make simulate SIMULATE_ARGS='--replay-seeds 1-3'.
SIMULATE_REPORT ?= reports/simulate
simulate: install
	$(BIN)/nexus-admit simulate --report $(SIMULATE_REPORT) $(SIMULATE_ARGS)

plan-sample: install
	$(BIN)/nexus-admit plan --snapshot config/samples/cluster-dump.yaml

bench: install
	$(BIN)/nexus-admit bench

## Load benchmark on the real control plane: Kueue alone, Kueue with an instant check (the
## floor of any check), then Kueue + nexus-admit, on 1,000 KWOK GPU nodes, then a soak
## (docs/benchmarks.md). Table printed, JSON in reports/bench-e2e/.
## Options through BENCH_E2E_ARGS, e.g. BENCH_E2E_ARGS='--nodes 100 --workloads 30
## --soak-minutes 2'. Set NEXUS_E2E_STATE to keep it apart from the tests' cluster.
bench-e2e: install controlplane
	$(BIN)/python e2e/bench_e2e/run.py $(BENCH_E2E_ARGS)

## Everything CI runs: lint, types, layer contract, unit + integration + e2e tests, then the
## tests that depend on who gates pods again on the oldest Kubernetes the README promises
## (versions.env KUBERNETES_OLDEST_VERSION: only Kubernetes itself is built again).
## On a cold machine the control plane (Go modules, ~30 min on 2 cores) builds in the
## background while the venv is made and the unit tests run; the older Kubernetes builds,
## niced, while the e2e tests run (they wait on the plane much of the time). build.sh locks
## each component, so a foreground build.sh waits for, or shares, the background one.
test: controlplane-background install lint
	$(BIN)/python -m pytest tests $(NEEDS_HELM:%=--ignore=%)
	bash e2e/build/build.sh >/dev/null
	nice -n 10 env NEXUS_E2E_KUBERNETES=oldest bash e2e/build/build.sh >/dev/null 2>.e2e-oldest-build.log &
	$(BIN)/python -m pytest --durations=15 $(NEEDS_HELM) e2e/tests
	$(MAKE) --no-print-directory e2e-oldest

# the unit tests that run the helm binary the control plane build makes
NEEDS_HELM := tests/charts tests/test_versions.py

controlplane-background:
	@echo "building the control plane in the background (progress: .e2e-build.log)"
	bash e2e/build/build.sh >/dev/null 2>.e2e-build.log &

## The tests that depend on who gates pods, on the oldest Kubernetes the README promises (no
## workload controller needed: they run Jobs, plain pods, Deployments and StatefulSets).
e2e-oldest: install
	NEXUS_E2E_KUBERNETES=oldest bash e2e/build/build.sh >/dev/null
	NEXUS_E2E_KUBERNETES=oldest NEXUS_E2E_CONTROLLERS=none \
	  $(BIN)/python -m pytest e2e/tests -m 'gate_webhook or oldest_kubernetes'

lint: install
	$(BIN)/ruff check nexus_admit tests e2e
	$(BIN)/mypy nexus_admit/model nexus_admit/placement nexus_admit/controller
	$(BIN)/lint-imports

unit: install
	$(BIN)/python -m pytest tests

## Malformed objects and webhook requests, 10,000 examples per fuzz test (CI runs 300).
fuzz: install
	NEXUS_FUZZ_EXAMPLES=10000 $(BIN)/python -m pytest tests/fuzz -q

e2e: install controlplane
	$(BIN)/python -m pytest e2e/tests

controlplane:
	bash e2e/build/build.sh >/dev/null

## The admission controller against the local control plane (brings it up; Ctrl-C stops
## the controller, `make cluster-down` the control plane).
run: install controlplane
	$(BIN)/python e2e/nexus_controller.py run

## Three sample workloads (gold training gang, silver inference group, bronze batch) placed
## on the local control plane; prints the decisions, stops the controller, leaves the
## cluster up (`make cluster-down` stops it).
demo: install controlplane
	$(BIN)/python e2e/demo.py

cluster-up: install controlplane
	$(BIN)/python e2e/cluster.py up

cluster-down: install
	$(BIN)/python e2e/cluster.py down

cluster-status: install
	$(BIN)/python e2e/cluster.py status

## The controller image from the Dockerfile, built with buildah and tagged
## nexus-admit:$(VERSION). IMAGE_BASE=local builds its base from Debian packages
## (debootstrap) where no registry can be pulled from; docs/admin-guide.md.
image:
	IMAGE_BASE="$(IMAGE_BASE)" PYTHON="$(PYTHON)" bash e2e/build/image.sh

## The helm chart packaged as $(CHART_DIST)/nexus-admit-$(VERSION).tgz (version and appVersion both
## $(VERSION)), with the helm binary the control plane build makes.
CHART_DIST ?= dist
chart: controlplane
	"$$(bash e2e/build/build.sh | tail -n1)/helm" package charts/nexus-admit \
	  --version "$(VERSION)" --app-version "$(VERSION)" --destination "$(CHART_DIST)"

clean:
	-[ -x $(BIN)/python ] && $(BIN)/python e2e/cluster.py down
	-[ -x $(BIN)/python ] && NEXUS_E2E_KUBERNETES=oldest $(BIN)/python e2e/cluster.py down
	rm -rf $(VENV) .e2e-state .e2e-state-oldest .e2e-build.log .e2e-oldest-build.log .pytest_cache .mypy_cache .ruff_cache dist
