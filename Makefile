# Walras: every target sets up what it needs on first use (.venv, torch CPU wheel, the project, kubectl/helm,
# Debian packages) and reuses it after.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TOOLS := .tools/bin
export PATH := $(CURDIR)/$(TOOLS):$(CURDIR)/$(BIN):$(PATH)
# Kubernetes control-plane binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) from the tarball
# in ../shared/k8s when it is there (CI copies shared/ beside the clone). They are unpacked into .tools/k8s/bin and
# KUBEBUILDER_ASSETS (envtest's variable) points the tests and `walras demo` at them. Without the tarball and without
# KUBEBUILDER_ASSETS, the tests that need a real control plane are skipped (and fail under CI=true).
K8S_TARBALL := $(firstword $(wildcard ../shared/k8s/*.tar.xz))
K8S_DIR := .tools/k8s
K8S_STAMP := $(K8S_DIR)/.unpacked
ifneq ($(K8S_TARBALL),)
export KUBEBUILDER_ASSETS ?= $(CURDIR)/$(K8S_DIR)/bin
endif

.PHONY: install tools system controlplane demo test lint unit e2e bench clean wheel chart

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch (the project's `torch` extra: walras solve --device cuda / --distributed; the tests of those routes) first
	# and explicitly: pip then takes the CPU wheel; a bare requirement would pull a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,torch]'
	# Every numba kernel compiled ahead of time: price discovery, degree (SEQ), colocation and fairness
	# (allocator.pricing._compiled.aot, allocator.degree.aot, allocator.colocation.aot, allocator.fairness.aot; need
	# gcc); without them the kernels are JIT-compiled on first use, with a notice (the route tables of
	# allocator.pricing._compiled.kernels, allocator.degree.kernels, allocator.colocation.kernels and
	# allocator.fairness.kernels).
	$(BIN)/python -m allocator.pricing._compiled.aot || echo "ahead-of-time kernels not built: the JIT route is used"
	$(BIN)/python -m allocator.degree.aot || echo "ahead-of-time degree kernels not built: the JIT route is used"
	$(BIN)/python -m allocator.colocation.aot || echo "ahead-of-time colocation kernels not built: the JIT route is used"
	$(BIN)/python -m allocator.fairness.aot || echo "ahead-of-time fairness kernels not built: the JIT route is used"
	touch $(STAMP)

install: $(STAMP)

# The wheel with the four ahead-of-time kernel modules inside (tagged for this interpreter and platform by setup.py),
# so that a fresh `pip install dist/walras-*.whl` neither imports numba for them nor compiles on first use.
wheel: install
	$(BIN)/python -m allocator.pricing._compiled.aot
	$(BIN)/python -m allocator.degree.aot
	$(BIN)/python -m allocator.colocation.aot
	$(BIN)/python -m allocator.fairness.aot
	rm -rf build && $(BIN)/pip wheel -q --no-deps --no-build-isolation -w dist . && rm -rf build

# The chart carries copies, not symbolic links, of the CRDs and of the dashboard and alert rules (a copied or
# packaged chart has no ../../..): scripts/sync_chart.py copies them and writes the chart's README from values.yaml;
# tests/test_chart_files.py fails when a copy or the README is out of date.
chart:
	$(BIN)/python scripts/sync_chart.py

$(TOOLS)/kubectl $(TOOLS)/helm:
	scripts/install_k8s_tools.sh

tools: $(TOOLS)/kubectl $(TOOLS)/helm

ifneq ($(K8S_TARBALL),)
$(K8S_STAMP): $(K8S_TARBALL)
	rm -rf $(K8S_DIR) && mkdir -p $(K8S_DIR)
	tar -xJf $(K8S_TARBALL) -C $(K8S_DIR) --strip-components=1
	touch $(K8S_STAMP)

controlplane: $(K8S_STAMP)
else
controlplane:
	@echo "no ../shared/k8s/*.tar.xz: tests that need a real control plane use KUBEBUILDER_ASSETS or are skipped"
endif

system:
	scripts/install_system_packages.sh

demo: install controlplane
	$(BIN)/walras demo

lint: install
	$(BIN)/ruff check allocator operator tests e2e bench
	$(BIN)/lint-imports
	$(BIN)/mypy allocator operator/walras operator/walras_testbed

unit: install controlplane
	$(BIN)/pytest -q -m "not e2e" tests

e2e: install tools system controlplane
	$(BIN)/pytest -q e2e

# tests/: -n auto --dist loadgroup spreads them over one worker per core; every test on the real control plane runs
# in one worker (conftest.py groups them), so that run starts one control plane. e2e/ runs beside it, at the same
# time, in a pytest process of its own (its own control plane: the session control plane is per process; its own
# --basetemp), its output shown when tests/ is done: its scenarios mostly wait (on the API server, the kubelet
# stand-in, the operator's plan period; e2e/test_e2e_quiet.py sleeps two minutes), so beside the CPU-bound tests/ it
# costs little and no longer adds its ~7 minutes after them. e2e/ never runs under xdist: its scenarios failed there
# (a FungibleJob of test_e2e_direct vanished mid-module, twice in two runs, when it shared tests/'s control plane and
# namespace) and pass in one process. --durations lists the slowest tests.
test: install tools system controlplane
	$(MAKE) lint
	@tmp=$$(mktemp -d); \
	{ $(BIN)/pytest -q -p no:cacheprovider --basetemp=$$tmp/base --durations=10 e2e >$$tmp/e2e.log 2>&1; \
	  echo $$? >$$tmp/e2e.rc; } & \
	e2e=$$!; \
	$(BIN)/pytest -q -p no:cacheprovider -n auto --dist loadgroup --durations=30 tests; unit=$$?; \
	wait $$e2e; echo "---- e2e/ (ran beside tests/) ----"; cat $$tmp/e2e.log; e2e_rc=$$(cat $$tmp/e2e.rc); \
	rm -rf $$tmp; test $$unit -eq 0 && test $$e2e_rc -eq 0

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache
